// The error-compensated 1-bit momentum exchange that OneBitAdam and OneBitLamb share (Tang et al.
// 2021; Li et al. 2021; DeepSpeed's compressed_allreduce), composed with ZeRO stages 1 and 2: the
// server side of the exchange is the rank that owns the slice.
//
// Each rank folds its own (unreduced) gradient into the shared momentum, m_w = b1 m + (1-b1) g_w,
// adds its worker error, and sends one sign bit per element and one scale (the RMS) per slice of
// every unit to the slice's owner; the owner averages the workers' decoded messages, adds its
// server error, compresses again and all-gathers the result, which every rank decodes into the
// shared momentum of the next step. The owner's decoded slice is this step's momentum (new_m).
//
// The shared momentum is kept on every rank as the last exchange's bits and scales (1 bit per
// element); the worker error (4 bytes per element of the whole model) and the server error (4
// per owned element) are this rank's own and are reset on resume, as DeepSpeed does. The first
// exchange (and the first after a resume) starts from the owned fp32 momentum, captured by a
// visit of the owned state and all-gathered.
//
// An optional coefficient per tensor multiplies the momentum the exchange carries (OneBitLamb's
// scaling_coeff, which evens out the tensors' magnitudes before they share a scale): the shared
// momentum and new_m are then in the scaled form.
#pragma once

#include <cstdint>
#include <vector>

#include "optim/optimizer.hpp"

namespace zero {

class OneBitExchange {
 public:
  explicit OneBitExchange(const OptimizerEnv& env);
  // The shared momentum of the last exchange is at hand; when not, the optimizer asks for a
  // capture visit (Optimizer::wants_capture) before the next exchange.
  bool shared_valid() const { return shared_valid_; }
  // A capture visit's run: its owned momentum (r.state[0], unscaled).
  void capture(const OptimRun& r);
  // The errors start again from zero and the next exchange from a capture (a resume without
  // this rank's state: another world size, an older checkpoint).
  void reset();
  // This rank's own state, for the checkpoint's per-rank record: per unit the worker error, the
  // server error, and the last exchange's scales and bits (the bits 4 to a float), then 1 when
  // an exchange has run (else every value is 0). Empty at world size 1, which keeps none.
  // set_state() takes what state() gave at the same world size and slicing ({}: reset()).
  std::size_t state_size() const;
  std::vector<float> state() const;
  void set_state(const std::vector<float>& s);
  // Host bytes it keeps from its first exchange on, for units of `slices` elements per rank
  // slice over `world` ranks: the worker and server errors, the shared momentum's bits and
  // scales, this step's owned momentum, the decoded shared momentum of the largest unit, and the
  // messages' send and receive buffers (zero-plan counts them: optimizer_buffer_bytes). bytes():
  // what it holds now, the same after an exchange.
  static std::int64_t bytes_for(const std::vector<std::int64_t>& slices, int world);
  std::int64_t bytes() const;
  // One step's exchange of every unit's padded local gradient `full` (the accumulation dtype),
  // scaled by grad_scale; `coeff`, when not null, holds one multiplier per tensor (global index).
  // Four collectives a step whatever the units: one all-to-all of the bits (and one of their
  // scales) to the owners, one all-gather of the owners' bits (and one of their scales).
  void exchange(const std::vector<const void*>& full, DType type, float b1, float grad_scale,
                const std::vector<float>* coeff);
  // This step's momentum of the owned slice of unit u (scaled form when coeff was given).
  const float* new_m(int unit) const { return units_[static_cast<std::size_t>(unit)].new_m.data(); }

 private:
  struct Unit {
    std::int64_t numel = 0;
    std::vector<float> worker_error, server_error;  // padded unit; owned slice
    std::vector<std::uint8_t> bits;                 // the last exchange's result, every slice
    std::vector<float> scales;                      // its scale per slice
    std::vector<float> owned_m, new_m;              // captured momentum; this step's, owned slice
  };
  // A run of a unit's elements [begin, end) whose momentum the coefficient `coeff` multiplies.
  struct Span {
    std::size_t begin, end;
    float coeff;
  };
  std::vector<Span> spans(std::size_t k, const std::vector<float>* coeff) const;
  std::size_t slice(std::size_t k) const { return static_cast<std::size_t>(env_.slice[k]); }
  // The real (not padding) elements of unit k's slice c.
  std::size_t real(std::size_t k, std::size_t c) const;

  OptimizerEnv env_;
  std::vector<int> first_;  // per unit: the global index of its first tensor
  std::vector<Unit> units_;
  bool shared_valid_ = false;
  std::vector<float> shared_, send_scales_, recv_scales_;
  std::vector<std::uint8_t> send_bits_, recv_bits_;
};

}  // namespace zero
