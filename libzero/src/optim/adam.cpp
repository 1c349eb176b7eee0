// Hyper-parameters from the config, and Adam's per-step constants (see zero/optim.hpp).
#include <cmath>

#include "zero/config.hpp"
#include "zero/optim.hpp"

namespace zero {

AdamConstants adam_constants(const AdamHyper& h) {
  // Computed in double and rounded once, so each path (and each thread) uses identical floats.
  const double t = static_cast<double>(h.step);
  const double bias_c1 = 1.0 - std::pow(static_cast<double>(h.beta1), t);
  const double bias_c2 = 1.0 - std::pow(static_cast<double>(h.beta2), t);
  AdamConstants c{};
  c.grad_scale = h.grad_scale;
  c.weight_decay = h.weight_decay;
  c.decay = static_cast<float>(1.0 - static_cast<double>(h.lr) * h.weight_decay);
  c.beta1 = h.beta1;
  c.one_minus_beta1 = static_cast<float>(1.0 - static_cast<double>(h.beta1));
  c.beta2 = h.beta2;
  c.one_minus_beta2 = static_cast<float>(1.0 - static_cast<double>(h.beta2));
  c.eps = h.eps;
  c.neg_step_size = static_cast<float>(-static_cast<double>(h.lr) / bias_c1);
  c.inv_sqrt_bias_c2 = static_cast<float>(1.0 / std::sqrt(bias_c2));
  c.l2 = !h.decoupled && h.weight_decay != 0.0f;
  c.decoupled = h.decoupled;
  return c;
}

AdamHyper adam_hyper(const OptimizerConfig& o, double lr, std::int64_t step, float grad_scale) {
  return AdamHyper{static_cast<float>(lr),
                   static_cast<float>(o.beta1),
                   static_cast<float>(o.beta2),
                   static_cast<float>(o.eps),
                   static_cast<float>(o.weight_decay),
                   o.decoupled_decay(),
                   step,
                   grad_scale};
}

SgdHyper sgd_hyper(const OptimizerConfig& o, double lr, std::int64_t step, float grad_scale) {
  return SgdHyper{static_cast<float>(lr), static_cast<float>(o.momentum), static_cast<float>(o.weight_decay),
                  grad_scale, step == 1};
}

int optimizer_moments(OptimizerType t) { return t == OptimizerType::sgd ? 1 : 2; }

}  // namespace zero
