// The model's shape and architecture (gpt2, bloom, llama), its parameters grouped into engine
// units, and their initialisation.
//
// Parameters carry Hugging Face GPT-2 names and shapes for every architecture
// ("h.3.attn.c_attn.weight" is [C, qkv width], stored as HF's Conv1D stores it: y = x W + b with
// W laid out [in, out]), so a GPT-2 checkpoint maps onto the reference model name for name and
// the other architectures' Hugging Face names map onto the same roles (zero/formats/hf.hpp).
// Units are the granule the engine gathers and reduces: "embeddings" (wte; wpe for gpt2; ln_e,
// bloom's LayerNorm on the word embeddings), one per block "h.{i}", and "ln_f" (with lm_head.weight
// when the head is not tied). A tied head is wte, so the embeddings unit is then used at both
// ends of the forward pass.
//
// Initialisation is a pure function of (seed, parameter name): every rank, at every world size,
// computes the same full tensor, which is what the engine's init_params contract asks for.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zero/layout.hpp"
#include "zero/plan/plan.hpp"

namespace zero::gpt {

// The shape and architecture are the library planner's description (zero/plan/plan.hpp), so the
// trainer and zero-plan cannot disagree about what a model holds; the defaults are the "tiny"
// preset's.
struct GptConfig : zero::plan::GptShape {
  GptConfig() {
    n_layer = 4;
    n_head = 4;
    n_embd = 128;
    seq_len = 64;
    vocab_size = 256;
  }
  explicit GptConfig(const zero::plan::GptShape& shape) : zero::plan::GptShape(shape) {}
  bool activation_checkpointing = false;

  // V rounded up to a multiple of 128: the embedding matrix and logits use this width so the
  // matrix products stay aligned; logits of padded ids are masked out of the loss.
  int padded_vocab_size() const { return static_cast<int>(padded_vocab()); }

  // Throws zero::Error naming the offending field when the shape is not usable.
  void validate() const;
  const zero::plan::GptShape& plan_shape() const { return *this; }
  // "llama n_layer=4 n_head=4 (kv 2) n_embd=128 ffn=352 seq_len=64 vocab=256 (padded 256) params=0.80M".
  std::string describe() const;
};

// Named shapes: "tiny", "llama-tiny" and "bloom-tiny" (the CPU demos, about 0.8M parameters
// each), then the planner's presets (gpt2 .. gpt2-xl, bloom-560m, bloom-7b1, llama2-7b,
// llama3.2-1b, llama3.2-3b, llama3-8b, ...). An unknown name is a zero::Error listing them all.
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

// The tensors of each unit by role. A unit's pointer arrays list its tensors in gpt_units()
// order, which depends on the architecture (a llama block has no biases); TensorSlots says where
// each role sits (-1: this architecture has none).
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
enum EmbeddingTensor : int { kWte, kWpe, kLneW, kLneB, kEmbeddingTensors };
enum LnfTensor : int { kLnfW, kLnfB, kLmHead, kLnfTensors };
struct TensorSlots {
  std::array<int, kBlockTensors> block{};
  std::array<int, kEmbeddingTensors> embeddings{};
  std::array<int, kLnfTensors> ln_f{};
};
// From the names of build_layout(cfg)'s units (wte is always the embeddings' first tensor).
TensorSlots tensor_slots(const GptConfig& cfg);

// The units in forward order: embeddings, h.0 .. h.{L-1}, ln_f.
std::vector<UnitSpec> gpt_units(const GptConfig& cfg);
zero::Layout build_layout(const GptConfig& cfg);

// Fills `values` (the full tensor `name`) with its GPT-2 initial value, the same rule for every
// architecture: weights N(0, 0.02), the two residual projections of each block
// N(0, 0.02 / sqrt(2 n_layer)), norm weights 1, biases 0, padded vocabulary rows of wte and
// lm_head 0. Deterministic in (seed, name) only.
void init_parameter(const GptConfig& cfg, std::string_view name, std::span<float> values, std::uint64_t seed);

}  // namespace zero::gpt
