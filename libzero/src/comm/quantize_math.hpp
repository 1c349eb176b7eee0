// The per-element arithmetic of block quantization (comm/quantize.hpp) in one place, for the
// host quantizer (comm/quantize.cpp) and the CUDA kernels (cuda/quantize_kernels.cu): both
// compute a block's scale, each integer, each dequantized value and each residual with these
// functions, so the device's packed bytes and error-feedback residuals are the host's bit for
// bit (test_cuda_quantize compares them). The device code is compiled with -fmad=false and the
// host's (comm/quantize.cpp) with -ffp-contract=off, so neither compiler fuses a product here
// into an add (a fused multiply-add rounds once, and the residuals would differ).
//
// The packed layout: ceil(n / block) fp32 scales, then the values (int8: one byte each; int4:
// value + 8 in a nibble, element i in the low nibble of byte i / 2 when i is even, the high one
// when odd), padded with zeros to a multiple of 4 bytes.
#pragma once

#include <math.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define ZERO_QUANT_HD __host__ __device__ __forceinline__
#else
#define ZERO_QUANT_HD inline
#endif

namespace zero::quant::math {

ZERO_QUANT_HD std::size_t blocks(std::size_t n, std::size_t block) { return (n + block - 1) / block; }
// Bytes of the values of n elements (int8: one each; int4: two per byte).
ZERO_QUANT_HD std::size_t value_bytes(std::size_t n, bool int8) { return int8 ? n : (n + 1) / 2; }
// The bytes of the packed form of n values: the scales, the values, zeros to a 4-byte multiple.
ZERO_QUANT_HD std::size_t packed_bytes(std::size_t n, std::size_t block, bool int8) {
  return (blocks(n, block) * sizeof(float) + value_bytes(n, int8) + 3) / 4 * 4;
}
// The largest integer magnitude: 127 for int8, 7 for int4.
ZERO_QUANT_HD float levels(bool int8) { return int8 ? 127.0f : 7.0f; }

// Finite and not NaN, without the library's isfinite (whose host and device spellings differ).
ZERO_QUANT_HD bool finite(float x) { return fabsf(x) <= 3.40282346638528859812e+38f; }

// A block's scale from the largest magnitude of its values (exact: a maximum has no rounding, so
// any order of visiting them gives the same amax) and whether all were finite. An inf or NaN
// makes the scale NaN, and the block comes back all NaN: an fp16 overflow stays visible to the
// loss scaler on the receiving side.
ZERO_QUANT_HD float block_scale(float amax, bool all_finite, float top) {
  if (all_finite) return amax / top;
  // One NaN bit pattern on host and device (their nanf("") differ), so the bytes compare equal.
  const std::uint32_t bits = 0x7fc00000u;
  float nan;
  memcpy(&nan, &bits, sizeof nan);
  return nan;
}

// The integer sent for x: round to nearest, half to even (rintf in the default rounding mode, the
// same on every rank and device), clamped to [-top, top]; 0 when the scale is 0 (a block of
// zeros) or NaN.
ZERO_QUANT_HD int quantize_value(float x, float scale, float top) {
  const float v = scale > 0.0f ? rintf(x / scale) : 0.0f;
  return static_cast<int>(fminf(fmaxf(v, -top), top));
}

// What the receiver gets back for integer k: k x scale in fp32.
ZERO_QUANT_HD float dequantize_value(int k, float scale) { return static_cast<float>(k) * scale; }

// int4: element i's nibble (k + 8, shifted into its half of byte i / 2), and back.
ZERO_QUANT_HD unsigned char int4_nibble(int k, std::size_t i) {
  return static_cast<unsigned char>((k + 8) << (4 * (i % 2)));
}
ZERO_QUANT_HD int int4_value(unsigned char byte, std::size_t i) { return ((byte >> (4 * (i % 2))) & 0xF) - 8; }

}  // namespace zero::quant::math
