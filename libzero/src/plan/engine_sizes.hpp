// The engine's own size rules, as zero-plan asks them: the partition of every unit
// (engine/unit_shape.hpp) and the gradient reducer's buffers (engine/reduce_buffers.hpp). The
// planner calls these instead of restating them; the plan-vs-engine tests keep the results equal.
#pragma once

#include <vector>

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
// (GradReducer::buffers): PowerSGD defers the stage-0/1 reduction to the step.
inline ReduceBuffers reduce_buffers(const Settings& s) {
  return {.stage = s.stage,
          .dtype = s.dtype,
          .grad_dtype = s.grad_dtype(),
          .reduce_scatter = s.reduce_scatter,
          .quantized = s.quantized_gradients,
          .deferred = s.powersgd() && s.stage <= 1,
          .comm_dtype = s.comm_dtype()};
}

}  // namespace zero::plan
