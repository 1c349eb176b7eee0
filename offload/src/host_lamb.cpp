// Host LAMB: the moments and the norms in one pass, the update in a second (the trust ratio
// needs the norms over the whole tensor first).
#include "offload/host_optimizer.hpp"

#include <atomic>
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

// The folds over elements [b, e) of the run, continuing the lanes, storing the new moments,
// or, when `stored`, taking them from m and v.
template <int G>
void fold(const float* master, float* m, float* v, const void* grad, std::int64_t at, std::size_t b, std::size_t e,
          const LambConstants& c, double* p_lanes, double* u_lanes, bool stored) {
  const bool simd = avx512_kernels();
  auto vector = [&](std::size_t i) {
    return simd ? detail::lamb_moments_avx512(master, m, v, grad, G, b + i, e, c, p_lanes, u_lanes, stored) - b : i;
  };
  for_each_lane2_simd(at + static_cast<std::int64_t>(b), e - b, p_lanes, u_lanes, vector,
                      [&](std::size_t k, double& ps, double& us) {
                        const std::size_t i = b + k;
                        float mi = m[i], vi = v[i];
                        if (!stored) {
                          new_moments<G>(m, v, grad, i, c, mi, vi);
                          m[i] = mi;
                          v[i] = vi;
                        }
                        const double p = master[i], u = lamb_direction(mi, vi, master[i], c);
                        ps += p * p;
                        us += u * u;
                      });
}

template <int G>
void update(float* m, float* v, const void* grad, std::size_t b, std::size_t e, const LambConstants& c) {
  if (avx512_kernels()) b = detail::lamb_update_avx512(m, v, grad, G, b, e, c);
  for (std::size_t i = b; i < e; ++i) {
    float mi, vi;
    new_moments<G>(m, v, grad, i, c, mi, vi);
    m[i] = mi;
    v[i] = vi;
  }
}

}  // namespace

// The folds are one thread's walk through the run in element order. On two threads (the
// OpenMP default allowing) the second takes the last 30% of the run's moments (g, m and v in,
// m and v out) tile by tile while the first does the rest of the run; the first then folds
// the tiles the second has stored from the stored moments (m, v and p in), and does the
// tiles it has not taken itself. The first thread moves 24 bytes per element of its part and
// 12 of the other, the second 20: four more bytes per element of that part in all, against a
// second core's bandwidth. The cut: measured on a 2-core AMD guest, one core's 43 GB/s and
// two cores' 55 GB/s balance near 29%. The bits are those of one thread.
void lamb_moments(const float* master, float* m, float* v, const void* grad, DType grad_type, std::int64_t at,
                  std::size_t n, const LambConstants& c, double* p_lanes, double* u_lanes) {
  if (n == 0) return;
  check_common(master, grad, grad_type, nullptr, DType::f32, "lamb_moments");
  ZERO_CHECK(m != nullptr && v != nullptr, "lamb_moments: the moment buffers must not be null");
  with_grad_type(grad_type, [&]<int G>() {
    if (!run_both_threads(n)) return fold<G>(master, m, v, grad, at, 0, n, c, p_lanes, u_lanes, false);
    const std::size_t cut = n - n / 10 * 3, tiles = (n - cut + kTile - 1) / kTile;
    auto tile = [&](std::size_t k, bool stored) {
      fold<G>(master, m, v, grad, at, cut + k * kTile, std::min(n, cut + (k + 1) * kTile), c, p_lanes, u_lanes, stored);
    };
    std::atomic<std::size_t> next{0};    // the first tile of the last part no thread has taken
    std::atomic<std::size_t> stored{0};  // the tiles whose moments the second thread has stored
#pragma omp parallel num_threads(2)
    {
      if (omp_get_thread_num() == 1) {
        for (std::size_t k; (k = next.fetch_add(1)) < tiles; stored.store(k + 1, std::memory_order_release))
          update<G>(m, v, grad, cut + k * kTile, std::min(n, cut + (k + 1) * kTile), c);
      } else {
        fold<G>(master, m, v, grad, at, 0, cut, c, p_lanes, u_lanes, false);
        // The tiles the second thread has not taken (all of them when it has not started: a
        // busy core costs the wait for one tile at most) are the first thread's to do whole.
        const std::size_t taken = std::min(tiles, next.exchange(tiles));
        for (std::size_t k = 0; k < tiles; ++k) {
          if (k < taken) wait_until(stored, k + 1);
          tile(k, k < taken);
        }
      }
    }
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
