#include "gpt/tensor_parallel.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "zero/dtype.hpp"
#include "zero/error.hpp"
#include "zero/plan/plan.hpp"

namespace zero::gpt {

void TensorParallel::reserve(Ops& ops, std::size_t n) {
  if (!active() || device == nullptr || (scratch && scratch->n >= n)) return;
  auto s = std::make_shared<Scratch>();
  s->ops = &ops;
  s->data = static_cast<float*>(ops.allocate(n * sizeof(float)));
  s->n = n;
  scratch = std::move(s);
}

void TensorParallel::all_reduce(Ops& ops, Act* data, std::size_t n) const {
  if (!active() || n == 0) return;
  if (device != nullptr) {
    // On the device, ordered after the kernels that wrote `data` and before the ones that read
    // the sum (Work::wait orders the stream, the host does not wait).
    ZERO_CHECK(scratch && scratch->n >= n,
               fmt::format("TensorParallel: an all-reduce of {} elements, but the scratch holds {}; reserve() it "
                           "while the model is built",
                           n, scratch ? scratch->n : 0));
    ops.to_f32(scratch->data, data, n);
    device->all_reduce_async(scratch->data, n, zero::DType::f32, zero::ReduceOp::sum).wait();
    ops.from_f32(data, scratch->data, n);
    return;
  }
  if (ops.host_memory() && ops.dtype() == zero::DType::f32) {
    comm->all_reduce(data, n, zero::DType::f32, zero::ReduceOp::sum);
    return;
  }
  std::vector<std::byte> raw(n * ops.elem_bytes());
  std::vector<float> f(n);
  ops.download(raw.data(), data, raw.size());
  zero::convert(raw.data(), ops.dtype(), f.data(), zero::DType::f32, n);
  comm->all_reduce(f.data(), n, zero::DType::f32, zero::ReduceOp::sum);
  zero::convert(f.data(), zero::DType::f32, raw.data(), ops.dtype(), n);
  ops.upload(data, raw.data(), raw.size());
}

void TensorParallel::all_reduce(Ops& ops, float* data, std::size_t n, zero::ReduceOp op) const {
  if (!active() || n == 0) return;
  if (device != nullptr) {
    device->all_reduce_async(data, n, zero::DType::f32, op).wait();
    return;
  }
  if (ops.host_memory()) {
    comm->all_reduce(data, n, zero::DType::f32, op);
    return;
  }
  std::vector<float> f(n);
  ops.download(f.data(), data, n * sizeof(float));
  comm->all_reduce(f.data(), n, zero::DType::f32, op);
  ops.upload(data, f.data(), n * sizeof(float));
}

void check_tensor_parallel(const GptConfig& cfg, int T) {
  ZERO_CHECK(T >= 1, fmt::format("model.tensor_parallel must be >= 1 (got {})", T));
  ZERO_CHECK(cfg.n_head % T == 0,
             fmt::format("model.tensor_parallel = {} does not divide n_head = {}: each tensor-parallel rank computes "
                         "n_head / tensor_parallel whole attention heads; choose tensor_parallel among the divisors "
                         "of n_head",
                         T, cfg.n_head));
  ZERO_CHECK(cfg.kv_heads() % T == 0 || T % cfg.kv_heads() == 0,
             fmt::format("model.tensor_parallel = {} and n_kv_head = {} divide neither way: each tensor-parallel rank "
                         "takes whole query groups with their key/value heads, or (tensor_parallel a multiple of "
                         "n_kv_head) part of one group with its key/value head replicated; choose tensor_parallel "
                         "among the divisors or the multiples of n_kv_head",
                         T, cfg.kv_heads()));
  ZERO_CHECK(cfg.mlp_hidden() % T == 0,
             fmt::format("model.tensor_parallel = {} does not divide the MLP's hidden width {} (ffn_hidden); choose "
                         "tensor_parallel among its divisors",
                         T, cfg.mlp_hidden()));
  ZERO_CHECK(cfg.padded_vocab_size() % T == 0,
             fmt::format("model.tensor_parallel = {} does not divide the padded vocabulary {} (vocab_size {} rounded "
                         "up to a multiple of 128): each rank holds an equal part of the embedding and of the "
                         "logits; choose tensor_parallel among its divisors",
                         T, cfg.padded_vocab_size(), cfg.vocab_size));
}

zero::Layout tensor_parallel_layout(const GptConfig& cfg, int T) {
  check_tensor_parallel(cfg, T);
  zero::Layout part = zero::plan::gpt_part_layout(cfg.plan_shape(), zero::plan::PipelinePart{T, 1, 0});
  part.decay_matrices_only();  // as build_layout
  return part;
}

std::vector<std::int64_t> whole_shape(const zero::ParamInfo& part, int T) {
  std::vector<std::int64_t> s = part.shape;
  if (part.split_axis >= 0) s[static_cast<std::size_t>(part.split_axis)] *= T;
  return s;
}

void take_part(std::span<const float> whole, const zero::ParamInfo& part, int T, int t, std::span<float> out) {
  ZERO_CHECK(
      out.size() == static_cast<std::size_t>(part.numel) &&
          whole.size() == static_cast<std::size_t>(part.numel) * static_cast<std::size_t>(part.split_axis >= 0 ? T : 1),
      fmt::format("take_part: {} has {} elements per rank, but was given {} whole and {} out", part.name, part.numel,
                  whole.size(), out.size()));
  if (part.split_axis < 0) {
    std::copy(whole.begin(), whole.end(), out.begin());
    return;
  }
  // The whole tensor as [outer, A, inner] around the cut axis A: each of the `blocks` blocks
  // of A is cut into T runs of A / (blocks T), and rank t takes run t of every block.
  const auto axis = static_cast<std::size_t>(part.split_axis);
  std::int64_t outer = 1, inner = 1;
  for (std::size_t i = 0; i < axis; ++i) outer *= part.shape[i];
  for (std::size_t i = axis + 1; i < part.shape.size(); ++i) inner *= part.shape[i];
  const std::int64_t local = part.shape[axis], A = local * T, run = local / part.split_blocks;
  const std::int64_t block = A / part.split_blocks;
  std::size_t next = 0;
  for (std::int64_t o = 0; o < outer; ++o)
    for (int b = 0; b < part.split_blocks; ++b) {
      const std::int64_t first = (o * A + b * block + t * run) * inner;
      const auto n = static_cast<std::size_t>(run * inner);
      std::copy_n(whole.begin() + first, n, out.begin() + static_cast<std::ptrdiff_t>(next));
      next += n;
    }
}

}  // namespace zero::gpt
