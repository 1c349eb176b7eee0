// Host Muon: the momentum, the Newton-Schulz orthogonalisation through OpenBLAS, the update.
#include "offload/host_optimizer.hpp"

#include <cblas.h>

#include <cmath>

#include "host_kernel_util.hpp"

namespace zero::offload {

void muon_momentum(float* buf, const void* grad, DType grad_type, std::size_t n, float grad_scale, float momentum,
                   bool nesterov, float* x_out, int threads) {
  if (n == 0) return;
  check_common(buf, grad, grad_type, nullptr, DType::f32, "muon_momentum");
  with_grad_type(grad_type, [&]<int G>() {
    for_each_tile(n, threads, [&](std::size_t b, std::size_t e) {
      for (std::size_t i = b; i < e; ++i) {
        const float g = load_grad<G>(grad, i) * grad_scale;
        const float m = momentum * buf[i] + g;
        buf[i] = m;
        x_out[i] = nesterov ? g + momentum * m : m;
      }
    });
  });
}

void newton_schulz(float* x, std::int64_t rows, std::int64_t cols, int steps, std::vector<float>& work) {
  // PyTorch's (and Keller Jordan's) quintic coefficients.
  constexpr float a = 3.4445f, b = -4.7750f, c = 2.0315f;
  constexpr double eps = 1e-7;
  ZERO_CHECK(rows > 0 && cols > 0, "newton_schulz: empty matrix");
  const bool tall = rows > cols;
  const std::int64_t r = tall ? cols : rows, k = tall ? rows : cols;  // X is r x k, r <= k
  const std::size_t rk = static_cast<std::size_t>(r * k), rr = static_cast<std::size_t>(r * r);
  work.resize(2 * rk + 2 * rr);
  float* X = work.data();
  float* Y = X + rk;
  float* A = Y + rk;
  float* B = A + rr;
  double ss = 0.0;
  for (std::size_t i = 0; i < rk; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float inv = static_cast<float>(1.0 / std::max(std::sqrt(ss), eps));
  if (tall) {
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t j = 0; j < cols; ++j) X[j * k + i] = x[i * cols + j] * inv;
  } else {
    for (std::size_t i = 0; i < rk; ++i) X[i] = x[i] * inv;
  }
  const auto R = static_cast<blasint>(r), K = static_cast<blasint>(k);
  for (int s = 0; s < steps; ++s) {
    // A = X X^T; B = b A + c A A; Y = a X + B X.
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, R, R, K, 1.0f, X, K, X, K, 0.0f, A, R);
    for (std::size_t i = 0; i < rr; ++i) B[i] = b * A[i];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, R, R, R, c, A, R, A, R, 1.0f, B, R);
    for (std::size_t i = 0; i < rk; ++i) Y[i] = a * X[i];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, R, K, R, 1.0f, B, R, X, K, 1.0f, Y, K);
    std::swap(X, Y);
  }
  if (tall) {
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t j = 0; j < cols; ++j) x[i * cols + j] = X[j * k + i];
  } else {
    for (std::size_t i = 0; i < rk; ++i) x[i] = X[i];
  }
}

void muon_apply(float* master, const float* o, void* param_out, DType param_type, std::size_t n, float decay,
                float step, int threads) {
  if (n == 0) return;
  with_param_type(param_out, param_type, [&]<int O>() {
    for_each_tile(n, threads, [&](std::size_t b, std::size_t e) {
      for (std::size_t i = b; i < e; ++i) {
        const float p = master[i] * decay - step * o[i];
        master[i] = p;
        store_param<O>(param_out, i, p);
      }
    });
  });
}

}  // namespace zero::offload
