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

// Grid-stride indexing over [0, n) with 64-bit indices (shards may exceed 2^31 elements).
__device__ __forceinline__ std::size_t first_index() {
  return static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ std::size_t grid_stride() {
  return static_cast<std::size_t>(gridDim.x) * blockDim.x;
}

// Launch geometry shared by the element-wise kernels: enough blocks to fill an H100 several
// times over; the grid-stride loops above cover the rest.
constexpr int kThreads = 256;
constexpr std::size_t kMaxBlocks = 4096;
inline unsigned blocks_for(std::size_t n) {
  return static_cast<unsigned>(std::min<std::size_t>((n + kThreads - 1) / kThreads, kMaxBlocks));
}

}  // namespace zero::cuda::dev
