// Hugging Face GPT-2 interchange: export a checkpoint of a GPT-2-shaped layout as a directory
// that transformers' GPT2LMHeadModel.from_pretrained() loads, and read such weights back to
// initialise a training run (fine-tuning GPT-2 weights people already have).
//
// The layout names and shapes (zero::plan::gpt_layout) already are Hugging Face's: tensors
// named "wte.weight", "h.0.attn.c_attn.weight", ..., with Conv1D weights stored [in, out] as
// the trainer's matrix products read them. Two things differ and are converted here: the
// embedding matrix holds vocab_size rounded up to a multiple of 128 rows (the padding rows are
// dropped on export and added back, as zeros, on import), and n_head and the true vocabulary
// are not shapes, so they come from the checkpoint's saved `model` section (or the caller).
// The LM head is tied to wte, so no lm_head tensor is written; on import "transformer."
// prefixes (save_pretrained of GPT2LMHeadModel), a tied lm_head.weight and the attention-mask
// buffers older files carry are accepted and skipped.
//
// A model's shape is zero::plan::GptShape, as everywhere else; config.json spells its fields
// the Hugging Face way (seq_len is n_positions there, and n_ctx in older files).
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
};

// Writes out_dir/model.safetensors and out_dir/config.json (out_dir is created). Throws
// zero::Error when the checkpoint's layout is not GPT-2's (names and shapes are compared with
// zero::plan::gpt_layout) or n_head / vocab_size are unknown. Returns the exported shape
// (vocab_size the true vocabulary, without padding rows; no name).
plan::GptShape export_gpt2(const std::string& checkpoint, const std::string& out_dir, const ExportOptions& opts = {});

// The config.json text export_gpt2 writes for `c` (GPT2Config fields).
std::string config_json(const plan::GptShape& c, DType dtype);

// GPT-2 weights to initialise from: a directory holding model.safetensors (and config.json,
// checked when present), a .safetensors file (Hugging Face's or zero-ckpt's raw export), or an
// llm.c checkpoint (zero/formats/llmc_gpt2.hpp: told by its magic number; its header is checked like
// config.json, its matrices transposed to the trainer's [in, out] as they are read).
class Gpt2Weights {
 public:
  explicit Gpt2Weights(const std::string& path);
  ~Gpt2Weights();
  Gpt2Weights(Gpt2Weights&&) noexcept;
  Gpt2Weights& operator=(Gpt2Weights&&) noexcept;

  const std::string& path() const { return path_; }
  // Checks config.json (when present) or the llm.c header, and every tensor's name and shape
  // against the model to be trained; throws zero::Error listing every difference, with what to
  // change.
  void check(const plan::GptShape& model) const;
  // Fills `out` (the full parameter `name` of the layout, `shape`) as fp32; wte rows past the
  // file's vocabulary are zero.
  void read(const std::string& name, const std::vector<std::int64_t>& shape, std::span<float> out) const;

 private:
  struct File;
  void open_llmc();
  std::string path_;
  std::optional<plan::GptShape> config_;  // config.json's, when the directory has one; llm.c's header
  bool llmc_ = false;                     // an llm.c checkpoint
  std::unique_ptr<File> file_;
};

}  // namespace zero::hf
