// Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"; DeepSpeed's keys):
// element-wise, one moment, stepped by the backend's kernel on device state and by the host
// kernel (offload/src/host_lion.cpp) on host state, with the same arithmetic.
#include <memory>

#include "backend/backend.hpp"
#include "offload/host_optimizer.hpp"
#include "optim/optimizers.hpp"

namespace zero {
namespace {

class Lion final : public Optimizer {
 public:
  explicit Lion(const OptimizerConfig& o) : cfg_(o) {}
  const char* name() const override { return "Lion"; }
  int moments() const override { return 1; }
  bool device_kernels() const override { return true; }
  void begin_step(const StepHyper& h) override {
    const double b1 = cfg_.beta1, b2 = cfg_.beta2;
    c_ = offload::LionConstants{h.grad_scale,
                                static_cast<float>(h.lr),
                                static_cast<float>(1.0 - h.lr * cfg_.weight_decay),
                                static_cast<float>(b1),
                                static_cast<float>(1.0 - b1),
                                static_cast<float>(b2),
                                static_cast<float>(1.0 - b2)};
  }
  void run(int, const OptimRun& r, Backend* device) override {
    offload::LionConstants k = c_;
    if (!r.decay) k.decay = 1.0f;
    const std::size_t n = static_cast<std::size_t>(r.n);
    if (device != nullptr)
      device->lion(r.master, r.state[0], r.grad, r.grad_type, r.param_out, r.param_type, n, k);
    else
      offload::lion_step(r.master, r.state[0], r.grad, r.grad_type, r.param_out, r.param_type, n, k);
  }

 private:
  OptimizerConfig cfg_;
  offload::LionConstants c_{};
};

}  // namespace

std::unique_ptr<Optimizer> make_lion(const OptimizerConfig& o) { return std::make_unique<Lion>(o); }

}  // namespace zero
