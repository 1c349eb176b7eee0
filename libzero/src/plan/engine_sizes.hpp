// The engine's own size rules, as zero-plan asks them: the partition of every unit, the gradient
// reducer's, PowerSGD's and qgZ's buffers. The planner calls these instead of restating them;
// the plan-vs-engine tests keep the results equal.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/powersgd.hpp"
#include "engine/quantized_reduce_scatter.hpp"
#include "engine/reduce_buffers.hpp"
#include "engine/unit_shape.hpp"
#include "zero/plan/plan.hpp"

namespace zero::plan {

// Every unit split over the ranks the model states are sharded over (MiCS's group, else the
// data-parallel group), as the engine splits it: rank 0's shapes, whose sizes every rank shares.
inline std::vector<UnitShape> unit_shapes(const Layout& layout, const Settings& s, int data_parallel) {
  return make_unit_shapes(layout, 0, s.shard_ranks(data_parallel), s.stage, s.persistence_threshold);
}

// The reducer's rules for these settings, as the engine derives them from its Config
// (GradReducer::buffers): PowerSGD defers the stage-0/1 reduction to the step; the 1-bit
// optimizers keep the gradients whole at stage 2 as at stage 1, and defer the reduction when
// they exchange from the first update on (freeze_step 0).
inline ReduceBuffers reduce_buffers(const Settings& s) {
  const bool onebit = compressed_momentum(s.optimizer.type);
  return {.stage = onebit ? std::min(s.stage, 1) : s.stage,
          .dtype = s.dtype,
          .grad_dtype = s.grad_dtype(),
          .reduce_scatter = s.reduce_scatter,
          .quantized = s.quantized_gradients,
          .deferred = (s.powersgd() && s.stage <= 1) || (onebit && s.optimizer.freeze_step < 1),
          .comm_dtype = s.comm_dtype()};
}

// PowerSGD's buffers for these elements (PowerSgd::buffer_bytes, less its fixed conversion row).
inline std::int64_t powersgd_buffer_bytes(const PowerSgdElements& e, const Settings& s) {
  return static_cast<std::int64_t>(PowerSgd::buffer_bytes_for(
      {.compressed = e.compressed, .p = e.p, .q = e.q, .plain = e.plain}, s.grad_dtype(), s.compression.factor_dtype));
}

// qgZ's error feedback for a unit of `slice` elements per rank over `ranks` ranks, in bytes
// (QuantizedReduceScatter::make_feedback). Its total, (L - 1) M + (M - 1) = L M - 1 slices, does
// not depend on how the ranks split into M nodes of L, so one node of them all gives it.
inline std::int64_t qgz_feedback_bytes(std::int64_t slice, int ranks) {
  const auto n = static_cast<std::size_t>(slice), L = static_cast<std::size_t>(ranks);
  return static_cast<std::int64_t>((QuantizedReduceScatter::intra_feedback_elements(L, 1, n) +
                                    QuantizedReduceScatter::inter_feedback_elements(1, n)) *
                                   sizeof(float));
}

}  // namespace zero::plan
