// Hugging Face interchange for the GPT trainer's architectures (GPT2LMHeadModel,
// BloomForCausalLM, LlamaForCausalLM): export a checkpoint as a directory that transformers'
// from_pretrained() loads, and read such a directory back to start a run. What is converted
// and accepted: docs/architecture.md, note hf-interchange.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "zero/dtype.hpp"
#include "zero/plan/plan.hpp"

namespace zero::hf {

struct ExportOptions {
  DType dtype = DType::f32;
  std::string tag = "latest";
  // 0: taken from the checkpoint's saved config (section `model`, keys n_head and vocab_size,
  // as zero-gpt writes them).
  int n_head = 0;
  int vocab_size = 0;
  // Above this many bytes of tensors the weights are split as save_pretrained splits them:
  // model-0000i-of-0000n.safetensors and model.safetensors.index.json (5 GB, its default).
  std::uint64_t max_shard_bytes = 5'000'000'000;
};

// Writes out_dir/config.json and the weights (model.safetensors, or shards and their index);
// out_dir is created. The architecture is told by the checkpoint's tensors (wpe: gpt2, ln_e:
// bloom, LayerNorms without biases: llama), n_head and the vocabulary by `opts` or the saved
// `model` section, llama's norm_eps and rope_theta by that section. Throws zero::Error when a
// tensor is missing, extra or misshapen for that architecture (compared with
// zero::plan::gpt_layout), or a key is unknown. Returns the exported shape (vocab_size the true
// vocabulary, without padding rows; no name).
plan::GptShape export_hf(const std::string& checkpoint, const std::string& out_dir, const ExportOptions& opts = {});

// The config.json text export_hf writes for `c`: GPT2Config, BloomConfig or LlamaConfig fields.
std::string config_json(const plan::GptShape& c, DType dtype);

// Pretrained weights to initialise from:
//  - a Hugging Face directory: config.json (its model_type, or architectures, says gpt2, bloom
//    or llama) and model.safetensors, or shards listed by model.safetensors.index.json;
//  - a .safetensors file in the trainer's names (GPT-2's Hugging Face files, zero-ckpt's raw
//    export of any architecture), or such a directory without config.json;
//  - an llm.c checkpoint (zero/formats/llmc_gpt2.hpp: told by its magic number; its header is
//    checked like config.json, its matrices transposed to the trainer's [in, out] as read).
// Each Hugging Face tensor is converted to the trainer's layout as it is read: [out, in]
// matrices transposed, llama's q/k/v and gate/up fused with the stored query-head order,
// BLOOM's per-head query_key_value de-interleaved. Only the tensors a parameter needs are read.
class PretrainedWeights {
 public:
  explicit PretrainedWeights(const std::string& path);
  ~PretrainedWeights();
  PretrainedWeights(PretrainedWeights&&) noexcept;
  PretrainedWeights& operator=(PretrainedWeights&&) noexcept;

  const std::string& path() const { return path_; }
  // Checks config.json (when present) or the llm.c header against the model to be trained, and
  // every tensor's name and shape; throws zero::Error listing every difference with the model
  // key to set.
  void check(const plan::GptShape& model) const;
  // Fills `out` (the full parameter `name` of the layout, `shape`) as fp32; rows of wte and
  // lm_head past the file's vocabulary are zero.
  void read(const std::string& name, const std::vector<std::int64_t>& shape, std::span<float> out) const;
  // How a tensor rank's part of a parameter is cut from the whole (the layout's split_axis and
  // split_blocks: each of `blocks` blocks along `axis` cut into `parts`, this rank taking run
  // `part` of each). axis < 0 or parts 1: the whole.
  struct PartCut {
    int axis = -1, blocks = 1, parts = 1, part = 0;
  };
  // The same for one part (out holds the part's elements, in the part's row-major order), reading
  // from the files only the stretches of each tensor that hold it: a column-parallel part is
  // rows of Hugging Face's [out, in] matrices, a row-parallel part a column range of each row.
  void read_part(const std::string& name, const std::vector<std::int64_t>& shape, const PartCut& cut,
                 std::span<float> out) const;
  // Tensor bytes read from the files so far (what init_from cost this rank).
  std::uint64_t bytes_read() const;

  struct Source;  // the files, their tensors and how they map onto the trainer's parameters

 private:
  std::string path_;
  std::unique_ptr<Source> src_;
};

}  // namespace zero::hf
