// Internal interface between the host Adam driver (host_adam.cpp) and its per-ISA kernels.
//
// The kernels live in their own translation units, each compiled with its ISA flags. Nothing
// here may be an inline function or a template: an inline function compiled once with AVX-512
// flags and once without becomes one weak symbol, and the linker may keep the AVX-512 copy for
// the portable caller. Only plain data and declarations cross this boundary.
#pragma once

#include <cstddef>
#include <cstdint>

#include "zero/optim.hpp"  // AdamConstants (plain data)

namespace zero::offload::detail {

// Element type codes for the kernels (mirrors zero::DType; kNone: no parameter output).
enum ElemCode : int { kF32 = 0, kBF16 = 1, kF16 = 2, kNone = 3 };

// Updates elements [begin, end). grad and out are the whole buffers (indexed from 0). The SIMD
// kernels prefetch `prefetch` elements ahead (zero::offload::adam_prefetch_elements()); the
// scalar one ignores it.
using AdamRangeFn = void (*)(float* master, float* m, float* v, const void* grad, int grad_code, void* out,
                             int out_code, std::size_t begin, std::size_t end, const AdamConstants& c,
                             std::size_t prefetch);

void adam_range_scalar(float* master, float* m, float* v, const void* grad, int grad_code, void* out, int out_code,
                       std::size_t begin, std::size_t end, const AdamConstants& c, std::size_t prefetch);
void adam_range_avx2(float* master, float* m, float* v, const void* grad, int grad_code, void* out, int out_code,
                     std::size_t begin, std::size_t end, const AdamConstants& c, std::size_t prefetch);
void adam_range_avx512(float* master, float* m, float* v, const void* grad, int grad_code, void* out, int out_code,
                       std::size_t begin, std::size_t end, const AdamConstants& c, std::size_t prefetch);

}  // namespace zero::offload::detail
