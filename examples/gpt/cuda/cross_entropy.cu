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
// The vocabulary-parallel passes (tensor parallelism) are plainer: one block per row, one
// element per load, a shared-memory reduction of the block's maximum or sum; the caller
// all-reduces the per-row results across the tensor group between the passes.
//
// A target outside [0, V) is a caller's bug that the host cannot see without synchronising; the
// kernels (the whole-row one and the vocabulary-parallel finish) do not read out of bounds for
// it and report it as a NaN loss, which the trainer's loss check then stops on.
#include <cmath>
#include <string>

#include "gpt/cuda/bf16_io.cuh"
#include "gpt/cuda/gpt_kernels.hpp"
#include "gpt/cuda/gpt_math.cuh"
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
  for (int offset = 16; offset > 0; offset >>= 1) s = math::softmax_stats_merge(s, shfl_xor(s, offset));
  if (lane == 0) per_warp[warp] = s;
  __syncthreads();
  if (warp == 0) {
    s = lane < warps ? per_warp[lane] : math::softmax_stats_empty();
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) s = math::softmax_stats_merge(s, shfl_xor(s, offset));
    if (lane == 0) total = s;
  }
  __syncthreads();
  return total;
}

template <int VEC>
__global__ void softmax_cross_entropy_kernel(float* losses, bf16* dlogits, const bf16* logits,
                                             const std::int32_t* targets, int V, int Vp, float dloss) {
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
  if (threadIdx.x == 0) losses[blockIdx.x] = valid ? lse - target_logit : __int_as_float(0x7fc00000);
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

// The block's max or sum of v, in every thread.
template <bool kMax>
__device__ float block_reduce(float v) {
  __shared__ float part[kThreads];
  part[threadIdx.x] = v;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half >>= 1) {
    if (static_cast<int>(threadIdx.x) < half) {
      const float o = part[threadIdx.x + half];
      part[threadIdx.x] = kMax ? fmaxf(part[threadIdx.x], o) : part[threadIdx.x] + o;
    }
    __syncthreads();
  }
  return part[0];
}

__global__ void cross_entropy_part_max_kernel(float* row_max, const bf16* logits, int Vl, int real) {
  const bf16* l = logits + static_cast<std::size_t>(blockIdx.x) * Vl;
  float mx = -INFINITY;
  for (int c = static_cast<int>(threadIdx.x); c < real; c += kThreads) mx = fmaxf(mx, __bfloat162float(l[c]));
  mx = block_reduce<true>(mx);
  if (threadIdx.x == 0) row_max[blockIdx.x] = mx;
}

__global__ void cross_entropy_part_sums_kernel(float* sums, const bf16* logits, const float* row_max,
                                               const std::int32_t* targets, int N, int Vl, int v0, int real) {
  const bf16* l = logits + static_cast<std::size_t>(blockIdx.x) * Vl;
  const float mx = row_max[blockIdx.x];
  float sum = 0.0f;
  for (int c = static_cast<int>(threadIdx.x); c < real; c += kThreads) sum += expf(__bfloat162float(l[c]) - mx);
  sum = block_reduce<false>(sum);
  if (threadIdx.x == 0) {
    const int t = targets[blockIdx.x] - v0;
    sums[blockIdx.x] = sum;
    sums[N + static_cast<int>(blockIdx.x)] = t >= 0 && t < real ? __bfloat162float(l[t]) : 0.0f;
  }
}

__global__ void cross_entropy_part_finish_kernel(float* losses, bf16* dlogits, const bf16* logits, const float* row_max,
                                                 const float* sums, const std::int32_t* targets, int N, int Vl, int v0,
                                                 int V, int real, float dloss) {
  const std::size_t off = static_cast<std::size_t>(blockIdx.x) * Vl;
  const float lse = row_max[blockIdx.x] + logf(sums[blockIdx.x]);
  // The target's part sent 0 for a target outside [0, V) (no part holds it): without this check
  // the loss would read as a finite lse.
  const int global = targets[blockIdx.x];
  if (threadIdx.x == 0)
    losses[blockIdx.x] =
        global >= 0 && global < V ? lse - sums[N + static_cast<int>(blockIdx.x)] : __int_as_float(0x7fc00000);
  if (dlogits == nullptr) return;
  const int target = global - v0;
  // Each thread reads only the elements it then writes: dlogits may alias logits.
  for (int c = static_cast<int>(threadIdx.x); c < Vl; c += kThreads) {
    const float v =
        c < real ? math::cross_entropy_dlogit(__bfloat162float(logits[off + c]), lse, c == target, dloss) : 0.0f;
    dlogits[off + c] = __float2bfloat16(v);
  }
}

void check_part_shape(const char* op, int N, int Vl, int v0, int V) {
  ZERO_CHECK(N >= 1 && Vl >= 1 && v0 >= 0 && V >= 1,
             std::string(op) + ": unsupported shape N=" + std::to_string(N) + ", Vl=" + std::to_string(Vl) +
                 ", v0=" + std::to_string(v0) + ", V=" + std::to_string(V) + " (needs N, Vl, V >= 1 and v0 >= 0)");
}
int real_ids(int Vl, int v0, int V) { return V - v0 < 0 ? 0 : (V - v0 < Vl ? V - v0 : Vl); }

}  // namespace

void cross_entropy_part_max(float* row_max, const bf16* logits, int N, int Vl, int v0, int V, cudaStream_t stream) {
  check_part_shape("cross_entropy_part_max", N, Vl, v0, V);
  cross_entropy_part_max_kernel<<<static_cast<unsigned>(N), kThreads, 0, stream>>>(row_max, logits, Vl,
                                                                                   real_ids(Vl, v0, V));
  GPT_LAUNCH_CHECK("cross_entropy_part_max");
}

void cross_entropy_part_sums(float* sums, const bf16* logits, const float* row_max, const std::int32_t* targets, int N,
                             int Vl, int v0, int V, cudaStream_t stream) {
  check_part_shape("cross_entropy_part_sums", N, Vl, v0, V);
  cross_entropy_part_sums_kernel<<<static_cast<unsigned>(N), kThreads, 0, stream>>>(sums, logits, row_max, targets, N,
                                                                                    Vl, v0, real_ids(Vl, v0, V));
  GPT_LAUNCH_CHECK("cross_entropy_part_sums");
}

void cross_entropy_part_finish(float* losses, bf16* dlogits, const bf16* logits, const float* row_max,
                               const float* sums, const std::int32_t* targets, int N, int Vl, int v0, int V,
                               float dloss, cudaStream_t stream) {
  check_part_shape("cross_entropy_part_finish", N, Vl, v0, V);
  cross_entropy_part_finish_kernel<<<static_cast<unsigned>(N), kThreads, 0, stream>>>(
      losses, dlogits, logits, row_max, sums, targets, N, Vl, v0, V, real_ids(Vl, v0, V), dloss);
  GPT_LAUNCH_CHECK("cross_entropy_part_finish");
}

void softmax_cross_entropy(float* losses, bf16* dlogits, const bf16* logits, const std::int32_t* targets, int N, int V,
                           int Vp, float dloss, cudaStream_t stream) {
  ZERO_CHECK(N >= 1 && V >= 1 && Vp >= V, "softmax_cross_entropy: unsupported shape N=" + std::to_string(N) +
                                              ", V=" + std::to_string(V) + ", Vp=" + std::to_string(Vp) +
                                              " (needs N >= 1 and 1 <= V <= Vp)");
  const bool vec = Vp % 8 == 0 && aligned16(logits) && (dlogits == nullptr || aligned16(dlogits));
  if (vec) {
    softmax_cross_entropy_kernel<8>
        <<<static_cast<unsigned>(N), kThreads, 0, stream>>>(losses, dlogits, logits, targets, V, Vp, dloss);
  } else {
    softmax_cross_entropy_kernel<1>
        <<<static_cast<unsigned>(N), kThreads, 0, stream>>>(losses, dlogits, logits, targets, V, Vp, dloss);
  }
  GPT_LAUNCH_CHECK("softmax_cross_entropy");
}

}  // namespace zero::gpt::cuda
