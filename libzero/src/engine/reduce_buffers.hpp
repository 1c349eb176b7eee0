// ReduceBuffers: what the gradient reducer keeps and takes from its pools for one unit, and when.
// GradReducer allocates by these rules and zero-plan counts with them (plan/engine_sizes.hpp),
// so the plan's gradient and communication buffers are the engine's by construction.
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/unit_shape.hpp"
#include "zero/dtype.hpp"

namespace zero {

struct ReduceBuffers {
  int stage = 0;
  DType dtype = DType::f32;       // the compute dtype: grads() and the micro-step buffers
  DType grad_dtype = DType::f32;  // what gradients accumulate in
  bool reduce_scatter = true;     // zero_optimization.reduce_scatter
  bool quantized = false;         // qgZ's reduce-scatter (zero_quantized_gradients)
  bool deferred = false;          // stages 0/1 under gradient compression: the step reduces
  // What stages 0/1 reduce the accumulated gradient in (communication_data_type): grad_dtype,
  // or the 16-bit compute dtype it is rounded to just before the reduction.
  DType comm_dtype = DType::f32;

  // Stages 0/1 accumulating in a dtype other than the compute dtype: grads() is a micro-step
  // buffer from the pool, added into the accumulated gradient and given back at ready().
  bool separate_micro() const { return stage <= 1 && grad_dtype != dtype; }
  // grads() hands out a pooled micro-step buffer (else the accumulated gradient itself). At
  // stages 2/3 it stays out until the unit's reduction completes.
  bool pooled_micro() const { return stage >= 2 || separate_micro(); }
  // ready() queues the unit for a collective: every micro-step at stages 2/3, at the step's
  // last micro-step at stages 0/1, never when deferred.
  bool reduces(bool boundary) const { return stage >= 2 || (boundary && !deferred); }

  // Stages 0/1 reduce a rounded copy of the accumulated gradient, in comm_dtype.
  bool rounded_reduction() const { return stage <= 1 && comm_dtype != grad_dtype; }

  // The accumulated gradient kept between steps: the padded unit at stages 0/1, the rank's slice
  // at stages 2/3, in the accumulation dtype.
  std::int64_t stored_elements(const UnitShape& s) const { return stage <= 1 ? s.padded : s.slice; }
  std::size_t stored_bytes(const UnitShape& s) const {
    return static_cast<std::size_t>(stored_elements(s)) * dtype_size(grad_dtype);
  }
  // A micro-step gradient from the pool: the padded unit in the compute dtype.
  std::size_t micro_bytes(const UnitShape& s) const { return static_cast<std::size_t>(s.padded) * dtype_size(dtype); }
  // The scratch one reduction of the unit holds from its start to its completion (0: none):
  // stage 1's reduce-scattered slice in the accumulation dtype (none when it all-reduces in
  // place); stages 2/3's reduced slice in the compute dtype, with qgZ its fp32 sum before it.
  // A rounded reduction (stages 0/1) holds the padded unit in comm_dtype, reduced in place,
  // and after it stage 1's reduce-scattered slice in comm_dtype.
  std::size_t scratch_bytes(const UnitShape& s) const {
    const auto slice = static_cast<std::size_t>(s.slice);
    if (rounded_reduction()) {
      const bool scatters = stage == 1 && reduce_scatter;
      return (static_cast<std::size_t>(s.padded) + (scatters ? slice : 0)) * dtype_size(comm_dtype);
    }
    if (stage == 0) return 0;
    if (stage == 1) return reduce_scatter ? slice * dtype_size(grad_dtype) : 0;
    return slice * ((quantized ? sizeof(float) : 0) + dtype_size(dtype));
  }
};

// The reducer hands its pending units to the collectives once they hold reduce_bucket_size
// elements (padded), and the rest when the micro-step's last unit is ready.
inline bool bucket_full(std::int64_t pending_elements, std::int64_t reduce_bucket_size) {
  return pending_elements >= reduce_bucket_size;
}

}  // namespace zero
