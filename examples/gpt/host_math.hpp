// What the host kernels' files share (host_kernels.cpp, host_attention.cpp): the BLAS products,
// the column chunks of the deterministic per-column sums, and the fast exp and tanh of the fp32
// loops. Private to those files.
#pragma once

#include <cblas.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>

namespace zero::gpt::host {

// Matrix products go to OpenBLAS, which threads them itself; they are therefore never called
// from inside an OpenMP parallel region (the pthread OpenBLAS would oversubscribe the cores).
inline void gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
                 float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B,
              ldb, beta, C, ldc);
}
inline void gemm(bool ta, bool tb, int M, int N, int K, double alpha, const double* A, int lda, const double* B,
                 int ldb, double beta, double* C, int ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B,
              ldb, beta, C, ldc);
}

// Column sums and other per-column reductions over N rows are split into column chunks, one
// per task: no two threads write the same gradient element, and the summation order (rows in
// order) does not depend on the thread count, so results are reproducible run to run.
inline constexpr int kColumnChunk = 64;

// body(c0, c1) for each chunk of columns [c0, c1) of C, the chunks in parallel.
template <class Body>
void column_chunks(int C, Body&& body) {
  const int chunks = (C + kColumnChunk - 1) / kColumnChunk;
#pragma omp parallel for
  for (int k = 0; k < chunks; ++k) body(k * kColumnChunk, std::min(C, (k + 1) * kColumnChunk));
}

inline std::size_t idx(std::size_t row, std::size_t width) { return row * width; }

template <class T>
constexpr T kGeluScale = static_cast<T>(0.7978845608028654);  // sqrt(2 / pi)

// exp for the fp32 hot loops. The libm call is scalar (it cannot be vectorised without
// -ffast-math) and tanh through it was a third of a training step's time. This one is plain
// arithmetic the compiler vectorises: e^x = 2^n e^r with n = round(x / ln 2), |r| <= ln2 / 2,
// and e^r by its degree-6 Taylor polynomial (truncation r^7/7! < 1.3e-7, about one ulp). The
// double instantiation, which the gradient tests use, keeps std::exp.
inline float exp_fast(float x) {
  // NaN in, NaN out. The clamp alone would pass a NaN on to the float-to-int conversion below,
  // which is undefined for NaN (diverged weights, a denormal loss scale); the select keeps the
  // loop vectorisable.
  const float in = x;
  x = std::min(std::max(x, -87.0f), 88.0f);
  x = x == x ? x : 0.0f;
  // Round to nearest by the 1.5 * 2^23 trick: pure float adds, no rounding-mode instruction.
  const float n = (x * 1.44269504f + 12582912.0f) - 12582912.0f;
  const float r = (x - n * 0.693145752f) - n * 1.42860677e-6f;  // ln 2 split hi + lo
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const std::int32_t bits = (static_cast<std::int32_t>(n) + 127) << 23;
  return in == in ? p * std::bit_cast<float>(bits) : in;
}
inline double exp_fast(double x) { return std::exp(x); }

// tanh(u) = sign(u) (1 - e^{-2|u|}) / (1 + e^{-2|u|}); absolute error ~1e-7, which is what
// GELU needs (its value is 0.5 x (1 + tanh), so relative accuracy near 0 does not matter).
template <class T>
inline T tanh_fast(T u) {
  const T e = exp_fast(T(-2) * std::abs(u));
  const T t = (T(1) - e) / (T(1) + e);
  return u < T(0) ? -t : t;
}

}  // namespace zero::gpt::host
