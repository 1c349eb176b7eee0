#include "zero/loss_scaler.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "zero/error.hpp"

namespace zero {

LossScaler::LossScaler(const Fp16Config& c) {
  if (!c.enabled) return;
  if (c.loss_scale > 0) {
    scale_ = c.loss_scale;
    return;
  }
  dynamic_ = true;
  scale_ = std::ldexp(1.0, c.initial_scale_power);
  min_scale_ = c.min_loss_scale;
  window_ = c.loss_scale_window;
  hysteresis_ = hysteresis_left_ = c.hysteresis;
}

void LossScaler::update(bool overflow) {
  if (!dynamic_) {
    ++iter_;
    return;
  }
  if (overflow) {
    if (hysteresis_left_ <= 1) {
      if (scale_ <= min_scale_)
        ZERO_THROW(
            fmt::format("fp16 gradients overflowed at the minimum loss scale ({:f}): the run has diverged. "
                        "Lower the learning rate, enable gradient_clipping, use bf16, or lower "
                        "fp16.min_loss_scale",
                        min_scale_));
      scale_ = std::max(scale_ / 2.0, min_scale_);
    } else {
      --hysteresis_left_;
    }
    last_overflow_iter_ = iter_;
  } else if ((iter_ - last_overflow_iter_) % window_ == 0) {
    hysteresis_left_ = hysteresis_;
    scale_ *= 2.0;
  }
  ++iter_;
}

void LossScaler::set_state(const State& s) {
  scale_ = s.scale;
  // A run resumed with a lower fp16.hysteresis (or a checkpoint that says more than any run
  // could have left) starts from this run's setting, not from a count it never configured.
  hysteresis_left_ = dynamic_ ? std::min(s.hysteresis_left, hysteresis_) : s.hysteresis_left;
  iter_ = s.iter;
  last_overflow_iter_ = s.last_overflow_iter;
}

}  // namespace zero
