// Host Lion: one pass per element.
#include "offload/host_optimizer.hpp"

#include "host_kernel_util.hpp"

namespace zero::offload {

void lion_step(float* master, float* m, const void* grad, DType grad_type, void* param_out, DType param_type,
               std::size_t n, const LionConstants& c, int threads) {
  if (n == 0) return;
  check_common(master, grad, grad_type, param_out, param_type, "lion_step");
  ZERO_CHECK(m != nullptr, "lion_step: the momentum buffer must not be null");
  with_grad_type(grad_type, [&]<int G>() {
    with_param_type(param_out, param_type, [&]<int O>() {
      for_each_tile(n, threads, [&](std::size_t b, std::size_t e) {
        for (std::size_t i = b; i < e; ++i) {
          const float g = load_grad<G>(grad, i) * c.grad_scale;
          const float mi = m[i];
          const float u = c.beta1 * mi + c.one_minus_beta1 * g;
          const float sign = u > 0.0f ? 1.0f : (u < 0.0f ? -1.0f : 0.0f);
          const float p = master[i] * c.decay - c.lr * sign;
          m[i] = c.beta2 * mi + c.one_minus_beta2 * g;
          master[i] = p;
          store_param<O>(param_out, i, p);
        }
      });
    });
  });
}

}  // namespace zero::offload
