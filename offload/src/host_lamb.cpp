// Host LAMB: the moments and the norms in one pass, the update in a second (the trust ratio
// needs the norms over the whole tensor first).
#include "offload/host_optimizer.hpp"

#include <cmath>

#include "host_kernel_util.hpp"

namespace zero::offload {
namespace {

// The one expression of the update direction both passes use.
inline float lamb_direction(float m, float v, float p, const LambConstants& c) {
  return (m * c.inv_bias_c1) / (std::sqrt(v * c.inv_bias_c2) + c.eps) + c.weight_decay * p;
}

// LAMB's moments of element i from the stored ones.
template <int G>
inline void new_moments(const float* m, const float* v, const void* grad, std::size_t i, const LambConstants& c,
                        float& mi, float& vi) {
  const float g = load_grad<G>(grad, i) * c.grad_scale;
  mi = c.beta1 * m[i] + c.one_minus_beta1 * g;
  vi = c.beta2 * v[i] + (c.one_minus_beta2 * g) * g;
}

// The folds over elements [b, e) of the run, continuing the lanes, storing the new moments.
template <int G>
void fold(const float* master, float* m, float* v, const void* grad, std::int64_t at, std::size_t b, std::size_t e,
          const LambConstants& c, double* p_lanes, double* u_lanes) {
  const bool simd = avx512_kernels();
  auto vector = [&](std::size_t i) {
    return simd ? detail::lamb_moments_avx512(master, m, v, grad, G, b + i, e, c, p_lanes, u_lanes) - b : i;
  };
  for_each_lane2_simd(at + static_cast<std::int64_t>(b), e - b, p_lanes, u_lanes, vector,
                      [&](std::size_t k, double& ps, double& us) {
                        const std::size_t i = b + k;
                        float mi, vi;
                        new_moments<G>(m, v, grad, i, c, mi, vi);
                        m[i] = mi;
                        v[i] = vi;
                        const double p = master[i], u = lamb_direction(mi, vi, master[i], c);
                        ps += p * p;
                        us += u * u;
                      });
}

}  // namespace

void lamb_moments(const float* master, float* m, float* v, const void* grad, DType grad_type, std::int64_t at,
                  std::size_t n, const LambConstants& c, double* p_fold, double* u_fold) {
  if (n == 0) return;
  check_common(master, grad, grad_type, nullptr, DType::f32, "lamb_moments");
  ZERO_CHECK(m != nullptr && v != nullptr, "lamb_moments: the moment buffers must not be null");
  with_grad_type(grad_type, [&]<int G>() {
    fold_blocks<2>(at, n, {p_fold, u_fold}, [&](std::size_t b, std::size_t e, const std::array<double*, 2>& f) {
      fold<G>(master, m, v, grad, at, b, e, c, f[0], f[1]);
    });
  });
}

void lamb_apply(float* master, const float* m, const float* v, void* param_out, DType param_type, std::size_t n,
                const LambConstants& c, float step, int threads) {
  if (n == 0) return;
  ZERO_CHECK(master != nullptr && m != nullptr && v != nullptr, "lamb_apply: null state");
  const int oc = param_out != nullptr ? elem_code(param_type) : detail::kNone;
  const bool simd = avx512_kernels() && simd_out(oc);
  with_param_type(param_out, param_type, [&]<int O>() {
    for_each_tile(n, threads, [&](std::size_t b, std::size_t e) {
      if (simd) b = detail::lamb_apply_avx512(master, m, v, f32_out(param_out, oc), b, e, c, step);
      for (std::size_t i = b; i < e; ++i) {
        const float p = master[i] - step * lamb_direction(m[i], v[i], master[i], c);
        master[i] = p;
        store_param<O>(param_out, i, p);
      }
    });
  });
}

}  // namespace zero::offload
