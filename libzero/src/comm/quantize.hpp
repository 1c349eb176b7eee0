// Block int8 quantization for communication (ZeRO++ qwZ): each block of `block` values is sent
// as one fp32 scale, max|x| / 127, and `block` int8 values round(x / scale), so a gather moves
// about a quarter of the fp32 bytes (half of bf16's). Dequantized, each value is within
// scale / 2 = max|x| / 254 of the original, max over its block (round to nearest; a block of
// zeros gives zeros). Deterministic: the same input gives the same bytes on every rank.
//
// The packed form of n values: ceil(n / block) fp32 scales, then n int8 values, padded to a
// multiple of 4 bytes so that packed blocks can travel as fp32 words.
#pragma once

#include <cstddef>
#include <cstdint>

#include "zero/dtype.hpp"

namespace zero::quant {

std::size_t packed_bytes(std::size_t n, std::size_t block);
// src: n values of dtype t; out: packed_bytes(n, block) bytes.
void quantize_int8(const void* src, DType t, std::size_t n, std::size_t block, void* out);
// in: a packed block of n values; dst: n values of dtype t (rounded once to it).
void dequantize_int8(const void* in, std::size_t n, std::size_t block, void* dst, DType t);

}  // namespace zero::quant
