// Internal interface between the portable SGD, LAMB and Adafactor drivers and their AVX-512
// kernels (host_sgd_lamb_avx512.cpp, host_adafactor_avx512.cpp). The same rule as
// host_adam_kernels.hpp: only plain data and declarations cross from one instruction set to
// the other.
//
// Each kernel does the part of a run it can do sixteen elements at a time and returns the
// index where it stopped; the portable driver does the rest with its own loop. The kernels
// repeat the portable loops' float and double operations in the same order, without fused
// multiply-adds, so their results are the portable ones bit for bit. A lane fold starts at an
// element of lane 0 (element `at + i` with (at + i) mod kStatLanes == 0) and keeps the rule of
// for_each_lane2: lane k receives its elements in element order, eight lanes in one register.
#pragma once

#include <cstddef>
#include <cstdint>

#include "offload/host_optimizer.hpp"  // LambConstants, AdafactorConstants, AdafactorApply (plain data)

namespace zero::offload::detail {

// SGD's constants and its case: momentum kind (0 none, 1 the first step, 2 later), decay or not.
struct SgdKernel {
  float lr, momentum, weight_decay, grad_scale;
  int momentum_kind;
  bool decay;
};

#if ZERO_OFFLOAD_X86
// Element-wise passes over [begin, end); out_code is kNone or kF32 (the drivers keep the 16-bit
// outputs on the portable loops).
std::size_t sgd_avx512(float* master, float* buf, const void* grad, int grad_code, float* out, std::size_t begin,
                       std::size_t end, const SgdKernel& c);
std::size_t lamb_apply_avx512(float* master, const float* m, const float* v, float* out, std::size_t begin,
                              std::size_t end, const LambConstants& c, float step);
// One row segment (or a vector run) of adafactor_apply: factored when cf is not null, where
// element i's column factor is cf[i - begin].
std::size_t adafactor_apply_avx512(float* master, const float* v, float* m1, const void* grad, int grad_code,
                                   float* out, std::size_t begin, std::size_t end, float rf, const float* cf,
                                   const AdafactorApply& a);

// Lane folds from element `begin` (of lane 0) on. lamb_moments_avx512 stores the new moments.
std::size_t lamb_moments_avx512(const float* master, float* m, float* v, const void* grad, int grad_code,
                                std::size_t begin, std::size_t end, const LambConstants& c, double* p_lanes,
                                double* u_lanes);
std::size_t adafactor_vector_avx512(float* v, const void* grad, int grad_code, std::size_t begin, std::size_t end,
                                    const AdafactorConstants& c, double* u_lanes);
std::size_t square_fold_avx512(const float* x, std::size_t begin, std::size_t end, double* lanes);
// u = g * rf * cf[i - begin] within one row segment, its square folded into the lanes.
std::size_t matrix_rms_avx512(const void* grad, int grad_code, std::size_t begin, std::size_t end, float grad_scale,
                              float rf, const float* cf, double* u_lanes);
// Row and column sums of s = g^2 + eps1 over `rows` whole rows (a multiple of eight) of `cols`
// elements from element `begin`, the first of row_sums[0]'s row, columns [c0, c1) (c0 a
// multiple of eight): every row and every column continues its fold in element order.
void matrix_sums_avx512(const void* grad, int grad_code, std::size_t begin, std::int64_t rows, std::int64_t cols,
                        std::int64_t c0, std::int64_t c1, float grad_scale, float eps1, double* row_sums,
                        double* col_sums);

#else
// Other architectures build no AVX-512 translation unit: avx512_kernels() is false there and
// these stand-ins, which take nothing, are never called (unoptimised builds still link them).
inline std::size_t sgd_avx512(float*, float*, const void*, int, float*, std::size_t b, std::size_t, const SgdKernel&) {
  return b;
}
inline std::size_t lamb_apply_avx512(float*, const float*, const float*, float*, std::size_t b, std::size_t,
                                     const LambConstants&, float) {
  return b;
}
inline std::size_t adafactor_apply_avx512(float*, const float*, float*, const void*, int, float*, std::size_t b,
                                          std::size_t, float, const float*, const AdafactorApply&) {
  return b;
}
inline std::size_t lamb_moments_avx512(const float*, float*, float*, const void*, int, std::size_t b, std::size_t,
                                       const LambConstants&, double*, double*) {
  return b;
}
inline std::size_t adafactor_vector_avx512(float*, const void*, int, std::size_t b, std::size_t,
                                           const AdafactorConstants&, double*) {
  return b;
}
inline std::size_t square_fold_avx512(const float*, std::size_t b, std::size_t, double*) { return b; }
inline std::size_t matrix_rms_avx512(const void*, int, std::size_t b, std::size_t, float, float, const float*,
                                     double*) {
  return b;
}
inline void matrix_sums_avx512(const void*, int, std::size_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                               float, float, double*, double*) {}
#endif

}  // namespace zero::offload::detail
