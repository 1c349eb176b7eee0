// Host Adafactor: the statistics of the factored second moment (row and column sums in element
// order) and of the update's RMS (fold states, host_optimizer.hpp), so that every cut of a tensor
// into runs sums the same, then the update.
#include "offload/host_optimizer.hpp"

#include <atomic>
#include <cmath>

#include "host_kernel_util.hpp"

namespace zero::offload {
namespace {

// The whole rows [begin, begin + rows * cols) of a matrix run (rows a multiple of eight), and
// p_fold. On two threads the columns are cut in two strips: the first thread sums the left
// strip of each block of eight rows, publishes it, and then runs p_fold; the second sums the
// right strip of a block once it is published, continuing the rows' sums where the left strip
// left them, and leaves the blocks it has not taken by then to the first. Every row and every
// column still adds in element order, on any number of threads. The cut gives the first
// thread about a fifth of the columns: the fold of p^2, one float read per element, costs it
// about what the other four fifths of the sums cost the other.
template <class PFold>
void whole_rows(const void* grad, int gc, std::size_t begin, std::int64_t rows, std::int64_t cols,
                const AdafactorConstants& c, double* row_sums, double* col_sums, bool two, PFold&& p_fold) {
  if (rows == 0 || !two) {
    if (rows > 0)
      detail::matrix_sums_avx512(grad, gc, begin, rows, cols, 0, cols, c.grad_scale, c.eps1, row_sums, col_sums);
    p_fold();
    return;
  }
  const std::int64_t cut = cols / 5 / 8 * 8;
  auto strip = [&](std::int64_t r, std::int64_t c0, std::int64_t c1) {
    detail::matrix_sums_avx512(grad, gc, begin + static_cast<std::size_t>(r * cols), 8, cols, c0, c1, c.grad_scale,
                               c.eps1, row_sums + r, col_sums);
  };
  std::atomic<std::int64_t> published{0};  // rows whose left strip is summed
  std::atomic<std::int64_t> next{0};       // the first row of the right strip no thread has taken
  std::atomic<std::int64_t> right{0};      // rows whose right strip the second thread has summed
#pragma omp parallel num_threads(2)
  {
    if (omp_get_thread_num() == 1) {
      for (std::int64_t r; (r = next.fetch_add(8)) < rows; right.store(r + 8, std::memory_order_release)) {
        wait_until(published, r + 8);
        strip(r, cut, cols);
      }
    } else {
      for (std::int64_t r = 0; r < rows; r += 8) {
        strip(r, 0, cut);
        published.store(r + 8, std::memory_order_release);
      }
      p_fold();
      // The right strips the second thread has not taken (all when it has not started) are the
      // first's, after those it has (each column adds its rows in order).
      const std::int64_t taken = std::min(rows, next.exchange(rows));
      wait_until(right, taken);
      for (std::int64_t r = taken; r < rows; r += 8) strip(r, cut, cols);
    }
  }
}

}  // namespace

void adafactor_vector(const float* master, float* v, const void* grad, DType grad_type, std::int64_t at, std::size_t n,
                      const AdafactorConstants& c, double* p_fold, double* u_fold) {
  if (n == 0) return;
  check_common(master, grad, grad_type, nullptr, DType::f32, "adafactor_vector");
  const bool simd = avx512_kernels();
  const int gc = elem_code(grad_type);
  with_grad_type(grad_type, [&]<int G>() {
    fold_blocks<2>(at, n, {p_fold, u_fold}, [&](std::size_t b, std::size_t e, const std::array<double*, 2>& f) {
      square_lanes(master, at, b, e, f[0]);
      auto vector = [&](std::size_t i) {
        return simd ? detail::adafactor_vector_avx512(v, grad, gc, b + i, e, c, f[1]) - b : i;
      };
      for_each_lane_simd(at + static_cast<std::int64_t>(b), e - b, f[1], vector, [&](std::size_t k, double& us) {
        const std::size_t i = b + k;
        const float g = load_grad<G>(grad, i) * c.grad_scale;
        const float vi = c.beta2t * v[i] + c.one_minus_beta2t * (g * g + c.eps1);
        v[i] = vi;
        const double u = g / std::sqrt(vi);
        us += u * u;
      });
    });
  });
}

void adafactor_matrix_sums(const float* master, const void* grad, DType grad_type, std::int64_t at, std::size_t n,
                           std::int64_t cols, const AdafactorConstants& c, double* row_sums, double* col_sums,
                           double* p_fold) {
  if (n == 0) return;
  check_common(master, grad, grad_type, nullptr, DType::f32, "adafactor_matrix_sums");
  // The row and column folds of s, element by element over [i, end), row and col stepped along.
  std::int64_t row = at / cols, col = at % cols;
  auto sums = [&]<int G>(std::size_t i, std::size_t end) {
    for (; i < end; ++i) {
      const float g = load_grad<G>(grad, i) * c.grad_scale;
      const double s = static_cast<double>(g) * g + c.eps1;
      row_sums[row] += s;
      col_sums[col] += s;
      if (++col == cols) {
        col = 0;
        ++row;
      }
    }
  };
  // The part of the run before its first whole row, its whole rows eight at a time (AVX-512)
  // with ||p||^2 beside them, then what is left.
  with_grad_type(grad_type, [&]<int G>() {
    std::size_t i = std::min(n, static_cast<std::size_t>((cols - col) % cols));
    sums.template operator()<G>(0, i);
    const std::int64_t rows =
        avx512_kernels() ? static_cast<std::int64_t>((n - i) / static_cast<std::size_t>(cols)) / 8 * 8 : 0;
    whole_rows(grad, elem_code(grad_type), i, rows, cols, c, row_sums + row, col_sums, run_both_threads(n), [&] {
      fold_blocks<1>(at, n, {p_fold}, [&](std::size_t b, std::size_t e, const std::array<double*, 1>& f) {
        square_lanes(master, at, b, e, f[0]);
      });
    });
    i += static_cast<std::size_t>(rows * cols);
    row += rows;
    sums.template operator()<G>(i, n);
  });
}

void adafactor_matrix_rms(const void* grad, DType grad_type, std::int64_t at, std::size_t n, std::int64_t cols,
                          float grad_scale, const float* row_factor, const float* col_factor, double* u_fold) {
  if (n == 0) return;
  const bool simd = avx512_kernels();
  const int gc = elem_code(grad_type);
  with_grad_type(grad_type, [&]<int G>() {
    fold_blocks<1>(at, n, {u_fold}, [&](std::size_t b, std::size_t e, const std::array<double*, 1>& f) {
      // Row segment by row segment: the lanes continue across segments as over the whole piece.
      std::int64_t row = (at + static_cast<std::int64_t>(b)) / cols, col = (at + static_cast<std::int64_t>(b)) % cols;
      for (; b < e; ++row, col = 0) {
        const std::size_t len = std::min(e - b, static_cast<std::size_t>(cols - col));
        const float rf = row_factor[row];
        const float* cf = col_factor + col;  // cf[i]: the factor of element b + i
        const void* g = static_cast<const char*>(grad) + b * (G == detail::kF32 ? 4 : 2);
        auto vector = [&](std::size_t i) {
          return simd ? detail::matrix_rms_avx512(g, gc, i, len, grad_scale, rf, cf + i, f[0]) : i;
        };
        for_each_lane_simd(at + static_cast<std::int64_t>(b), len, f[0], vector, [&](std::size_t i, double& us) {
          const float gi = load_grad<G>(g, i) * grad_scale;
          const double u = gi * rf * cf[i];
          us += u * u;
        });
        b += len;
      }
    });
  });
}

void adafactor_apply(float* master, const float* v, float* m1, const void* grad, DType grad_type, void* param_out,
                     DType param_type, std::int64_t at, std::size_t n, std::int64_t cols, const float* row_factor,
                     const float* col_factor, const AdafactorApply& a) {
  if (n == 0) return;
  check_common(master, grad, grad_type, param_out, param_type, "adafactor_apply");
  const bool factored = row_factor != nullptr;
  const int gc = elem_code(grad_type), oc = param_out != nullptr ? elem_code(param_type) : detail::kNone;
  const bool simd = avx512_kernels() && simd_out(oc);
  float* outf = f32_out(param_out, oc);
  // Branch-free inner loops: one instance per gradient and parameter dtype, factored or not, with
  // or without the first moment; a matrix run goes row segment by row segment.
  auto body = [&]<int G, int O, bool F, bool M>(std::size_t b, std::size_t e) {
    std::int64_t row = (at + static_cast<std::int64_t>(b)) / cols, col = (at + static_cast<std::int64_t>(b)) % cols;
    for (std::size_t i = b; i < e;) {
      const std::size_t end = F ? std::min(e, i + static_cast<std::size_t>(cols - col)) : e;
      const float rf = F ? row_factor[row] : 0.0f;
      const float* cf = F ? col_factor + col : nullptr;  // cf[i - seg]: the column of element i
      const std::size_t seg = i;
      if (simd) i = detail::adafactor_apply_avx512(master, v, m1, grad, gc, outf, i, end, rf, cf, a);
      for (; i < end; ++i) {
        const float g = load_grad<G>(grad, i) * a.grad_scale;
        float u = F ? g * rf * cf[i - seg] : g / std::sqrt(v[i]);
        u = u * a.scale;
        if constexpr (M) {
          u = a.beta1 * m1[i] + a.one_minus_beta1 * u;
          m1[i] = u;
        }
        float p = master[i];
        p = p + a.neg_decay * p;
        p = p - u;
        master[i] = p;
        store_param<O>(param_out, i, p);
      }
      ++row;
      col = 0;
    }
  };
  with_grad_type(grad_type, [&]<int G>() {
    with_param_type(param_out, param_type, [&]<int O>() {
      for_each_tile(n, 0, [&](std::size_t b, std::size_t e) {
        if (factored)
          a.first_moment ? body.template operator()<G, O, true, true>(b, e)
                         : body.template operator()<G, O, true, false>(b, e);
        else
          a.first_moment ? body.template operator()<G, O, false, true>(b, e)
                         : body.template operator()<G, O, false, false>(b, e);
      });
    });
  });
}

}  // namespace zero::offload
