// Device-side element types: loads and stores of fp32 / bf16 / fp16 by type code, with the
// rounding of zero/dtype.hpp repeated in integer arithmetic, so a value rounds to the same bits
// on the device as on the host (NaN included, which the hardware conversions canonicalize
// differently) and the kernels' results can be compared with the host's bit for bit.
#pragma once

#include <algorithm>

#include <cstddef>
#include <cstdint>

namespace zero::cuda::dev {

// Type codes, as zero::DType's values; kNone: no output.
constexpr int kF32 = 0, kBF16 = 1, kF16 = 2, kNone = 3;

__device__ __forceinline__ float bf16_to_f32(std::uint16_t b) {
  return __uint_as_float(static_cast<std::uint32_t>(b) << 16);
}

__device__ __forceinline__ std::uint16_t f32_to_bf16(float f) {
  const std::uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  const std::uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>((u + rounding) >> 16);
}

__device__ __forceinline__ std::uint16_t f32_to_f16(float f) {
  const std::uint32_t u = __float_as_uint(f);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);
  if (a >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);
  if (a < 0x38800000u) {
    if (a < 0x33000000u) return static_cast<std::uint16_t>(sign);
    const std::uint32_t mant = (a & 0x7fffffu) | 0x800000u;
    const int shift = 126 - static_cast<int>(a >> 23);
    std::uint32_t q = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<std::uint16_t>(sign | q);
  }
  std::uint32_t r = a - 0x38000000u;
  r += 0x0fffu + ((r >> 13) & 1u);
  return static_cast<std::uint16_t>(sign | (r >> 13));
}

__device__ __forceinline__ float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    if (mant == 0) return __uint_as_float(sign);
    const float v = __fmul_rn(static_cast<float>(mant), 0x1p-24f);  // exact
    return sign ? -v : v;
  }
  if (exp == 31) return __uint_as_float(sign | 0x7f800000u | (mant << 13));
  return __uint_as_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

template <int T>
__device__ __forceinline__ float load(const void* p, std::size_t i) {
  if constexpr (T == kF32) {
    return static_cast<const float*>(p)[i];
  } else if constexpr (T == kBF16) {
    return bf16_to_f32(static_cast<const std::uint16_t*>(p)[i]);
  } else {
    return f16_to_f32(static_cast<const std::uint16_t*>(p)[i]);
  }
}

template <int T>
__device__ __forceinline__ void store(void* p, std::size_t i, float v) {
  if constexpr (T == kF32) {
    static_cast<float*>(p)[i] = v;
  } else if constexpr (T == kBF16) {
    static_cast<std::uint16_t*>(p)[i] = f32_to_bf16(v);
  } else if constexpr (T == kF16) {
    static_cast<std::uint16_t*>(p)[i] = f32_to_f16(v);
  }
}

// Four consecutive elements, moved as one access (16 bytes of fp32, 8 bytes of bf16 / fp16)
// instead of four: fewer memory transactions for the bandwidth-bound element-wise kernels. The
// values and their rounding are those of load / store, element by element.
struct F4 {
  float v[4];
};

template <int T>
__device__ __forceinline__ float half_to_f32(std::uint32_t h) {
  const std::uint16_t b = static_cast<std::uint16_t>(h & 0xffffu);
  if constexpr (T == kBF16)
    return bf16_to_f32(b);
  else
    return f16_to_f32(b);
}
template <int T>
__device__ __forceinline__ std::uint32_t f32_to_half(float f) {
  if constexpr (T == kBF16)
    return f32_to_bf16(f);
  else
    return f32_to_f16(f);
}

// Elements [4q, 4q + 4) of p; p must satisfy aligned4<T>.
template <int T>
__device__ __forceinline__ F4 load4(const void* p, std::size_t q) {
  F4 r;
  if constexpr (T == kF32) {
    const float4 f = static_cast<const float4*>(p)[q];
    r.v[0] = f.x, r.v[1] = f.y, r.v[2] = f.z, r.v[3] = f.w;
  } else {
    const uint2 u = static_cast<const uint2*>(p)[q];  // little-endian: the lower half comes first
    r.v[0] = half_to_f32<T>(u.x), r.v[1] = half_to_f32<T>(u.x >> 16);
    r.v[2] = half_to_f32<T>(u.y), r.v[3] = half_to_f32<T>(u.y >> 16);
  }
  return r;
}

template <int T>
__device__ __forceinline__ void store4(void* p, std::size_t q, const F4& r) {
  if constexpr (T == kF32) {
    static_cast<float4*>(p)[q] = make_float4(r.v[0], r.v[1], r.v[2], r.v[3]);
  } else if constexpr (T == kBF16 || T == kF16) {
    uint2 u;
    u.x = f32_to_half<T>(r.v[0]) | (f32_to_half<T>(r.v[1]) << 16);
    u.y = f32_to_half<T>(r.v[2]) | (f32_to_half<T>(r.v[3]) << 16);
    static_cast<uint2*>(p)[q] = u;
  }
}

// Whether p may be accessed by load4 / store4 (null: no buffer, no constraint). Buffers from
// the allocator always are; a sub-range at an odd offset is not, and its kernel then takes the
// scalar path.
template <int T>
__host__ __device__ __forceinline__ bool aligned4(const void* p) {
  constexpr std::uintptr_t a = T == kF32 ? 16 : 8;
  return p == nullptr || reinterpret_cast<std::uintptr_t>(p) % a == 0;
}

// Grid-stride indexing over [0, n) with 64-bit indices (shards may exceed 2^31 elements).
__device__ __forceinline__ std::size_t first_index() {
  return static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ std::size_t grid_stride() { return static_cast<std::size_t>(gridDim.x) * blockDim.x; }

// Launch geometry shared by the element-wise kernels: enough blocks to fill an H100 several
// times over; the grid-stride loops above cover the rest.
constexpr int kThreads = 256;
constexpr std::size_t kMaxBlocks = 4096;
inline unsigned blocks_for(std::size_t n) {
  return static_cast<unsigned>(std::min<std::size_t>((n + kThreads - 1) / kThreads, kMaxBlocks));
}
// Blocks for a kernel that moves four elements per thread when `vec`.
inline unsigned blocks_for(std::size_t n, bool vec) { return blocks_for(vec ? (n + 3) / 4 : n); }

// Deterministic sums (LAMB's and Adafactor's statistics, the Newton-Schulz norm): a grid fixed by
// n alone (at most `most` blocks), each thread a grid-stride sequential sum, then block_sum2's
// tree, so the same run always reduces in the same order whatever the launch timing.
inline unsigned sum_blocks(std::size_t n, std::size_t most) {
  return static_cast<unsigned>(std::max<std::size_t>(std::min<std::size_t>((n + kThreads - 1) / kThreads, most), 1));
}

// A fixed-order sum of two values over a block's kThreads threads (a shared-memory tree); every
// thread returns the totals.
__device__ __forceinline__ void block_sum2(double& a, double& b) {
  __shared__ double sa[kThreads], sb[kThreads];
  sa[threadIdx.x] = a;
  sb[threadIdx.x] = b;
  __syncthreads();
  for (unsigned half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      sa[threadIdx.x] = __dadd_rn(sa[threadIdx.x], sa[threadIdx.x + half]);
      sb[threadIdx.x] = __dadd_rn(sb[threadIdx.x], sb[threadIdx.x + half]);
    }
    __syncthreads();
  }
  a = sa[0];
  b = sb[0];
}

// The block's pair of partial sums (block_sum2 of every thread's a and b) into
// partials[2 blockIdx.x] and partials[2 blockIdx.x + 1].
__device__ __forceinline__ void block_partials2(double a, double b, double* partials) {
  block_sum2(a, b);
  if (threadIdx.x == 0) {
    partials[2 * blockIdx.x] = a;
    partials[2 * blockIdx.x + 1] = b;
  }
}

}  // namespace zero::cuda::dev
