// Fused softmax cross-entropy: one block per row, no probabilities stored.
//
// Pass 1: each thread keeps online softmax statistics (max, sum of exp(l - max), gpt_math.cuh)
// over its share of the first V logits; a block reduction merges them into the row's
// log-sum-exp, and thread 0 reads the target's logit. Pass 2 (only with dlogits): each thread
// rewrites its own elements as (softmax - onehot) * dloss, and exact zeros for the padded ids
// [V, Vp). The __syncthreads of the block reduction separates the passes, and in pass 2 a thread
// reads only the elements it then writes, so dlogits may alias logits. Loads are 16-byte (8
// logits) when Vp is a multiple of 8 and the pointers are aligned, else one element.
//
// A target outside [0, V) is a caller's bug that the host cannot see without synchronising; the
// kernel does not read out of bounds for it and reports it as a NaN loss, which the trainer's
// loss check then stops on.
#include <string>

#include "bf16_io.cuh"
#include "gpt_kernels.hpp"
#include "gpt_math.cuh"
#include "zero/error.hpp"

namespace zero::gpt::cuda {

namespace {

using detail::aligned16;
using detail::load_bf16;
using detail::store_bf16;
using math::SoftmaxStats;

constexpr int kThreads = 512;

__device__ __forceinline__ SoftmaxStats shfl_xor(SoftmaxStats s, int offset) {
  return {__shfl_xor_sync(0xffffffffu, s.max, offset), __shfl_xor_sync(0xffffffffu, s.sum, offset)};
}

// The merged statistics of the whole block, in every thread. Called once per kernel (its shared
// memory is not reused afterwards).
__device__ SoftmaxStats block_merge(SoftmaxStats s) {
  __shared__ SoftmaxStats per_warp[32];
  __shared__ SoftmaxStats total;  // apart from per_warp, so no lane writes what another reads
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int warp = static_cast<int>(threadIdx.x / 32);
  const int warps = static_cast<int>(blockDim.x / 32);
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    s = math::softmax_stats_merge(s, shfl_xor(s, offset));
  if (lane == 0) per_warp[warp] = s;
  __syncthreads();
  if (warp == 0) {
    s = lane < warps ? per_warp[lane] : math::softmax_stats_empty();
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
      s = math::softmax_stats_merge(s, shfl_xor(s, offset));
    if (lane == 0) total = s;
  }
  __syncthreads();
  return total;
}

template <int VEC>
__global__ void softmax_cross_entropy_kernel(float* losses, bf16* dlogits, const bf16* logits,
                                             const std::int32_t* targets, int V, int Vp,
                                             float dloss) {
  const std::size_t off = static_cast<std::size_t>(blockIdx.x) * Vp;
  const bf16* l = logits + off;
  const int target = targets[blockIdx.x];
  const bool valid = target >= 0 && target < V;
  const int step = static_cast<int>(blockDim.x) * VEC;

  SoftmaxStats st = math::softmax_stats_empty();
  for (int c = static_cast<int>(threadIdx.x) * VEC; c < V; c += step) {
    float v[VEC];
    load_bf16<VEC>(l + c, v);  // c + VEC <= Vp: c and Vp are multiples of VEC
#pragma unroll
    for (int k = 0; k < VEC; ++k)
      if (c + k < V) st = math::softmax_stats_add(st, v[k]);
  }
  // Read before the barrier below, after which the gradient may overwrite it.
  const float target_logit = threadIdx.x == 0 && valid ? __bfloat162float(l[target]) : 0.0f;
  st = block_merge(st);
  const float lse = math::softmax_stats_lse(st);
  if (threadIdx.x == 0)
    losses[blockIdx.x] = valid ? lse - target_logit : __int_as_float(0x7fc00000);
  if (dlogits == nullptr) return;

  bf16* d = dlogits + off;
  for (int c = static_cast<int>(threadIdx.x) * VEC; c < Vp; c += step) {
    float v[VEC];
    load_bf16<VEC>(l + c, v);
#pragma unroll
    for (int k = 0; k < VEC; ++k)
      v[k] = c + k < V ? math::cross_entropy_dlogit(v[k], lse, c + k == target, dloss) : 0.0f;
    store_bf16<VEC>(d + c, v);
  }
}

}  // namespace

void softmax_cross_entropy(float* losses, bf16* dlogits, const bf16* logits,
                           const std::int32_t* targets, int N, int V, int Vp, float dloss,
                           cudaStream_t stream) {
  ZERO_CHECK(N >= 1 && V >= 1 && Vp >= V,
             "softmax_cross_entropy: unsupported shape N=" + std::to_string(N) +
                 ", V=" + std::to_string(V) + ", Vp=" + std::to_string(Vp) +
                 " (needs N >= 1 and 1 <= V <= Vp)");
  const bool vec = Vp % 8 == 0 && aligned16(logits) && (dlogits == nullptr || aligned16(dlogits));
  if (vec) {
    softmax_cross_entropy_kernel<8><<<static_cast<unsigned>(N), kThreads, 0, stream>>>(
        losses, dlogits, logits, targets, V, Vp, dloss);
  } else {
    softmax_cross_entropy_kernel<1><<<static_cast<unsigned>(N), kThreads, 0, stream>>>(
        losses, dlogits, logits, targets, V, Vp, dloss);
  }
  GPT_LAUNCH_CHECK("softmax_cross_entropy");
}

}  // namespace zero::gpt::cuda
