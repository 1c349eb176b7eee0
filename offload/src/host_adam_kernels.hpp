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

// Software prefetch distance of the SIMD kernels, in elements (2 KiB of each fp32 stream).
// Adam spends enough cycles on sqrt and division per line that the hardware prefetchers, which
// also stop at every 4 KiB page boundary, leave part of the bandwidth unused; prefetching this
// far ahead measured at the bandwidth of a plain copy loop (bench_host_adam).
constexpr std::size_t kPrefetchElems = 512;

// Element type codes for the kernels (mirrors zero::DType; kNone: no parameter output).
enum ElemCode : int { kF32 = 0, kBF16 = 1, kF16 = 2, kNone = 3 };


// Updates elements [begin, end). grad and out are the whole buffers (indexed from 0).
using AdamRangeFn = void (*)(float* master, float* m, float* v, const void* grad, int grad_code,
                             void* out, int out_code, std::size_t begin, std::size_t end,
                             const AdamConstants& c);

void adam_range_scalar(float* master, float* m, float* v, const void* grad, int grad_code,
                       void* out, int out_code, std::size_t begin, std::size_t end,
                       const AdamConstants& c);
void adam_range_avx2(float* master, float* m, float* v, const void* grad, int grad_code,
                     void* out, int out_code, std::size_t begin, std::size_t end,
                     const AdamConstants& c);
void adam_range_avx512(float* master, float* m, float* v, const void* grad, int grad_code,
                       void* out, int out_code, std::size_t begin, std::size_t end,
                       const AdamConstants& c);

}  // namespace zero::offload::detail
