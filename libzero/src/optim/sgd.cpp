// SGD with momentum (PyTorch's: dampening 0, L2 weight decay, the buffer starting as the first
// gradient), stepped by the backend's kernels on device state and by the host kernel
// (offload/src/host_sgd.cpp) on host state.
#include <memory>

#include "backend/backend.hpp"
#include "offload/host_optimizer.hpp"
#include "optim/optimizers.hpp"
#include "zero/config.hpp"
#include "zero/optim.hpp"

namespace zero {

SgdHyper sgd_hyper(const OptimizerConfig& o, double lr, std::int64_t step, float grad_scale) {
  return SgdHyper{static_cast<float>(lr), static_cast<float>(o.momentum), static_cast<float>(o.weight_decay),
                  grad_scale, step == 1};
}

namespace {

class Sgd final : public Optimizer {
 public:
  explicit Sgd(const OptimizerConfig& o) : cfg_(o) {}
  const char* name() const override { return "SGD"; }
  int moments() const override { return 1; }
  bool device_kernels() const override { return true; }
  void begin_step(const StepHyper& h) override { hyper_ = sgd_hyper(cfg_, h.lr, h.step, h.grad_scale); }
  void run(int, const OptimRun& r, Backend* device) override {
    SgdHyper s = hyper_;
    if (!r.decay) s.weight_decay = 0.0f;
    const std::size_t n = static_cast<std::size_t>(r.n);
    if (device != nullptr)
      device->sgd(r.master, r.state[0], r.grad, r.grad_type, r.param_out, r.param_type, n, s);
    else
      offload::sgd_step(r.master, r.state[0], r.grad, r.grad_type, r.param_out, r.param_type, n, s);
  }

 private:
  OptimizerConfig cfg_;
  SgdHyper hyper_;
};

}  // namespace

std::unique_ptr<Optimizer> make_sgd(const OptimizerConfig& o) { return std::make_unique<Sgd>(o); }

}  // namespace zero
