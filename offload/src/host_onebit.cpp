// Host 1-bit Adam and 1-bit LAMB: sign compression with error feedback, the server's average,
// the updates.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include "host_kernel_util.hpp"
#include "offload/host_optimizer.hpp"

namespace zero::offload {

namespace {
inline float sign_of(const std::uint8_t* bits, std::size_t i) { return (bits[i >> 3] >> (i & 7)) & 1 ? 1.0f : -1.0f; }
}  // namespace

float onebit_compress(float* x, std::size_t n, std::uint8_t* bits) {
  std::memset(bits, 0, (n + 7) / 8);
  if (n == 0) return 0.0f;
  double ss = 0.0;
  for (std::size_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float scale = static_cast<float>(std::sqrt(ss / static_cast<double>(n)));
  for (std::size_t i = 0; i < n; ++i) {
    const bool up = x[i] >= 0.0f;
    if (up) bits[i >> 3] = static_cast<std::uint8_t>(bits[i >> 3] | (1u << (i & 7)));
    x[i] = x[i] - (up ? scale : -scale);
  }
  return scale;
}

void onebit_worker(float* x, const float* shared, const void* grad, DType grad_type, std::size_t n, float b1,
                   float one_minus_b1, float grad_scale, bool add_error) {
  if (n == 0) return;
  with_grad_type(grad_type, [&]<int G>() {
    for (std::size_t i = 0; i < n; ++i) {
      const float m = b1 * shared[i] + one_minus_b1 * (load_grad<G>(grad, i) * grad_scale);
      x[i] = add_error ? m + x[i] : m;
    }
  });
}

void onebit_decode(const std::uint8_t* bits, float scale, std::size_t n, float* out) {
  for (std::size_t i = 0; i < n; ++i) out[i] = scale * sign_of(bits, i);
}

float onebit_server(const std::uint8_t* worker_bits, std::size_t stride, const float* worker_scales, int workers,
                    float* error, std::size_t n, std::uint8_t* bits) {
  const float inv = 1.0f / static_cast<float>(workers);
  for (std::size_t i = 0; i < n; ++i) {
    float sum = 0.0f;
    for (int w = 0; w < workers; ++w)
      sum += worker_scales[w] * sign_of(worker_bits + static_cast<std::size_t>(w) * stride, i);
    error[i] = sum * inv + error[i];
  }
  return onebit_compress(error, n, bits);
}

void onebit_adam_apply(float* master, float* m, const float* v, const float* m_new, void* param_out, DType param_type,
                       std::size_t n, float decay, float neg_lr, float eps, int threads) {
  if (n == 0) return;
  with_param_type(param_out, param_type, [&]<int O>() {
    for_each_tile(n, threads, [&](std::size_t b, std::size_t e) {
      for (std::size_t i = b; i < e; ++i) {
        const float mi = m_new[i];
        float p = master[i] * decay;
        const float denom = std::fma(std::sqrt(v[i]), 1.0f, eps);
        p = std::fma(neg_lr, mi / denom, p);
        m[i] = mi;
        master[i] = p;
        store_param<O>(param_out, i, p);
      }
    });
  });
}

void onebit_lamb_moments(const float* master, float* m, const float* v, float* v_fresh, const float* m_new,
                         std::int64_t at, std::size_t n, const OneBitLambConstants& c, double* u_fold,
                         double* prelim_fold, double& ratio_max) {
  if (n == 0) return;
  ZERO_CHECK(master != nullptr && m != nullptr && v != nullptr && v_fresh != nullptr && m_new != nullptr,
             "onebit_lamb_moments: null state");
  std::atomic<double> worst{ratio_max};  // a maximum: the same whatever order the pieces end in
  fold_blocks<2>(at, n, {u_fold, prelim_fold}, [&](std::size_t b, std::size_t e, const std::array<double*, 2>& f) {
    double piece = worst.load();
    for_each_lane2(at + static_cast<std::int64_t>(b), e - b, f[0], f[1], [&](std::size_t k, double& us, double& ps) {
      const std::size_t i = b + k;
      const float mi = m_new[i] / c.scaling_coeff;
      const float r = (mi - m[i] * c.beta1) * c.inv_one_minus_beta1;
      const float vf = c.beta2 * v_fresh[i] + (c.one_minus_beta2 * r) * r;
      const float denom = std::sqrt(v[i]) + c.eps;
      // The expression lamb_apply's direction evaluates (inv_bias 1): the same float operations.
      const float prelim = mi / denom;
      const float u = prelim + c.weight_decay * master[i];
      m[i] = mi;
      v_fresh[i] = vf;
      us += static_cast<double>(u) * u;
      ps += static_cast<double>(prelim) * prelim;
      piece = std::max(piece, static_cast<double>(denom) / (static_cast<double>(std::sqrt(vf)) + c.eps));
    });
    for (double w = worst.load(); piece > w && !worst.compare_exchange_weak(w, piece);) {
    }
  });
  ratio_max = worst.load();
}

}  // namespace zero::offload
