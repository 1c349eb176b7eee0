// 1-bit Adam (Tang et al. 2021, "1-bit Adam: Communication Efficient Large-Scale Training with
// Adam's Convergence Speed"; DeepSpeed's OneBitAdam and its keys), composed with ZeRO stages 1
// and 2.
//
// For freeze_step updates it is Adam without bias correction (DeepSpeed's update), over the
// exactly reduced gradients. Then the variance is frozen and the gradient reduction is replaced by
// the compressed momentum exchange (onebit_exchange.hpp); the owner's decoded slice is its new m,
// and p moves by -lr m / (sqrt(v) + eps). State in device memory takes the backend's kernels
// (Backend::adam during the warm-up, onebit_adam_apply after it) and a device exchange.
#include <fmt/format.h>

#include <memory>
#include <vector>

#include "offload/host_optimizer.hpp"
#include "runtime/log.hpp"
#include "optim/onebit_exchange.hpp"
#include "optim/optimizers.hpp"
#include "zero/error.hpp"

namespace zero {
namespace {

class OneBitAdam final : public Optimizer {
 public:
  OneBitAdam(const OptimizerConfig& o, const OptimizerEnv& env) : cfg_(o), env_(env), exchange_(env) {}
  const char* name() const override { return "OneBitAdam"; }
  int moments() const override { return 2; }
  bool per_tensor() const override { return true; }  // runs leave the padding out
  bool device_kernels() const override { return true; }
  bool local_gradients(std::int64_t step) const override { return step > cfg_.freeze_step; }
  bool wants_capture() const override { return compressed_ && !exchange_.shared_valid(); }
  // The exchange's errors and shared momentum: kept by a resume at the same world size, started
  // again at another (set_rank_state({})).
  std::int64_t buffer_bytes() const override { return exchange_.bytes(); }
  const char* rank_state_kind() const override { return "onebit"; }
  std::size_t rank_state_size() const override { return exchange_.state_size(); }
  std::vector<float> rank_state() const override { return exchange_.state(); }
  void set_rank_state(const std::vector<float>& s) override { exchange_.set_state(s); }

  void begin_step(const StepHyper& h) override {
    const bool was = compressed_;
    compressed_ = local_gradients(h.step);
    if (compressed_ && !was && env_.rank == 0)
      log_info(
          "OneBitAdam: update {} on: the variance is frozen and the momentum exchange is compressed to 1 bit "
          "(freeze_step {})",
          h.step, cfg_.freeze_step);
    hyper_ = AdamHyper{static_cast<float>(h.lr),
                       static_cast<float>(cfg_.beta1),
                       static_cast<float>(cfg_.beta2),
                       static_cast<float>(cfg_.eps),
                       static_cast<float>(cfg_.weight_decay),
                       true,
                       false,
                       h.step,
                       h.grad_scale};
  }

  void run(int pass, const OptimRun& r, Backend* device) override {
    const std::size_t n = static_cast<std::size_t>(r.n);
    if (pass < 0) {  // capture: the owned momentum, for the first compressed exchange
      exchange_.capture(r, device);
      return;
    }
    AdamHyper a = hyper_;
    if (!r.decay) a.weight_decay = 0.0f;
    if (!compressed_) {
      if (device != nullptr)
        device->adam(r.master, r.state[0], r.state[1], r.grad, r.grad_type, r.param_out, r.param_type, n, a);
      else
        offload::adam_step(r.master, r.state[0], r.state[1], r.grad, r.grad_type, r.param_out, r.param_type, n, a);
      return;
    }
    const AdamConstants c = adam_constants(a);
    const float* m_new = exchange_.new_m(r.unit) + r.own_at;
    if (device != nullptr)
      device->onebit_adam_apply(r.master, r.state[0], r.state[1], m_new, r.param_out, r.param_type, n, c.decay,
                                c.neg_step_size, c.eps);
    else
      offload::onebit_adam_apply(r.master, r.state[0], r.state[1], m_new, r.param_out, r.param_type, n, c.decay,
                                 c.neg_step_size, c.eps);
  }

  void exchange(const std::vector<const void*>& full, DType type, Backend* device) override {
    exchange_.exchange(full, type, hyper_.beta1, hyper_.grad_scale, nullptr, device);
  }

 private:
  OptimizerConfig cfg_;
  OptimizerEnv env_;
  OneBitExchange exchange_;
  AdamHyper hyper_;
  bool compressed_ = false;
};

}  // namespace

std::unique_ptr<Optimizer> make_onebit_adam(const OptimizerConfig& o, const OptimizerEnv& env) {
  return std::make_unique<OneBitAdam>(o, env);
}

}  // namespace zero
