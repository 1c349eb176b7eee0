// Host Adafactor: the statistics of the factored second moment and of the update's RMS, in the
// order of the elements (so that every cut of a tensor into runs sums the same), then the update.
#include "offload/host_optimizer.hpp"

#include <cmath>

#include "host_kernel_util.hpp"

namespace zero::offload {

void adafactor_vector(const float* master, float* v, const void* grad, DType grad_type, std::int64_t at, std::size_t n,
                      const AdafactorConstants& c, double* p_lanes, double* u_lanes) {
  if (n == 0) return;
  check_common(master, grad, grad_type, nullptr, DType::f32, "adafactor_vector");
  with_grad_type(grad_type, [&]<int G>() {
    for_each_lane2(at, n, p_lanes, u_lanes, [&](std::size_t i, double& ps, double& us) {
      const float g = load_grad<G>(grad, i) * c.grad_scale;
      const float vi = c.beta2t * v[i] + c.one_minus_beta2t * (g * g + c.eps1);
      v[i] = vi;
      const double p = master[i], u = g / std::sqrt(vi);
      ps += p * p;
      us += u * u;
    });
  });
}

void adafactor_matrix_sums(const float* master, const void* grad, DType grad_type, std::int64_t at, std::size_t n,
                           std::int64_t cols, const AdafactorConstants& c, double* row_sums, double* col_sums,
                           double* p_lanes) {
  if (n == 0) return;
  check_common(master, grad, grad_type, nullptr, DType::f32, "adafactor_matrix_sums");
  for_each_lane(at, n, p_lanes, [&](std::size_t i, double& ps) {
    const double p = master[i];
    ps += p * p;
  });
  with_grad_type(grad_type, [&]<int G>() {
    std::int64_t row = at / cols, col = at % cols;
    for (std::size_t i = 0; i < n; ++i) {
      const float g = load_grad<G>(grad, i) * c.grad_scale;
      const double s = static_cast<double>(g) * g + c.eps1;
      row_sums[row] += s;
      col_sums[col] += s;
      if (++col == cols) {
        col = 0;
        ++row;
      }
    }
  });
}

void adafactor_matrix_rms(const void* grad, DType grad_type, std::int64_t at, std::size_t n, std::int64_t cols,
                          float grad_scale, const float* row_factor, const float* col_factor, double* u_lanes) {
  if (n == 0) return;
  with_grad_type(grad_type, [&]<int G>() {
    // The row and column of element i, stepped along (for_each_lane visits i in order).
    std::int64_t row = at / cols, col = at % cols;
    for_each_lane(at, n, u_lanes, [&](std::size_t i, double& us) {
      const float g = load_grad<G>(grad, i) * grad_scale;
      const double u = g * row_factor[row] * col_factor[col];
      us += u * u;
      if (++col == cols) col = 0, ++row;
    });
  });
}

void adafactor_apply(float* master, const float* v, float* m1, const void* grad, DType grad_type, void* param_out,
                     DType param_type, std::int64_t at, std::size_t n, std::int64_t cols, const float* row_factor,
                     const float* col_factor, const AdafactorApply& a) {
  if (n == 0) return;
  check_common(master, grad, grad_type, param_out, param_type, "adafactor_apply");
  const bool factored = row_factor != nullptr;
  // Branch-free inner loops: one instance per gradient and parameter dtype, factored or not, with
  // or without the first moment; a matrix run goes row segment by row segment.
  auto body = [&]<int G, int O, bool F, bool M>(std::size_t b, std::size_t e) {
    std::int64_t row = (at + static_cast<std::int64_t>(b)) / cols, col = (at + static_cast<std::int64_t>(b)) % cols;
    for (std::size_t i = b; i < e;) {
      const std::size_t end = F ? std::min(e, i + static_cast<std::size_t>(cols - col)) : e;
      const float rf = F ? row_factor[row] : 0.0f;
      const float* cf = F ? col_factor + col : nullptr;  // cf[i - seg]: the column of element i
      const std::size_t seg = i;
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
