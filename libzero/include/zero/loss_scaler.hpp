// fp16 loss scaling with DeepSpeed's semantics: static (fp16.loss_scale > 0), 1 without fp16, or
// dynamic: an overflow step is skipped, the scale halves after `hysteresis` overflows and doubles
// after loss_scale_window clean steps; see docs/architecture.md, note loss-scaling.
#pragma once

#include <cstdint>

#include "zero/config.hpp"

namespace zero {

class LossScaler {
 public:
  explicit LossScaler(const Fp16Config& c);
  double scale() const { return scale_; }
  bool dynamic() const { return dynamic_; }
  int hysteresis_left() const { return hysteresis_left_; }
  // Records the outcome of one optimizer step (overflow: the step was skipped).
  void update(bool overflow);

  // State for checkpoints.
  struct State {
    double scale;
    int hysteresis_left;
    std::int64_t iter, last_overflow_iter;
  };
  State state() const { return {scale_, hysteresis_left_, iter_, last_overflow_iter_}; }
  void set_state(const State& s);

 private:
  bool dynamic_ = false;
  double scale_ = 1.0, min_scale_ = 1.0;
  int window_ = 1000, hysteresis_ = 2, hysteresis_left_ = 2;
  std::int64_t iter_ = 0, last_overflow_iter_ = -1;
};

}  // namespace zero
