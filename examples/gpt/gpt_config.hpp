// The GPT-2 model's shape, its parameters grouped into engine units, and their initialisation.
//
// Parameters carry Hugging Face GPT-2 names and shapes ("h.3.attn.c_attn.weight" is [C, 3C],
// stored as HF's Conv1D stores it: y = x W + b with W laid out [in, out]), so a checkpoint maps
// onto the reference model name for name. Units are the granule the engine gathers and reduces:
// "embeddings" (wte, wpe), one per block "h.{i}", and "ln_f". The LM head is tied to wte, so
// the embeddings unit is used at both ends of the forward pass.
//
// Initialisation is a pure function of (seed, parameter name): every rank, at every world size,
// computes the same full tensor, which is what the engine's init_params contract asks for.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zero/layout.hpp"
#include "zero/plan/plan.hpp"

namespace zero::gpt {

struct GptConfig {
  int n_layer = 4;
  int n_head = 4;
  int n_embd = 128;
  int seq_len = 64;      // maximum sequence length T (size of wpe)
  int vocab_size = 256;  // real vocabulary V (256 for bytes, 50257 for GPT-2 BPE)
  bool activation_checkpointing = false;

  // V rounded up to a multiple of 128: the embedding matrix and logits use this width so the
  // matrix products stay aligned; logits of padded ids are masked out of the loss.
  int padded_vocab_size() const { return (vocab_size + 127) / 128 * 128; }
  int head_size() const { return n_embd / n_head; }

  // Throws zero::Error naming the offending field when the shape is not usable.
  void validate() const;
  // Every parameter element, padded vocabulary rows included (the engine's Ψ).
  std::int64_t num_params() const;
  // The same shape as the library's planner describes it (zero/plan/plan.hpp).
  zero::plan::GptShape plan_shape() const;
  // "n_layer=4 n_head=4 n_embd=128 seq_len=64 vocab=256 (padded 256) params=0.83M".
  std::string describe() const;
};

// Named shapes: "tiny" (the CPU demo), "gpt2" (124M), "gpt2-medium" (350M), "gpt2-large"
// (774M), "gpt2-xl" (1558M). An unknown name is a zero::Error listing them all.
GptConfig gpt_preset(std::string_view name);
const std::vector<std::string>& gpt_preset_names();

struct TensorSpec {
  std::string name;
  std::vector<std::int64_t> shape;
  std::int64_t numel() const;
};
struct UnitSpec {
  std::string name;
  std::vector<TensorSpec> tensors;
};

// Unit ids as build_layout() numbers them.
inline int embeddings_unit() { return 0; }
inline int block_unit(int layer) { return 1 + layer; }
inline int ln_f_unit(const GptConfig& cfg) { return cfg.n_layer + 1; }

// Tensor order inside a block unit (the order the model's pointer arrays use).
enum BlockTensor : int {
  kLn1W,
  kLn1B,
  kAttnW,
  kAttnB,
  kAttnProjW,
  kAttnProjB,
  kLn2W,
  kLn2B,
  kFcW,
  kFcB,
  kFcProjW,
  kFcProjB,
  kBlockTensors
};
enum EmbeddingTensor : int { kWte, kWpe, kEmbeddingTensors };
enum LnfTensor : int { kLnfW, kLnfB, kLnfTensors };

// The units in forward order: embeddings, h.0 .. h.{L-1}, ln_f.
std::vector<UnitSpec> gpt_units(const GptConfig& cfg);
zero::Layout build_layout(const GptConfig& cfg);

// Fills `values` (the full tensor `name`) with its GPT-2 initial value: weights N(0, 0.02),
// the two residual projections of each block N(0, 0.02 / sqrt(2 n_layer)), LayerNorm weights 1,
// biases 0, padded vocabulary rows of wte 0. Deterministic in (seed, name) only.
void init_parameter(const GptConfig& cfg, std::string_view name, std::span<float> values, std::uint64_t seed);

}  // namespace zero::gpt
