// The optimizer's one home: the hyper-parameters of one update, the per-step constants every
// implementation shares, and the learning-rate schedules. Why the host, offload and CUDA kernels
// agree bit for bit: docs/architecture.md, note optimizer.
#pragma once

#include <cstdint>

namespace zero {

struct Config;
struct OptimizerConfig;
enum class OptimizerType;

struct AdamHyper {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  bool decoupled = true;        // true: AdamW (p *= 1 - lr*wd); false: Adam (g += wd*p)
  bool bias_correction = true;  // false: the moments are used as they are (DeepSpeed's key)
  std::int64_t step = 1;        // 1-based count of steps taken, including this one
  // Multiplies the incoming gradient before anything else: 1/loss_scale x clip coefficient x
  // 1/(number of summed contributions), folded by the caller into one factor.
  float grad_scale = 1.0f;
};

// The per-step scalars of the update, computed once in double from AdamHyper and rounded to
// float once each. Every implementation (the host paths, every thread, the CUDA kernels) takes
// them from here, so they all see identical floats.
struct AdamConstants {
  float grad_scale;
  float weight_decay;  // used by Adam's L2 term
  float decay;         // AdamW: 1 - lr*wd
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float eps;
  float neg_step_size;     // -lr / (1 - beta1^t); -lr without bias correction
  float inv_sqrt_bias_c2;  // 1 / sqrt(1 - beta2^t); 1 without bias correction
  bool l2;                 // Adam with weight_decay != 0
  bool decoupled;          // AdamW
};
AdamConstants adam_constants(const AdamHyper& h);

struct SgdHyper {
  float lr = 1e-2f;
  float momentum = 0.0f;
  float weight_decay = 0.0f;  // L2: g += wd*p
  float grad_scale = 1.0f;
  bool first_step = false;  // the momentum buffer is initialised to g on the first step
};

// The hyper-parameters of update number `step` (1-based) from the config's optimizer section.
AdamHyper adam_hyper(const OptimizerConfig& o, double lr, std::int64_t step, float grad_scale);
SgdHyper sgd_hyper(const OptimizerConfig& o, double lr, std::int64_t step, float grad_scale);

// fp32 state arrays kept per owned element besides the master (libzero/src/optim/registry.cpp
// says each optimizer's): Adam(W), Lamb, Muon and OneBitAdam 2, SGD and Lion 1, Adafactor 1 (2
// with beta1), OneBitLamb 3.
int optimizer_moments(const OptimizerConfig& o);

// The learning rate of the config's scheduler (DeepSpeed's WarmupLR, WarmupDecayLR,
// WarmupCosineLR, or none: optimizer.params.lr) at optimizer step `step` (0-based: the number
// of updates applied before this one). Throws zero::Error for a negative step, and for ManualLR,
// whose rate the loop sets (Engine::set_lr).
double lr_at(const Config& cfg, std::int64_t step);

}  // namespace zero
