// Megatron-style tensor parallelism for the GPT model (model.tensor_parallel: T).
//
// The T ranks of a tensor group (zero/groups.hpp) each hold one part of every block, cut so that
// each pair of products needs one all-reduce (Shoeybi et al., Megatron-LM):
//   - column-parallel: attn.c_attn (rank t holds the q, k and v columns of heads
//     [t NH/T, (t+1) NH/T), weight [C, 3C/T], bias [3C/T]; with grouped-query attention (llama)
//     whole query groups with their key/value heads, plan::GptShape::qkv_width says how) and
//     mlp.c_fc ([C, F/T]; SwiGLU's gate and up columns alike, [C, 2F/T]). They read the
//     replicated activation and write a local one, so attention and the activation run on each
//     rank's heads and columns alone; in the backward each rank's input gradient is a partial
//     sum, all-reduced once.
//   - row-parallel: attn.c_proj ([C/T, C], the rows of the rank's query heads) and mlp.c_proj
//     ([F/T, C]) multiply the local columns into partial sums, all-reduced once in the forward;
//     their bias is replicated and enters once (on tensor rank 0, before the sum).
//   - vocabulary-parallel: wte (and an untied lm_head) is cut along the padded vocabulary
//     ([Vp/T, C], ids [t Vp/T, (t+1) Vp/T)): the embedding looks up its own rows (zeros
//     elsewhere) and sums over the group; the LM head gives each rank the logits of its ids only,
//     and the cross-entropy all-reduces the softmax's max and sum and the target's logit per row
//     (Ops::cross_entropy_part_*), so no rank holds a whole row of logits. The head's input
//     gradient is all-reduced like a column-parallel product's.
//   - replicated: the norms, wpe and the row-parallel biases (Layout::set_replicated, so the
//     engine counts them once in the global gradient norm). bloom's ALiBi slopes follow each
//     rank's heads (AttentionShape::head0).
// Parameters keep their names; their shapes are the rank's part, and the layout records how
// each was cut (ParamInfo::split_axis / split_blocks) for checkpoint tools. Initial values are
// the whole tensor's (init_parameter) cut the same way, so every T starts from the same model.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "gpt/gpt_config.hpp"
#include "gpt/ops.hpp"
#include "zero/comm.hpp"
#include "zero/layout.hpp"

namespace zero::gpt {

// A rank's place in its tensor group and the group's communicator (null when size is 1).
struct TensorParallel {
  int size = 1;
  int rank = 0;
  zero::Communicator* comm = nullptr;
  // backend: cuda: a communicator of the same group for the Ops' device memory
  // (Engine::device_comm), whose collectives are ordered on the engine's stream, the model's.
  // Null on the host, and then device memory goes through host memory.
  zero::Communicator* device = nullptr;

  bool active() const { return size > 1; }
  // Sums n elements of the Ops' dtype in place over the group (nothing when inactive), in fp32
  // and rounded once: on `device` through an fp32 scratch in the Ops' memory (reserve()), else
  // through host memory.
  void all_reduce(Ops& ops, Act* data, std::size_t n) const;
  // The same for fp32 statistics in the Ops' memory (the cross-entropy's max and sums).
  void all_reduce(Ops& ops, float* data, std::size_t n, zero::ReduceOp op) const;
  // With `device`: the fp32 scratch for all-reduces of up to n elements, allocated now (the
  // model is being built), not in a forward. Copies of this object share it.
  void reserve(Ops& ops, std::size_t n);

  // The scratch (shared by copies; set by reserve()).
  struct Scratch {
    Ops* ops = nullptr;
    float* data = nullptr;
    std::size_t n = 0;
    ~Scratch() {
      if (data) ops->deallocate(data);
    }
  };
  std::shared_ptr<Scratch> scratch{};
  // This rank's ids of the padded vocabulary: [vocab_begin, vocab_begin + vocab_rows).
  int vocab_rows(const GptConfig& cfg) const { return cfg.padded_vocab_size() / size; }
  int vocab_begin(const GptConfig& cfg) const { return rank * vocab_rows(cfg); }
};

// Throws zero::Error when the model cannot be cut T ways: n_head, the MLP's hidden width and the
// padded vocabulary must divide by T, and n_kv_head divide by T or T by it.
void check_tensor_parallel(const GptConfig& cfg, int T);

// This rank's layout at tensor parallelism T: the units and names of build_layout(cfg), local
// shapes, each parameter marked split or replicated as plan::gpt_tensor_cut cuts it (T > 1).
zero::Layout tensor_parallel_layout(const GptConfig& cfg, int T);

// The whole tensor's shape of a part described by the layout (shape[split_axis] x T).
std::vector<std::int64_t> whole_shape(const zero::ParamInfo& part, int T);
// Copies tensor rank t's part of the whole tensor (row-major, whole_shape(part, T)) to `out`
// (part.numel elements). A replicated parameter is copied whole.
void take_part(std::span<const float> whole, const zero::ParamInfo& part, int T, int t, std::span<float> out);

}  // namespace zero::gpt
