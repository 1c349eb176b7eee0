// 1-bit LAMB (Li et al. 2021, "1-bit LAMB: Communication Efficient Large-Scale Large-Batch
// Training with LAMB's Convergence Speed"; DeepSpeed's OneBitLamb and its keys), composed with
// ZeRO stages 1 and 2.
//
// For freeze_step updates it is Lamb without bias correction (DeepSpeed's update, through Lamb's
// own code: LambStep), over the exactly reduced gradients, and it records each tensor's trust
// ratio as a moving average (coeff_beta; the steps whose ratio is exactly 1 leave it alone, as
// DeepSpeed's). Its last warm-up step copies v into a fresh variance.
//
// Then the variance is frozen and the gradient reduction is replaced by the compressed momentum
// exchange (onebit_exchange.hpp), with each tensor's momentum multiplied by a scaling
// coefficient fixed at the first compressed step (the mean over tensors of the momenta's RMS,
// over the tensor's own RMS) so that tensors of different magnitudes share a scale well. From
// the exchanged momentum m each rank's owned elements take the gradient it implies,
// (m - b1 m_last) / (1 - b1), into the fresh variance; the step is lr x coeff x u with
// u = m / (sqrt(v) + eps) + wd p and coeff the frozen ratio times a factor: the largest
// (sqrt(v) + eps) / (sqrt(v_fresh) + eps) over the tensor, pulled towards 1 by the share of the
// decay in u, clamped to [factor_min, factor_max] and to within factor_threshold of the last
// step's factor. Every per-tensor quantity is over the whole tensor (SliceStats), whatever the
// partition.
//
// What is kept where: m, v and the fresh variance are the engine's moments (per owned element,
// checkpointed and re-cut for any world size and stage); the per-tensor ratio (its average
// during the warm-up, frozen after it), last factor and scaling coefficient, the same on every
// rank, are the checkpoint's tensor records; the exchange's errors and shared momentum are this
// rank's per-rank state (kept at the same world size, started again at another). A checkpoint
// without the records (an older release's, another optimizer's) resumes during the warm-up with
// the ratio's average started again (as DeepSpeed's load_state_dict does), and is refused past
// freeze_step, where its fresh variance and ratios would be missing.
//
// State in device memory takes the backend's kernels: Lamb's during the warm-up (LambStep), then
// onebit_lamb_moments, whose per-run sums and largest ratio join the statistics in end_pass as
// LambStep's device sums do, and lamb_apply; the exchange runs on the device (onebit_exchange.hpp).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "offload/host_optimizer.hpp"
#include "optim/lamb.hpp"
#include "optim/onebit_exchange.hpp"
#include "optim/optimizers.hpp"
#include "runtime/log.hpp"
#include "zero/error.hpp"

namespace zero {
namespace {

class OneBitLamb final : public Optimizer {
 public:
  OneBitLamb(const OptimizerConfig& o, const OptimizerEnv& env)
      : cfg_(o), env_(env), lamb_(o, env, false), exchange_(env), first_(tensor_offsets(*env.layout)) {
    const std::size_t tensors = static_cast<std::size_t>(first_.back());
    coeff_freeze_.assign(tensors, 0.0);
    last_factor_.assign(tensors, 1.0);
    step_.assign(tensors, 0.0f);
    for (int u = 0; u < env.layout->num_units(); ++u)
      for (const ParamInfo& p : env.layout->unit(u).params) {
        numel_.push_back(p.numel);
        decay_.push_back(p.decay);
      }
  }
  const char* name() const override { return "OneBitLamb"; }
  int moments() const override { return 3; }  // m, v, the fresh variance
  int passes() const override { return 2; }
  bool per_tensor() const override { return true; }
  bool device_kernels() const override { return true; }
  // Under tensor parallelism the engine refuses it (it exchanges the data-parallel gradients
  // itself); its warm-up is Lamb's code, exact over a tensor group.
  std::string unsupported(const Layout& layout) const override {
    return needs_tensor_group("OneBitLamb", layout, env_);
  }
  bool local_gradients(std::int64_t step) const override { return step > cfg_.freeze_step; }
  bool wants_capture() const override { return compressed_ && !exchange_.shared_valid(); }
  TensorRecords tensor_records() const override {
    return {{"coeff_freeze", coeff_freeze_},
            {"last_factor", last_factor_},
            {"scaling_coeff", std::vector<double>(scaling_.begin(), scaling_.end())}};
  }
  void restore_tensor_records(const TensorRecords& r) override {
    const std::size_t tensors = coeff_freeze_.size();
    missing_ = r.empty();
    std::fill(coeff_freeze_.begin(), coeff_freeze_.end(), 0.0);
    std::fill(last_factor_.begin(), last_factor_.end(), 1.0);
    scaling_.clear();
    if (missing_) return;
    auto field = [&](const char* name, bool may_be_empty) -> const std::vector<double>& {
      const auto it = r.find(name);
      ZERO_CHECK(it != r.end() && (it->second.size() == tensors || (may_be_empty && it->second.empty())),
                 fmt::format("OneBitLamb: the checkpoint's tensor records lack '{}' for the model's {} tensors; it "
                             "was saved for another model",
                             name, tensors));
      return it->second;
    };
    coeff_freeze_ = field("coeff_freeze", false);
    last_factor_ = field("last_factor", false);
    const std::vector<double>& scaling = field("scaling_coeff", true);  // empty: not fixed yet
    scaling_.assign(scaling.begin(), scaling.end());
  }
  std::int64_t buffer_bytes() const override {
    const auto doubles = coeff_freeze_.size() + last_factor_.size(), floats = scaling_.size() + step_.size();
    return exchange_.bytes() + static_cast<std::int64_t>(doubles * sizeof(double) + floats * sizeof(float));
  }
  const char* rank_state_kind() const override { return "onebit"; }
  std::size_t rank_state_size() const override { return exchange_.state_size(); }
  std::vector<float> rank_state() const override { return exchange_.state(); }
  void set_rank_state(const std::vector<float>& s) override { exchange_.set_state(s); }

  void begin_step(const StepHyper& h) override {
    const bool was = compressed_;
    compressed_ = local_gradients(h.step);
    step_number_ = h.step;
    lr_ = h.lr;
    grad_scale_ = h.grad_scale;
    if (!compressed_) {
      missing_ = false;  // the ratio's average starts again, as DeepSpeed's after a resume
      lamb_.begin_step(h);
      return;
    }
    if (missing_)
      ZERO_THROW(fmt::format(
          "OneBitLamb: resumed at update {}, past freeze_step {}, from a checkpoint without OneBitLamb's fresh "
          "variance and per-tensor trust ratios (saved by another optimizer, or by a release before they were "
          "kept); resume from a checkpoint saved during the warm-up, or raise optimizer.params.freeze_step above "
          "the checkpoint's step",
          h.step, cfg_.freeze_step));
    if (!was && env_.rank == 0)
      log_info(
          "OneBitLamb: update {} on: the variance and trust ratios are frozen and the momentum exchange is "
          "compressed to 1 bit (freeze_step {})",
          h.step, cfg_.freeze_step);
    const int tensors = first_.back();
    if (scaling_.empty()) momentum_.reset(tensors, env_.world, 0, env_.rank);
    // The largest ratios (from slot 2 tensors) combine by their maximum over the slices.
    stats_.reset(3 * tensors, env_.world, 2 * tensors, env_.rank, 2 * tensors);
    device_ = nullptr;
  }

  void run(int pass, const OptimRun& r, Backend* device) override {
    const std::size_t n = static_cast<std::size_t>(r.n), t = static_cast<std::size_t>(r.tensor);
    if (pass < 0) {  // capture: the owned momentum, and its norm for the scaling coefficients
      exchange_.capture(r, device);
      if (scaling_.empty()) {
        // Once per run of training: device momenta are folded on the host, as the host's are.
        std::vector<float> copied;
        const float* m = r.state[0];
        if (device != nullptr) {
          copied.resize(n);
          device->to_host(copied.data(), m, n * sizeof(float));
          m = copied.data();
        }
        double& ss = momentum_.at(r.tensor, r.slice);
        for (std::size_t i = 0; i < n; ++i) ss += static_cast<double>(m[i]) * m[i];
      }
      return;
    }
    if (!compressed_) {
      lamb_.run(pass, r, device);
      if (pass == 1 && step_number_ == cfg_.freeze_step) {
        if (device != nullptr)
          device->copy(r.state[2], r.state[1], n * sizeof(float));
        else
          std::copy(r.state[1], r.state[1] + n, r.state[2]);
      }
      return;
    }
    const float wd = r.decay ? static_cast<float>(cfg_.weight_decay) : 0.0f;
    if (pass == 0) {
      const offload::OneBitLambConstants c{static_cast<float>(cfg_.beta1),
                                           static_cast<float>(1.0 / (1.0 - cfg_.beta1)),
                                           static_cast<float>(cfg_.beta2),
                                           static_cast<float>(1.0 - cfg_.beta2),
                                           static_cast<float>(cfg_.eps),
                                           wd,
                                           scaling_[t]};
      if (device != nullptr)
        return device->onebit_lamb_moments(r.master, r.state[0], r.state[1], r.state[2],
                                           exchange_.new_m(r.unit) + r.own_at, n, c, device_sums(*device, r));
      offload::onebit_lamb_moments(r.master, r.state[0], r.state[1], r.state[2], exchange_.new_m(r.unit) + r.own_at,
                                   r.at, n, c, stats_.lanes(2 * r.tensor, r.slice),
                                   stats_.lanes(2 * r.tensor + 1, r.slice),
                                   stats_.at(2 * first_.back() + r.tensor, r.slice));
      return;
    }
    // The direction m / (sqrt(v) + eps) + wd p is Lamb's without bias correction.
    const offload::LambConstants k{1.0f, 0.0f, 0.0f, 0.0f, 0.0f, static_cast<float>(cfg_.eps), wd, 1.0f, 1.0f};
    if (device != nullptr)
      return device->lamb_apply(r.master, r.state[0], r.state[1], r.param_out, r.param_type, n, k, step_[t]);
    offload::lamb_apply(r.master, r.state[0], r.state[1], r.param_out, r.param_type, n, k, step_[t]);
  }

  void end_pass(int) override {
    if (!compressed_) {
      lamb_.end_pass();
      for (std::size_t t = 0; t < coeff_freeze_.size(); ++t) {
        const double trust = lamb_.trust(static_cast<int>(t));
        if (trust != 1.0) coeff_freeze_[t] = cfg_.coeff_beta * coeff_freeze_[t] + (1.0 - cfg_.coeff_beta) * trust;
      }
      return;
    }
    if (device_ != nullptr) add_device_sums();
    stats_.combine(env_.comm, env_.rank);
    const int tensors = first_.back();
    for (int t = 0; t < tensors; ++t) {
      const std::size_t tz = static_cast<std::size_t>(t);
      const double u = std::sqrt(stats_.total(2 * t)), prelim = std::sqrt(stats_.total(2 * t + 1));
      double factor = stats_.total(2 * tensors + t);  // the largest ratio over the slices
      if (cfg_.weight_decay > 0.0 && decay_[tz]) {
        const double share = u > 0.0 ? std::min(1.0, prelim / u) : 1.0;
        factor = factor * share + (1.0 - share);
      }
      factor = std::clamp(factor, cfg_.factor_min, cfg_.factor_max);
      factor = std::min(factor, last_factor_[tz] * (1.0 + cfg_.factor_threshold));
      factor = std::max(factor, last_factor_[tz] * (1.0 - cfg_.factor_threshold));
      last_factor_[tz] = factor;
      step_[tz] = static_cast<float>(lr_ * coeff_freeze_[tz] * factor);
    }
  }

  void exchange(const std::vector<const void*>& full, DType type, Backend* device) override {
    if (scaling_.empty()) scaling_coefficients();
    exchange_.exchange(full, type, static_cast<float>(cfg_.beta1), grad_scale_, &scaling_, device);
  }

 private:
  // Slices of each tensor whose sums this rank holds: every one at stage 0, else its own.
  std::size_t held() const { return env_.stage == 0 ? static_cast<std::size_t>(env_.world) : 1; }
  // The three device doubles of run r's tensor and slice (||u||^2, ||prelim||^2, the largest
  // ratio), zeroed by the step's first device run.
  double* device_sums(Backend& device, const OptimRun& r) {
    const std::size_t bytes = 3 * step_.size() * held() * sizeof(double);
    if (device_ == nullptr) {
      device_ = &device;
      if (!sums_) sums_ = device.alloc(bytes);
      device.zero(sums_.get(), bytes);
    }
    const std::size_t at =
        static_cast<std::size_t>(r.tensor) * held() + static_cast<std::size_t>(env_.stage == 0 ? r.slice : 0);
    return sums_.as<double>() + 3 * at;
  }
  // The step's one wait for the device: its sums join the statistics as the host's lanes would
  // (LambStep::end_pass does the same), its largest ratios as the host's maximum.
  void add_device_sums() {
    const int tensors = first_.back();
    const std::size_t h = held();
    sums_host_.resize(3 * step_.size() * h);
    device_->to_host(sums_host_.data(), sums_.get(), sums_host_.size() * sizeof(double));
    for (int t = 0; t < tensors; ++t)
      for (std::size_t k = 0; k < h; ++k) {
        const int slice = env_.stage == 0 ? static_cast<int>(k) : env_.rank;
        const double* v = sums_host_.data() + 3 * (static_cast<std::size_t>(t) * h + k);
        stats_.at(2 * t, slice) += v[0];
        stats_.at(2 * t + 1, slice) += v[1];
        double& worst = stats_.at(2 * tensors + t, slice);
        worst = std::max(worst, v[2]);
      }
  }

  // DeepSpeed's scaling_coeff, once, from the momentum at the end of the warm-up (the capture's
  // norms): the mean over tensors of ||m|| / sqrt(numel), over the tensor's own (1 for a tensor
  // whose momentum is zero, where DeepSpeed's would divide by zero).
  void scaling_coefficients() {
    momentum_.combine(env_.comm, env_.rank);
    const std::size_t tensors = numel_.size();
    std::vector<double> rms(tensors);
    double sum = 0.0;
    for (std::size_t t = 0; t < tensors; ++t) {
      rms[t] = std::sqrt(momentum_.total(static_cast<int>(t))) / std::sqrt(static_cast<double>(numel_[t]));
      sum += rms[t];
    }
    const double united = sum / static_cast<double>(tensors);
    scaling_.resize(tensors);
    for (std::size_t t = 0; t < tensors; ++t) scaling_[t] = rms[t] > 0.0 ? static_cast<float>(united / rms[t]) : 1.0f;
  }

  OptimizerConfig cfg_;
  OptimizerEnv env_;
  LambStep lamb_;
  OneBitExchange exchange_;
  std::vector<int> first_;
  std::vector<std::int64_t> numel_;  // per tensor
  std::vector<bool> decay_;          // per tensor
  bool compressed_ = false;
  bool missing_ = false;  // restored from a checkpoint without the tensor records
  std::int64_t step_number_ = 0;
  double lr_ = 0.0;
  float grad_scale_ = 1.0f;
  std::vector<double> coeff_freeze_, last_factor_;  // per tensor: the frozen ratio, the last factor
  std::vector<float> scaling_;                      // per tensor: DeepSpeed's scaling_coeff
  std::vector<float> step_;                         // per tensor: lr x coeff
  SliceStats momentum_, stats_;
  // State in device memory: this step's backend (null: host memory) and its sums per tensor.
  Backend* device_ = nullptr;
  Buffer sums_;
  std::vector<double> sums_host_;
};

}  // namespace

std::unique_ptr<Optimizer> make_onebit_lamb(const OptimizerConfig& o, const OptimizerEnv& env) {
  return std::make_unique<OneBitLamb>(o, env);
}

}  // namespace zero
