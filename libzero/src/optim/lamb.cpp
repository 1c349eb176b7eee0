// LAMB (You et al. 2020, "Large Batch Optimization for Deep Learning"; DeepSpeed's FusedLamb and
// its keys): Adam's direction plus decoupled decay, scaled per tensor by the trust ratio
// ||p|| / ||u|| clamped to [min_coeff, max_coeff]. The norms are over the whole tensor, however
// the partition cuts it (SliceStats) and, for a tensor split by tensor parallelism, summed over
// the tensor group (a replicated one is whole on every rank), so the algorithm is the paper's at
// every stage and tensor-parallel size.
#include "optim/lamb.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "optim/optimizers.hpp"
#include "zero/error.hpp"

namespace zero {

std::vector<int> lamb_split_slots(const Layout& layout) {
  std::vector<int> slots;
  int t = 0;
  for (const UnitInfo& u : layout.units())
    for (const ParamInfo& p : u.params) {
      if (p.split_axis >= 0) slots.insert(slots.end(), {2 * t, 2 * t + 1});
      ++t;
    }
  return slots;
}

LambStep::LambStep(const OptimizerConfig& o, const OptimizerEnv& env, bool bias_correction)
    : cfg_(o), env_(env), bias_correction_(bias_correction), first_(tensor_offsets(*env.layout)) {
  if (env.tensor != nullptr) split_slots_ = lamb_split_slots(*env.layout);
}

void LambStep::begin_step(const StepHyper& h) {
  const double b1 = cfg_.beta1, b2 = cfg_.beta2, t = static_cast<double>(h.step);
  c_ = offload::LambConstants{h.grad_scale,
                              static_cast<float>(b1),
                              static_cast<float>(1.0 - b1),
                              static_cast<float>(b2),
                              static_cast<float>(1.0 - b2),
                              static_cast<float>(cfg_.eps),
                              static_cast<float>(cfg_.weight_decay),
                              static_cast<float>(bias_correction_ ? 1.0 / (1.0 - std::pow(b1, t)) : 1.0),
                              static_cast<float>(bias_correction_ ? 1.0 / (1.0 - std::pow(b2, t)) : 1.0)};
  lr_ = h.lr;
  const int tensors = first_.back();
  stats_.reset(2 * tensors, env_.world, 2 * tensors, env_.stage == 0 ? SliceStats::kAllSlices : env_.rank);
  step_.assign(static_cast<std::size_t>(tensors), 0.0f);
  trust_.assign(static_cast<std::size_t>(tensors), 1.0);
  device_ = nullptr;
}

void LambStep::run(int pass, const OptimRun& r, Backend* device) {
  offload::LambConstants k = c_;
  if (!r.decay) k.weight_decay = 0.0f;
  const std::size_t n = static_cast<std::size_t>(r.n);
  if (device != nullptr) {
    // Stage 0 owns every slice, stages 1-3 their own: one pair of sums per tensor and slice held.
    const std::size_t held = env_.stage == 0 ? static_cast<std::size_t>(env_.world) : 1;
    const std::size_t bytes = 2 * step_.size() * held * sizeof(double);
    if (pass == 0 && device_ == nullptr) {  // the step's first device run: the sums start at zero
      device_ = device;
      if (!sums_) sums_ = device->alloc(bytes);
      device->zero(sums_.get(), bytes);
    }
    if (pass == 0) {
      const std::size_t at =
          static_cast<std::size_t>(r.tensor) * held + static_cast<std::size_t>(env_.stage == 0 ? r.slice : 0);
      device->lamb_moments(r.master, r.state[0], r.state[1], r.grad, r.grad_type, n, k, sums_.as<double>() + 2 * at);
    } else {
      device->lamb_apply(r.master, r.state[0], r.state[1], r.param_out, r.param_type, n, k,
                         step_[static_cast<std::size_t>(r.tensor)]);
    }
    return;
  }
  if (pass == 0)
    offload::lamb_moments(r.master, r.state[0], r.state[1], r.grad, r.grad_type, r.at, n, k,
                          stats_.lanes(2 * r.tensor, r.slice), stats_.lanes(2 * r.tensor + 1, r.slice));
  else
    offload::lamb_apply(r.master, r.state[0], r.state[1], r.param_out, r.param_type, n, k,
                        step_[static_cast<std::size_t>(r.tensor)]);
}

void LambStep::end_pass() {
  if (device_ != nullptr) {
    // The step's one wait for the device: its per-slice sums join the statistics as the host's
    // would (combine adds the empty lanes to them exactly).
    const std::size_t held = env_.stage == 0 ? static_cast<std::size_t>(env_.world) : 1;
    sums_host_.resize(2 * step_.size() * held);
    device_->to_host(sums_host_.data(), sums_.get(), sums_host_.size() * sizeof(double));
    for (std::size_t t = 0; t < step_.size(); ++t)
      for (std::size_t h = 0; h < held; ++h) {
        const int slice = env_.stage == 0 ? static_cast<int>(h) : env_.rank;
        stats_.at(static_cast<int>(2 * t), slice) += sums_host_[2 * (t * held + h)];
        stats_.at(static_cast<int>(2 * t + 1), slice) += sums_host_[2 * (t * held + h) + 1];
      }
  }
  stats_.combine(env_.stage == 0 ? nullptr : env_.comm, env_.rank);
  // A split tensor's sums are its part's: one all-gather over the tensor group for all of them.
  if (!split_slots_.empty()) stats_.sum_over_tensor_group(*env_.tensor, split_slots_);
  for (std::size_t t = 0; t < step_.size(); ++t) {
    const double w = std::sqrt(stats_.total(static_cast<int>(2 * t)));
    const double u = std::sqrt(stats_.total(static_cast<int>(2 * t + 1)));
    double trust = w > 0.0 && u > 0.0 ? w / u : 1.0;
    trust = std::clamp(trust, cfg_.min_coeff, cfg_.max_coeff);
    trust_[t] = trust;
    step_[t] = static_cast<float>(lr_ * trust);
  }
}

namespace {

class Lamb final : public Optimizer {
 public:
  Lamb(const OptimizerConfig& o, const OptimizerEnv& env) : env_(env), step_(o, env, o.bias_correction) {}
  const char* name() const override { return "Lamb"; }
  int moments() const override { return 2; }
  int passes() const override { return 2; }
  bool per_tensor() const override { return true; }
  bool device_kernels() const override { return true; }
  std::string unsupported(const Layout& layout) const override { return needs_tensor_group("Lamb", layout, env_); }
  void begin_step(const StepHyper& h) override { step_.begin_step(h); }
  void run(int pass, const OptimRun& r, Backend* device) override { step_.run(pass, r, device); }
  void end_pass(int) override { step_.end_pass(); }

 private:
  OptimizerEnv env_;
  LambStep step_;
};

}  // namespace

std::unique_ptr<Optimizer> make_lamb(const OptimizerConfig& o, const OptimizerEnv& env) {
  return std::make_unique<Lamb>(o, env);
}

}  // namespace zero
