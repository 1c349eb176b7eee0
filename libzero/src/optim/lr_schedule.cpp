// Learning-rate schedules (see zero/optim.hpp).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

#include "zero/config.hpp"
#include "zero/error.hpp"
#include "zero/optim.hpp"

namespace zero {

// DeepSpeed's schedules (deepspeed/runtime/lr_schedules.py), evaluated at
// last_batch_iteration = step:
// - The warmup length is max(2, warmup_num_steps), as DeepSpeed clamps it (log(1) = 0).
//   gamma = log(step + 1) / log(W) ("log") or step / W ("linear") for step < W.
// - WarmupLR: warmup_min_lr + (warmup_max_lr - warmup_min_lr) * gamma, then warmup_max_lr.
// - WarmupDecayLR: the same warmup, then gamma = max(0, (total - step) / max(1, total - W)) on
//   the same min..max span, as DeepSpeed computes it: the decay ends at warmup_min_lr (0 with
//   the default warmup_min_lr), not below it.
// - WarmupCosineLR: a ratio of optimizer.params.lr. Warmup from warmup_min_ratio to 1 with the
//   same gamma; then ratio = cos_min_ratio + (1 - cos_min_ratio) * (1 + cos(pi * p)) / 2 with
//   p = (step - W + 1) / (total - W) (DeepSpeed's +1: step W is already one step into the
//   cosine). Unlike DeepSpeed, p is clamped to 1 so that steps past total_num_steps stay at
//   cos_min_ratio instead of climbing back up the cosine.
double lr_at(const Config& cfg, std::int64_t step) {
  if (step < 0) {
    throw Error(fmt::format("lr_at: step {} is negative; steps count optimizer steps from 0", step));
  }
  const SchedulerConfig& s = cfg.scheduler;
  const double base_lr = cfg.optimizer.lr;
  if (s.type == SchedulerType::none) return base_lr;
  if (s.type == SchedulerType::manual_lr)
    throw Error(
        "lr_at: scheduler.type is ManualLR, whose rate the training loop sets (Engine::set_lr); the "
        "config holds no schedule to evaluate");
  const double w = static_cast<double>(std::max<std::int64_t>(2, s.warmup_num_steps));
  const double t = static_cast<double>(step);
  const bool warming = t < w;
  const double gamma = s.warmup_type == WarmupType::log ? std::log(t + 1.0) / std::log(w) : t / w;
  if (s.type == SchedulerType::warmup_cosine_lr) {
    double ratio;
    if (warming) {
      ratio = s.warmup_min_ratio + (1.0 - s.warmup_min_ratio) * gamma;
    } else {
      double span = std::max(1.0, static_cast<double>(s.total_num_steps) - w);
      double p = std::min(1.0, (t - w + 1.0) / span);
      ratio = s.cos_min_ratio + (1.0 - s.cos_min_ratio) * (1.0 + std::cos(std::numbers::pi * p)) / 2.0;
    }
    return base_lr * std::max(0.0, ratio);
  }
  const double delta = s.warmup_max_lr - s.warmup_min_lr;
  if (warming) return s.warmup_min_lr + delta * gamma;
  if (s.type == SchedulerType::warmup_lr) return s.warmup_max_lr;
  double span = std::max(1.0, static_cast<double>(s.total_num_steps) - w);
  double decay = std::max(0.0, (static_cast<double>(s.total_num_steps) - t) / span);
  return s.warmup_min_lr + delta * decay;
}

}  // namespace zero
