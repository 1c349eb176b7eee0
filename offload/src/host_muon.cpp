// Host Muon: the momentum, the Newton-Schulz orthogonalisation through OpenBLAS, the update.
//
// Newton-Schulz runs on OpenMP's threads only: each owns a run of the rows of X and computes
// those rows of every product with single-threaded sgemm, its element-wise work (the scaling,
// transposes in cache tiles, b*A and a*X) fused in. Two measured reasons (bench_host_optimizers'
// table 3, two threads): element-wise work on OpenMP between sgemm calls on OpenBLAS's own
// threads (this build runs pthreads) reached only 50-77% of sgemm's rate, OpenMP's workers
// spinning after each region on the cores OpenBLAS needs; and OpenBLAS's threaded sgemm does not
// give the same bits on every thread count (200 x 520, for one), where cutting the output rows
// does. So the results do not depend on the thread count: the norm is a fold of fixed blocks
// (fold_blocks), and the products are the same however the rows are cut (test_host_muon
// checks it); they are the single-threaded iteration's. Several small matrices of one shape go one
// per thread, each as one thread does it: the same bits as one at a time.
#include <cblas.h>

#include <cmath>

#include "host_kernel_util.hpp"
#include "offload/host_optimizer.hpp"

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

namespace {

// Transposes go in square tiles that stay in L1; each thread's run of rows is a multiple of
// kRowAlign (sgemm's row blocking).
constexpr std::int64_t kTransposeTile = 32;
constexpr std::int64_t kRowAlign = 16;

// ||x||^2 over n elements: a fold of x^2 (host_optimizer.hpp's blocks, on `threads` threads).
double sum_squares(const float* x, std::size_t n, int threads) {
  double f[kStatFold] = {};
  fold_blocks<1>(
      0, n, {f}, [&](std::size_t b, std::size_t e, const std::array<double*, 1>& s) { square_lanes(x, 0, b, e, s[0]); },
      threads);
  return fold_total(f);
}

// Rows [i0, i1) of X (r x k, r <= k) from the [rows, cols] row-major x scaled by `scale`: x's
// rows, or, when x is tall ([k, r]), its columns, transposed in square tiles that stay in L1.
void load_rows(const float* x, bool tall, std::int64_t r, std::int64_t k, std::int64_t i0, std::int64_t i1, float scale,
               float* X) {
  if (!tall) {
    for (std::int64_t e = i0 * k; e < i1 * k; ++e) X[e] = x[e] * scale;
    return;
  }
  for (std::int64_t j0 = 0; j0 < k; j0 += kTransposeTile)
    for (std::int64_t ii = i0; ii < i1; ii += kTransposeTile) {
      const std::int64_t j1 = std::min(k, j0 + kTransposeTile), ie = std::min(i1, ii + kTransposeTile);
      for (std::int64_t i = ii; i < ie; ++i)
        for (std::int64_t j = j0; j < j1; ++j) X[i * k + j] = x[j * r + i] * scale;
    }
}

// The inverse: rows [i0, i1) of X back into x.
void store_rows(const float* X, bool tall, std::int64_t r, std::int64_t k, std::int64_t i0, std::int64_t i1, float* x) {
  if (!tall) {
    std::copy(X + i0 * k, X + i1 * k, x + i0 * k);
    return;
  }
  for (std::int64_t j0 = 0; j0 < k; j0 += kTransposeTile)
    for (std::int64_t ii = i0; ii < i1; ii += kTransposeTile) {
      const std::int64_t j1 = std::min(k, j0 + kTransposeTile), ie = std::min(i1, ii + kTransposeTile);
      for (std::int64_t j = j0; j < j1; ++j)
        for (std::int64_t i = ii; i < ie; ++i) x[j * r + i] = X[i * k + j];
    }
}

std::size_t work_elems(std::int64_t rows, std::int64_t cols) {
  const std::int64_t r = std::min(rows, cols), k = std::max(rows, cols);
  return static_cast<std::size_t>(2 * r * k + 2 * r * r);
}

// One matrix on `threads` OpenMP threads, OpenBLAS single-threaded inside (the caller sees to
// that): each thread owns a run of X's rows (kRowAlign-aligned) and computes those rows of every
// product, with the element-wise work fused in. `work` holds work_elems(rows, cols) floats.
void newton_schulz_one(float* x, std::int64_t rows, std::int64_t cols, int steps, float* work, int threads) {
  // PyTorch's (and Keller Jordan's) quintic coefficients.
  constexpr float a = 3.4445f, b = -4.7750f, c = 2.0315f;
  constexpr double eps = 1e-7;
  const bool tall = rows > cols;
  const std::int64_t r = tall ? cols : rows, k = tall ? rows : cols;  // X is r x k, r <= k
  const std::size_t rk = static_cast<std::size_t>(r * k), rr = static_cast<std::size_t>(r * r);
  const std::int64_t runs = (r + kRowAlign - 1) / kRowAlign;
  // A small matrix's products are too short to share: one thread does them all.
  const int nt = newton_schulz_small(rows, cols) ? 1 : static_cast<int>(std::min<std::int64_t>(threads, runs));
  const float inv = static_cast<float>(1.0 / std::max(std::sqrt(sum_squares(x, rk, nt)), eps));
  const auto R = static_cast<blasint>(r), K = static_cast<blasint>(k);
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    const std::int64_t t = omp_get_thread_num(), T = omp_get_num_threads();
    const std::int64_t i0 = std::min(r, runs * t / T * kRowAlign), i1 = std::min(r, runs * (t + 1) / T * kRowAlign);
    const auto M = static_cast<blasint>(i1 - i0);
    float* X = work;
    float* Y = X + rk;
    float* A = Y + rk;
    float* B = A + rr;
    load_rows(x, tall, r, k, i0, i1, inv, X);
    for (int s = 0; s < steps; ++s) {
#pragma omp barrier
      // Rows [i0, i1) of A = X X^T, B = b A + c A A, Y = a X + B X (which needs only these rows
      // of B).
      if (M > 0)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, R, K, 1.0f, X + i0 * k, K, X, K, 0.0f, A + i0 * r, R);
#pragma omp barrier
      if (M > 0) {
        for (std::int64_t e = i0 * r; e < i1 * r; ++e) B[e] = b * A[e];
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, R, R, c, A + i0 * r, R, A, R, 1.0f, B + i0 * r, R);
        for (std::int64_t e = i0 * k; e < i1 * k; ++e) Y[e] = a * X[e];
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, K, R, 1.0f, B + i0 * r, R, X, K, 1.0f, Y + i0 * k, K);
      }
      std::swap(X, Y);
    }
    store_rows(X, tall, r, k, i0, i1, x);  // this thread's rows only
  }
}

// OpenBLAS's own thread count, 1 while a scope lasts (this build runs its own threads, not
// OpenMP's, so callers on OpenMP's threads must tell it).
class SingleThreadedBlas {
 public:
  SingleThreadedBlas() : before_(openblas_get_num_threads()) {
    if (before_ != 1) openblas_set_num_threads(1);
  }
  ~SingleThreadedBlas() {
    if (before_ != 1) openblas_set_num_threads(before_);
  }
  SingleThreadedBlas(const SingleThreadedBlas&) = delete;
  SingleThreadedBlas& operator=(const SingleThreadedBlas&) = delete;

 private:
  int before_;
};

int resolve_threads(int threads) { return std::max(1, threads > 0 ? threads : omp_get_max_threads()); }

}  // namespace

void newton_schulz(float* x, std::int64_t rows, std::int64_t cols, int steps, std::vector<float>& work, int threads) {
  ZERO_CHECK(rows > 0 && cols > 0, "newton_schulz: empty matrix");
  work.resize(work_elems(rows, cols));
  const SingleThreadedBlas blas;
  newton_schulz_one(x, rows, cols, steps, work.data(), resolve_threads(threads));
}

bool newton_schulz_small(std::int64_t rows, std::int64_t cols) {
  const double r = static_cast<double>(std::min(rows, cols)), k = static_cast<double>(std::max(rows, cols));
  return r * r * k <= kNewtonSchulzSmall;
}

void newton_schulz_batch(float* const* xs, std::size_t count, std::int64_t rows, std::int64_t cols, int steps,
                         std::vector<float>& work, int threads) {
  ZERO_CHECK(rows > 0 && cols > 0, "newton_schulz_batch: empty matrix");
  const int nt = static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(resolve_threads(threads)), count));
  if (nt <= 1) {
    for (std::size_t i = 0; i < count; ++i) newton_schulz(xs[i], rows, cols, steps, work, threads);
    return;
  }
  const std::size_t each = work_elems(rows, cols);
  work.resize(each * static_cast<std::size_t>(nt));
  const SingleThreadedBlas blas;
  const auto n = static_cast<std::int64_t>(count);
#pragma omp parallel num_threads(nt)
  {
    float* mine = work.data() + each * static_cast<std::size_t>(omp_get_thread_num());
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t i = 0; i < n; ++i) newton_schulz_one(xs[static_cast<std::size_t>(i)], rows, cols, steps, mine, 1);
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
