#include "gpt/replicated_attention.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "zero/error.hpp"

namespace zero::gpt {

namespace {

float* host(Act* p) { return reinterpret_cast<float*>(p); }
const float* host(const Act* p) { return reinterpret_cast<const float*>(p); }

}  // namespace

ReplicatedAttention::ReplicatedAttention(const GptConfig& cfg, const TensorParallel& tp, Ops& ops)
    : tp_(tp), ops_(&ops) {
  ZERO_CHECK(ops.host_memory() && ops.dtype() == zero::DType::f32 && !cfg.biases(),
             fmt::format("model.tensor_parallel = {} replicates the {} key/value heads, which the {} ops do not do "
                         "(fp32 host memory, a model without attention biases only): choose tensor_parallel among "
                         "the divisors of n_kv_head, or the host backend",
                         tp.size, cfg.kv_heads(), ops.name()));
  const int KV = cfg.kv_heads(), NH = cfg.n_head, hs = cfg.head_size();
  const int G = NH / KV, R = tp.size / KV, g = tp.rank / R, j = tp.rank % R, per = G / R;
  C_ = cfg.n_embd;
  width_ = cfg.qkv_width();
  local_width_ = cfg.qkv_part_width(tp.size);
  local_rows_ = std::int64_t{NH / tp.size} * hs;
  // Stored query head r KV + g is Hugging Face's head g G + r (plan::GptShape::qkv_width).
  for (int k = 0; k < per; ++k) {
    const std::int64_t stored = std::int64_t{j * per + k} * KV + g;
    cols_.push_back({stored * hs, std::int64_t{k} * hs, hs});
    rows_.push_back({stored * hs, std::int64_t{k} * hs, hs});
  }
  cols_.push_back({std::int64_t{NH + g} * hs, local_rows_, hs});            // its key head
  cols_.push_back({std::int64_t{NH + KV + g} * hs, local_rows_ + hs, hs});  // its value head
  w_qkv_.resize(static_cast<std::size_t>(C_ * local_width_));
  g_qkv_.resize(w_qkv_.size());
  w_proj_.resize(static_cast<std::size_t>(local_rows_ * C_));
  g_proj_.resize(w_proj_.size());
}

const Act* ReplicatedAttention::qkv_weight(const Act* whole) {
  const float* w = host(whole);
  for (std::int64_t i = 0; i < C_; ++i)
    for (const Run& r : cols_)
      std::copy_n(w + i * width_ + r.whole, r.count, w_qkv_.data() + i * local_width_ + r.local);
  return reinterpret_cast<const Act*>(w_qkv_.data());
}

const Act* ReplicatedAttention::proj_weight(const Act* whole) {
  const float* w = host(whole);
  for (const Run& r : rows_) std::copy_n(w + r.whole * C_, r.count * C_, w_proj_.data() + r.local * C_);
  return reinterpret_cast<const Act*>(w_proj_.data());
}

Act* ReplicatedAttention::qkv_grad() {
  std::fill(g_qkv_.begin(), g_qkv_.end(), 0.0f);
  return reinterpret_cast<Act*>(g_qkv_.data());
}

Act* ReplicatedAttention::proj_grad() {
  std::fill(g_proj_.begin(), g_proj_.end(), 0.0f);
  return reinterpret_cast<Act*>(g_proj_.data());
}

void ReplicatedAttention::add_grads(Act* whole_qkv, Act* whole_proj) {
  // Both matrices in one all-reduce: [C, width] then [C, C] (the projection's rows whole).
  const std::size_t nq = static_cast<std::size_t>(C_ * width_), np = static_cast<std::size_t>(C_ * C_);
  sum_.assign(nq + np, 0.0f);
  for (std::int64_t i = 0; i < C_; ++i)
    for (const Run& r : cols_)
      std::copy_n(g_qkv_.data() + i * local_width_ + r.local, r.count, sum_.data() + i * width_ + r.whole);
  for (const Run& r : rows_) std::copy_n(g_proj_.data() + r.local * C_, r.count * C_, sum_.data() + nq + r.whole * C_);
  tp_.all_reduce(*ops_, reinterpret_cast<Act*>(sum_.data()), sum_.size());
  float* q = host(whole_qkv);
  float* p = host(whole_proj);
  for (std::size_t k = 0; k < nq; ++k) q[k] += sum_[k];
  for (std::size_t k = 0; k < np; ++k) p[k] += sum_[nq + k];
}

}  // namespace zero::gpt
