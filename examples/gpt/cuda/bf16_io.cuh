// Device-side plumbing shared by the bf16 kernels: 16-byte vector loads and stores of eight
// bf16 values (with a one-element form so a kernel is written once for both widths), warp sums
// that leave the same bits in every lane, the ordered reduction of per-block column partials
// that makes dw/db/dbias deterministic, the scratch alignment and size checks of the launchers
// that take scratch, and (through status_check.hpp) the launch check that turns a failed launch
// into a zero::Error naming the operation.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "gpt/cuda/gpt_math.cuh"
#include "gpt/cuda/status_check.hpp"
#include "zero/error.hpp"

namespace zero::gpt::cuda::detail {

using bf16 = __nv_bfloat16;

inline bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

inline std::size_t align_up(std::size_t x, std::size_t a) { return (x + a - 1) / a * a; }

inline unsigned ceil_div(std::size_t a, std::size_t b) { return static_cast<unsigned>((a + b - 1) / b); }

// Scratch handed to a launcher may have any alignment: every *_scratch_bytes size includes
// kScratchAlign bytes of slack, and the launcher carves its buffers from scratch_base().
constexpr std::size_t kScratchAlign = 256;

inline std::byte* scratch_base(void* scratch) {
  return reinterpret_cast<std::byte*>(align_up(reinterpret_cast<std::uintptr_t>(scratch), kScratchAlign));
}

// The launcher's own check that the caller's scratch is the size its *_scratch_bytes asked for.
inline void check_scratch(const char* op, const void* scratch, std::size_t scratch_bytes, std::size_t need,
                          const std::string& shape) {
  ZERO_CHECK(scratch != nullptr && scratch_bytes >= need,
             std::string(op) + ": scratch of " + std::to_string(scratch_bytes) + " bytes for " + shape + ", needs " +
                 std::to_string(need) + " (" + op + "_scratch_bytes)");
}

// The deterministic column sums (dw, db, dbias): threads per block over the columns, and the
// bytes of one [row blocks, C] array of fp32 partial sums, padded to kScratchAlign.
constexpr int kColumnThreads = 128;

inline std::size_t column_partial_bytes(int N, int C) {
  return align_up(static_cast<std::size_t>(math::column_reduce_blocks(N)) * C * sizeof(float), kScratchAlign);
}

// VEC = 8: one 16-byte access (p must be 16-byte aligned); VEC = 1: one element.
template <int VEC>
__device__ __forceinline__ void load_bf16(const bf16* p, float (&f)[VEC]) {
  static_assert(VEC == 1 || VEC == 8, "bf16 vectors are 1 or 8 wide");
  if constexpr (VEC == 8) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const auto* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 v = __bfloat1622float2(h[i]);
      f[2 * i] = v.x;
      f[2 * i + 1] = v.y;
    }
  } else {
    f[0] = __bfloat162float(*p);
  }
}

// Round to nearest even, once per element.
template <int VEC>
__device__ __forceinline__ void store_bf16(bf16* p, const float (&f)[VEC]) {
  static_assert(VEC == 1 || VEC == 8, "bf16 vectors are 1 or 8 wide");
  if constexpr (VEC == 8) {
    uint4 raw;
    auto* h = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
    *reinterpret_cast<uint4*>(p) = raw;
  } else {
    *p = __float2bfloat16_rn(f[0]);
  }
}

// Butterfly sum: every lane adds the same two operands at every level (in swapped order, and
// fp32 addition is commutative), so all lanes end with bitwise the same total.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Internal linkage: each file that uses them has its own copy of the kernel and its launcher.
namespace {

// out[c] += sum over g of partials[g * C + c], g in increasing order: the second half of every
// deterministic column reduction (the first half writes one partial row per row block).
__global__ void add_column_partials_kernel(bf16* out, const float* partials, int blocks, int C) {
  const int c = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (c >= C) return;
  float acc = 0.0f;
  for (int g = 0; g < blocks; ++g) acc += partials[static_cast<std::size_t>(g) * C + c];
  out[c] = __float2bfloat16_rn(__bfloat162float(out[c]) + acc);
}

inline void add_column_partials(bf16* out, const float* partials, int blocks, int C, cudaStream_t stream) {
  constexpr int kThreads = 256;
  add_column_partials_kernel<<<ceil_div(static_cast<std::size_t>(C), kThreads), kThreads, 0, stream>>>(out, partials,
                                                                                                       blocks, C);
}

}  // namespace

}  // namespace zero::gpt::cuda::detail
