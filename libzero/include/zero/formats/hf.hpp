// Hugging Face GPT-2 interchange: export a GPT-2-shaped checkpoint as a directory that
// transformers' GPT2LMHeadModel.from_pretrained() loads, and read such weights back to start a run.
// What is converted and accepted: docs/architecture.md, note hf-gpt2.
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
