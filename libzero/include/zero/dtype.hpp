// Element types and host conversions: compute data is fp32, bf16 or fp16 (master weights and
// moments always fp32); on the host 16-bit values are raw uint16_t bit patterns rounded to nearest
// even, as the GPU's conversion instructions round, so host and device agree bit for bit.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace zero {

enum class DType : std::uint8_t { f32 = 0, bf16 = 1, f16 = 2 };

constexpr std::size_t dtype_size(DType t) { return t == DType::f32 ? 4 : 2; }
constexpr std::string_view dtype_name(DType t) {
  return t == DType::f32 ? "fp32" : (t == DType::bf16 ? "bf16" : "fp16");
}

struct bf16_t {
  std::uint16_t bits;
};
struct fp16_t {
  std::uint16_t bits;
};

// fp32 -> bf16, round to nearest even; NaN stays a (quiet) NaN.
inline std::uint16_t f32_to_bf16_bits(float f) {
  std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  std::uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>((u + rounding) >> 16);
}
inline float bf16_bits_to_f32(std::uint16_t b) { return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16); }

// fp32 -> IEEE binary16, round to nearest even, overflow to inf, subnormals kept.
inline std::uint16_t f32_to_f16_bits(float f) {
  std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  std::uint32_t sign = (u >> 16) & 0x8000u;
  std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);   // NaN
  if (a >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520: inf
  if (a < 0x38800000u) {
    // Result is subnormal or zero: value = a_float / 2^-24, rounded to nearest even.
    if (a < 0x33000000u) return static_cast<std::uint16_t>(sign);  // < 2^-25: rounds to 0
    std::uint32_t mant = (a & 0x7fffffu) | 0x800000u;
    int shift = 126 - static_cast<int>(a >> 23);  // 14 + (113 - exp) ... in [14, 24]
    std::uint32_t q = mant >> shift;
    std::uint32_t rem = mant & ((1u << shift) - 1u);
    std::uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<std::uint16_t>(sign | q);
  }
  // Normal: rebias exponent (127 -> 15) and round the 13 dropped mantissa bits.
  std::uint32_t r = a - 0x38000000u;
  r += 0x0fffu + ((r >> 13) & 1u);
  return static_cast<std::uint16_t>(sign | (r >> 13));
}
inline float f16_bits_to_f32(std::uint16_t h) {
  std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    if (mant == 0) return std::bit_cast<float>(sign);
    // Subnormal: mant * 2^-24, exact in fp32.
    float v = static_cast<float>(mant) * 0x1p-24f;
    return sign ? -v : v;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
}

// Generic load/store of one element of a buffer of dtype t.
inline float load_as_f32(const void* p, std::size_t i, DType t) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(p)[i];
    case DType::bf16: return bf16_bits_to_f32(static_cast<const std::uint16_t*>(p)[i]);
    case DType::f16: return f16_bits_to_f32(static_cast<const std::uint16_t*>(p)[i]);
  }
  return 0.0f;
}
inline void store_from_f32(void* p, std::size_t i, DType t, float v) {
  switch (t) {
    case DType::f32: static_cast<float*>(p)[i] = v; break;
    case DType::bf16: static_cast<std::uint16_t*>(p)[i] = f32_to_bf16_bits(v); break;
    case DType::f16: static_cast<std::uint16_t*>(p)[i] = f32_to_f16_bits(v); break;
  }
}
// Rounds v to the nearest value representable in t (identity for fp32).
inline float round_to(DType t, float v) {
  switch (t) {
    case DType::f32: return v;
    case DType::bf16: return bf16_bits_to_f32(f32_to_bf16_bits(v));
    case DType::f16: return f16_bits_to_f32(f32_to_f16_bits(v));
  }
  return v;
}

// Converts n elements between buffers of any two dtypes.
void convert(const void* src, DType src_t, void* dst, DType dst_t, std::size_t n);

}  // namespace zero
