// Adafactor's passes over a run of one tensor (optim/adafactor.cpp), each line the host
// reference's (offload/src/host_adafactor.cpp, built with -ffp-contract=off) with its operations
// spelled as round-to-nearest intrinsics, so V, M, the master and the parameters equal the host's
// bit for bit (kernels.hpp says why).
//
// The statistics keep the host's contract. A matrix's row and column sums of g^2 + eps1 are
// sequential folds in element order on the host, continued run after run; here one thread owns
// a row (or a column) and folds the run's elements of it in that same order, starting from the
// value the previous run left, so the sums are the host's bit for bit. The sums of p^2 and u^2
// fold in eight lanes on the host, which a GPU cannot do at speed: here they are fixed-order sums
// (device_math.cuh's sum_blocks and block_sum2, then launch_add_partials), deterministic, and
// different from the host's only in the rounding of the double additions.
#include <algorithm>

#include "cuda/cuda_check.hpp"
#include "cuda/device_math.cuh"
#include "cuda/kernels.hpp"

namespace zero::cuda {

namespace {

using namespace dev;
using offload::AdafactorApply;
using offload::AdafactorConstants;

// g^2 + eps1 in double, as the host's row and column folds add it.
__device__ __forceinline__ double factored_square(float g, float eps1) {
  const double d = g;
  return __dadd_rn(__dmul_rn(d, d), static_cast<double>(eps1));
}

// Vectors: V = beta2t V + (1 - beta2t)(g^2 + eps1), u = g / sqrt(V); per block the partial sums
// of p^2 and u^2.
template <int G>
__global__ void vector_kernel(const float* __restrict__ master, float* __restrict__ v, const void* __restrict__ grad,
                              std::size_t n, AdafactorConstants c, double* __restrict__ partials) {
  double ps = 0.0, us = 0.0;
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    const float g = __fmul_rn(load<G>(grad, i), c.grad_scale);
    const float s = __fadd_rn(__fmul_rn(g, g), c.eps1);
    const float vi = __fadd_rn(__fmul_rn(c.beta2t, v[i]), __fmul_rn(c.one_minus_beta2t, s));
    v[i] = vi;
    const double p = master[i], u = __fdiv_rn(g, __fsqrt_rn(vi));
    ps = __dadd_rn(ps, __dmul_rn(p, p));
    us = __dadd_rn(us, __dmul_rn(u, u));
  }
  block_partials2(ps, us, partials);
}

// The run [at, at + n) of a matrix with `cols` columns: one thread per row it touches, folding
// that row's elements in column order onto row_sums[row].
template <int G>
__global__ void row_sums_kernel(const void* __restrict__ grad, std::int64_t at, std::size_t n, std::int64_t cols,
                                float grad_scale, float eps1, double* __restrict__ row_sums) {
  const std::int64_t end = at + static_cast<std::int64_t>(n);
  const std::int64_t first = at / cols, last = (end - 1) / cols;
  for (std::int64_t row = first + static_cast<std::int64_t>(first_index()); row <= last;
       row += static_cast<std::int64_t>(grid_stride())) {
    const std::int64_t b = std::max(at, row * cols), e = std::min(end, (row + 1) * cols);
    double s = row_sums[row];
    for (std::int64_t k = b; k < e; ++k)
      s = __dadd_rn(s, factored_square(__fmul_rn(load<G>(grad, static_cast<std::size_t>(k - at)), grad_scale), eps1));
    row_sums[row] = s;
  }
}

// The same run: one thread per column, folding the column's elements in row order (adjacent
// threads read adjacent elements).
template <int G>
__global__ void col_sums_kernel(const void* __restrict__ grad, std::int64_t at, std::size_t n, std::int64_t cols,
                                float grad_scale, float eps1, double* __restrict__ col_sums) {
  const std::int64_t end = at + static_cast<std::int64_t>(n);
  const std::int64_t first = at / cols, last = (end - 1) / cols;
  for (std::int64_t col = static_cast<std::int64_t>(first_index()); col < cols;
       col += static_cast<std::int64_t>(grid_stride())) {
    double s = col_sums[col];
    bool touched = false;
    for (std::int64_t row = first; row <= last; ++row) {
      const std::int64_t k = row * cols + col;
      if (k < at || k >= end) continue;
      s = __dadd_rn(s, factored_square(__fmul_rn(load<G>(grad, static_cast<std::size_t>(k - at)), grad_scale), eps1));
      touched = true;
    }
    if (touched) col_sums[col] = s;
  }
}

// Matrices' second pass: per block the partial sum of u^2, u = g * row_factor[r] * col_factor[c].
template <int G>
__global__ void rms_kernel(const void* __restrict__ grad, std::int64_t at, std::size_t n, std::int64_t cols,
                           float grad_scale, const float* __restrict__ row_factor, const float* __restrict__ col_factor,
                           double* __restrict__ partials) {
  double us = 0.0;
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    const std::int64_t k = at + static_cast<std::int64_t>(i), row = k / cols, col = k - row * cols;
    const float g = __fmul_rn(load<G>(grad, i), grad_scale);
    const double u = __fmul_rn(__fmul_rn(g, row_factor[row]), col_factor[col]);
    us = __dadd_rn(us, __dmul_rn(u, u));
  }
  block_partials2(us, 0.0, partials);
}

// The update: u from V or the factors (F), times scale; with a first moment (M) u = M; then
// p = p + neg_decay p - u.
template <int G, int O, bool F, bool M>
__global__ void apply_kernel(float* __restrict__ master, const float* __restrict__ v, float* __restrict__ m1,
                             const void* __restrict__ grad, void* __restrict__ out, std::int64_t at, std::size_t n,
                             std::int64_t cols, const float* __restrict__ row_factor,
                             const float* __restrict__ col_factor, AdafactorApply a) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    const float g = __fmul_rn(load<G>(grad, i), a.grad_scale);
    float u;
    if constexpr (F) {
      const std::int64_t k = at + static_cast<std::int64_t>(i), row = k / cols, col = k - row * cols;
      u = __fmul_rn(__fmul_rn(g, row_factor[row]), col_factor[col]);
    } else {
      u = __fdiv_rn(g, __fsqrt_rn(v[i]));
    }
    u = __fmul_rn(u, a.scale);
    if constexpr (M) {
      u = __fadd_rn(__fmul_rn(a.beta1, m1[i]), __fmul_rn(a.one_minus_beta1, u));
      m1[i] = u;
    }
    float p = master[i];
    p = __fadd_rn(p, __fmul_rn(a.neg_decay, p));
    p = __fsub_rn(p, u);
    master[i] = p;
    store<O>(out, i, p);
  }
}

// Calls f.template operator()<G>() with G the type code of t.
template <class F>
void with_type(DType t, F&& f) {
  switch (t) {
    case DType::f32: return f.template operator()<kF32>();
    case DType::bf16: return f.template operator()<kBF16>();
    case DType::f16: return f.template operator()<kF16>();
  }
}

template <int G, int O>
void apply_out(float* master, const float* v, float* m1, const void* grad, void* out, std::int64_t at, std::size_t n,
               std::int64_t cols, const float* rf, const float* cf, const AdafactorApply& a, cudaStream_t s) {
  const unsigned b = blocks_for(n);
  const bool f = rf != nullptr;
  if (f && a.first_moment)
    apply_kernel<G, O, true, true><<<b, kThreads, 0, s>>>(master, v, m1, grad, out, at, n, cols, rf, cf, a);
  else if (f)
    apply_kernel<G, O, true, false><<<b, kThreads, 0, s>>>(master, v, m1, grad, out, at, n, cols, rf, cf, a);
  else if (a.first_moment)
    apply_kernel<G, O, false, true><<<b, kThreads, 0, s>>>(master, v, m1, grad, out, at, n, cols, rf, cf, a);
  else
    apply_kernel<G, O, false, false><<<b, kThreads, 0, s>>>(master, v, m1, grad, out, at, n, cols, rf, cf, a);
}

}  // namespace

void launch_adafactor_vector(const float* master, float* v, const void* grad, DType gt, std::size_t n,
                             const AdafactorConstants& c, double* sums, double* scratch, cudaStream_t s) {
  if (n == 0) return;
  const unsigned b = sum_blocks(n, kSumBlocks);
  with_type(gt, [&]<int G>() { vector_kernel<G><<<b, kThreads, 0, s>>>(master, v, grad, n, c, scratch); });
  ZERO_CUDA_CHECK(cudaGetLastError());
  launch_add_partials(scratch, b, true, sums, s);
}

void launch_adafactor_matrix_sums(const float* master, const void* grad, DType gt, std::int64_t at, std::size_t n,
                                  std::int64_t cols, const AdafactorConstants& c, double* row_sums, double* col_sums,
                                  double* p_sum, double* scratch, cudaStream_t s) {
  if (n == 0) return;
  launch_add_sumsq(master, n, p_sum, scratch, s);
  const std::int64_t rows = (at + static_cast<std::int64_t>(n) - 1) / cols - at / cols + 1;
  const unsigned rb = blocks_for(static_cast<std::size_t>(rows)), cb = blocks_for(static_cast<std::size_t>(cols));
  with_type(gt, [&]<int G>() {
    row_sums_kernel<G><<<rb, kThreads, 0, s>>>(grad, at, n, cols, c.grad_scale, c.eps1, row_sums);
    col_sums_kernel<G><<<cb, kThreads, 0, s>>>(grad, at, n, cols, c.grad_scale, c.eps1, col_sums);
  });
  ZERO_CUDA_CHECK(cudaGetLastError());
}

void launch_adafactor_matrix_rms(const void* grad, DType gt, std::int64_t at, std::size_t n, std::int64_t cols,
                                 float grad_scale, const float* row_factor, const float* col_factor, double* u_sum,
                                 double* scratch, cudaStream_t s) {
  if (n == 0) return;
  const unsigned b = sum_blocks(n, kSumBlocks);
  with_type(gt, [&]<int G>() {
    rms_kernel<G><<<b, kThreads, 0, s>>>(grad, at, n, cols, grad_scale, row_factor, col_factor, scratch);
  });
  ZERO_CUDA_CHECK(cudaGetLastError());
  launch_add_partials(scratch, b, false, u_sum, s);
}

void launch_adafactor_apply(float* master, const float* v, float* m1, const void* grad, DType gt, void* out, DType pt,
                            std::int64_t at, std::size_t n, std::int64_t cols, const float* row_factor,
                            const float* col_factor, const AdafactorApply& a, cudaStream_t s) {
  if (n == 0) return;
  with_type(gt, [&]<int G>() {
    if (out == nullptr) return apply_out<G, kNone>(master, v, m1, grad, out, at, n, cols, row_factor, col_factor, a, s);
    with_type(pt,
              [&]<int O>() { apply_out<G, O>(master, v, m1, grad, out, at, n, cols, row_factor, col_factor, a, s); });
  });
  ZERO_CUDA_CHECK(cudaGetLastError());
}

}  // namespace zero::cuda
