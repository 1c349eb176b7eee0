// The attention of a tensor rank whose key/value head is replicated (tensor_parallel a multiple of
// n_kv_head, plan::GptShape::kv_replicated): the two projections are whole on every rank, and the
// rank computes with the columns and rows of its own heads and sums their gradients over the group.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "gpt/gpt_config.hpp"
#include "gpt/ops.hpp"
#include "gpt/tensor_parallel.hpp"

namespace zero::gpt {

class ReplicatedAttention {
 public:
  // Rank t of T holds query heads [j G/R, (j+1) G/R) of group g = t / R (j = t mod R, R = T /
  // n_kv_head, G = n_head / n_kv_head) and that group's key and value head: in the local order the
  // attention kernels read, one key/value head and n_head / T query heads. Host memory, fp32.
  ReplicatedAttention(const GptConfig& cfg, const TensorParallel& tp, Ops& ops);

  // The rank's [C, qkv_part_width] and [C / T, C] weights, copied from the whole ones.
  const Act* qkv_weight(const Act* whole);
  const Act* proj_weight(const Act* whole);
  // Zeroed gradients of those, for one backward to add into.
  Act* qkv_grad();
  Act* proj_grad();
  // Adds the group's sum of every rank's qkv_grad() and proj_grad(), placed in the whole
  // matrices, to the whole gradients: every rank then holds the same (replicated) gradient.
  // Collective over the tensor group.
  void add_grads(Act* whole_qkv, Act* whole_proj);

 private:
  struct Run {
    std::int64_t whole, local, count;  // columns (qkv) or rows (proj)
  };
  TensorParallel tp_;  // a copy: the model that owns this may move
  Ops* ops_;
  std::int64_t C_ = 0, width_ = 0, local_width_ = 0, local_rows_ = 0;
  std::vector<Run> cols_, rows_;
  std::vector<float> w_qkv_, w_proj_, g_qkv_, g_proj_, sum_;
};

}  // namespace zero::gpt
