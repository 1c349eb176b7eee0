// Block quantization for communication (ZeRO++ qwZ and qgZ). Each block of `block` values is sent
// as one fp32 scale and `block` small integers round(x / scale):
//   int8 (qwZ's parameter gathers, qgZ inside a node): scale = max|x| / 127, values in [-127, 127],
//        one byte each, about a quarter of fp32's bytes. Dequantized, each value is within
//        scale / 2 = max|x| / 254 of the original, max over its block.
//   int4 (qgZ across nodes): scale = max|x| / 7, values in [-7, 7] stored as value + 8 in a nibble,
//        two per byte (the even element in the low nibble), about an eighth of fp32's bytes.
//        Each value is within scale / 2 = max|x| / 14 of the original.
// Round to nearest (half to even); a block of zeros gives zeros; a block holding an inf or NaN
// comes back all NaN (an fp16 overflow stays visible to the loss scaler). Deterministic: the
// same input gives the same bytes on every rank.
//
// The packed form of n values: ceil(n / block) fp32 scales, then the values (n bytes for int8,
// ceil(n / 2) for int4), padded with zeros to a multiple of 4 bytes so that packed blocks can
// travel as fp32 words.
#pragma once

#include <cstddef>
#include <cstdint>

#include "zero/dtype.hpp"

namespace zero::quant {

enum class Bits { int8 = 8, int4 = 4 };

std::size_t packed_bytes(std::size_t n, std::size_t block, Bits bits = Bits::int8);
// The largest error of a dequantized value relative to its block's max|x| (1/254, 1/14).
double error_bound(Bits bits);

// src: n values of dtype t; out: packed_bytes(n, block) bytes.
void quantize_int8(const void* src, DType t, std::size_t n, std::size_t block, void* out);
// in: a packed block of n values; dst: n values of dtype t (rounded once to it).
void dequantize_int8(const void* in, std::size_t n, std::size_t block, void* dst, DType t);

// fp32 forms for error feedback (qgZ): quantizes v (n values) into out (packed_bytes(n, block,
// bits)) and leaves in v what the receiver will not get back: v - dequantize(out), exactly as
// the receiver's dequantize computes it.
void quantize_keep_error(float* v, std::size_t n, std::size_t block, Bits bits, void* out);
// Adds the dequantized values of a packed block of n values into acc (fp32).
void dequantize_add(const void* in, std::size_t n, std::size_t block, Bits bits, float* acc);

}  // namespace zero::quant
