// Adam and AdamW: the hyper-parameters from the config, the per-step constants every
// implementation shares (zero/optim.hpp), and the optimizer, stepped by the backend's kernels
// on device state and by the host kernels (offload/src/host_adam*.cpp) on host state.
#include <cmath>
#include <memory>

#include "backend/backend.hpp"
#include "offload/host_optimizer.hpp"
#include "optim/optimizers.hpp"
#include "zero/config.hpp"
#include "zero/optim.hpp"

namespace zero {

AdamConstants adam_constants(const AdamHyper& h) {
  // Computed in double and rounded once, so each path (and each thread) uses identical floats.
  const double t = static_cast<double>(h.step);
  const double bias_c1 = h.bias_correction ? 1.0 - std::pow(static_cast<double>(h.beta1), t) : 1.0;
  const double bias_c2 = h.bias_correction ? 1.0 - std::pow(static_cast<double>(h.beta2), t) : 1.0;
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
                   o.bias_correction,
                   step,
                   grad_scale};
}

namespace {

class Adam final : public Optimizer {
 public:
  explicit Adam(const OptimizerConfig& o) : cfg_(o) {}
  const char* name() const override { return to_string(cfg_.type); }
  int moments() const override { return 2; }
  bool device_kernels() const override { return true; }
  void begin_step(const StepHyper& h) override { hyper_ = adam_hyper(cfg_, h.lr, h.step, h.grad_scale); }
  void run(int, const OptimRun& r, Backend* device) override {
    AdamHyper a = hyper_;
    if (!r.decay) a.weight_decay = 0.0f;
    const std::size_t n = static_cast<std::size_t>(r.n);
    if (device != nullptr)
      device->adam(r.master, r.state[0], r.state[1], r.grad, r.grad_type, r.param_out, r.param_type, n, a);
    else
      offload::adam_step(r.master, r.state[0], r.state[1], r.grad, r.grad_type, r.param_out, r.param_type, n, a);
  }

 private:
  OptimizerConfig cfg_;
  AdamHyper hyper_;
};

}  // namespace

std::unique_ptr<Optimizer> make_adam(const OptimizerConfig& o) { return std::make_unique<Adam>(o); }

}  // namespace zero
