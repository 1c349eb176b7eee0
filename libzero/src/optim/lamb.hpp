// LAMB's step (lamb.cpp), the one code path of Lamb and of OneBitLamb's warm-up (onebit_lamb.cpp):
// two passes over the owned state, the norms of each tensor combined between them (SliceStats;
// for a tensor split by tensor parallelism, then summed over the tensor group), so the trust
// ratio is the whole tensor's at every stage and tensor-parallel size.
#pragma once

#include <vector>

#include "backend/backend.hpp"
#include "offload/host_optimizer.hpp"
#include "optim/optimizer.hpp"

namespace zero {

class LambStep {
 public:
  // bias_correction: divide the moments by 1 - beta^t (OneBitLamb never does, as DeepSpeed's).
  LambStep(const OptimizerConfig& o, const OptimizerEnv& env, bool bias_correction);
  void begin_step(const StepHyper& h);
  // Pass 0 updates m and v and folds ||p||^2 and ||u||^2; pass 1 applies lr x trust. `device`:
  // the backend whose memory holds the state (its kernels step it), null for host memory.
  void run(int pass, const OptimRun& r, Backend* device = nullptr);
  // Between the passes (a collective at stages 1-3, and over the tensor group when a tensor is
  // split): the trust ratio of every tensor.
  void end_pass();
  // Tensor t's trust ratio this step, clamped to [min_coeff, max_coeff] (after end_pass).
  double trust(int t) const { return trust_[static_cast<std::size_t>(t)]; }
  int tensors() const { return first_.back(); }

 private:
  OptimizerConfig cfg_;
  OptimizerEnv env_;
  bool bias_correction_;
  std::vector<int> first_;
  std::vector<int> split_slots_;  // ||p||^2 and ||u||^2 of the tensors split by tensor parallelism
  offload::LambConstants c_{};
  double lr_ = 0.0;
  SliceStats stats_;
  std::vector<double> trust_;
  std::vector<float> step_;  // per tensor: lr x trust ratio
  // State in device memory: the backend, and its ||p||^2 and ||u||^2 per tensor and owned slice
  // (backend memory, added to by each run of pass 0; read once per step in end_pass).
  Backend* device_ = nullptr;
  Buffer sums_;
  std::vector<double> sums_host_;
};

}  // namespace zero
