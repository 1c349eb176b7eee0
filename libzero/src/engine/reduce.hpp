// GradReducer: gradient storage and its reduction over ranks in buckets.
//
// The backward adds each micro-step's gradient into grads(u); ready(u) says it is complete.
// Ready units are coalesced until reduce_bucket_size elements are pending, then handed to the
// collectives together. They sum; the average's 1/world is applied in fp32 by step() (an average
// in bf16/fp16 rounds 1/world to the data type, which biases every gradient by the same relative
// error, e.g. +0.195% for bf16 at 3 ranks):
//   stage 0: all-reduce (sum over ranks) of the full gradient, at the accumulation boundary;
//   (stages 1-3 with reduce_scatter: false all-reduce instead of reduce-scatter, as DeepSpeed
//   does, and keep the owned slice: more traffic, the same result;)
//   stage 1: reduce-scatter at the boundary; the rank's slice is copied back into its range;
//   stages 2/3: every micro-step, reduce-scatter of the micro-step's gradient buffer, added into
//               the rank's gradient slice; the full-size buffer then goes back to the pool;
//   deferred (PowerSGD, stages 0/1): nothing at the boundary; the step reduces full() itself.
// With MiCS (mics_shard_size) the collectives above run inside the rank's group of N ranks, and
// all_reduce_replicas() then sums each owned slice over the ranks at the same position in the
// other groups, once per step, after the last micro-step: the slow links carry the accumulated
// slice once, not every micro-step's.
// With overlap_comm the bucket's collectives run while the backward continues and are waited
// on only when their buffers are needed (two buckets in flight, then the oldest is completed);
// without it each bucket completes before ready() returns. What the optimizer reads is owned(u):
// the summed gradient of the rank's owned range, once wait_all() has returned.
//
// The accumulated gradient's dtype (data_types.grad_accum_dtype) is the compute dtype or fp32.
// With fp32 the backward still writes each micro-step's gradient in the compute dtype, into a
// pooled buffer (grads(u)), which is added into fp32 storage in fp32: at stages 0 and 1 at
// ready(u), into the full fp32 gradient (the boundary's collective then reduces fp32); at
// stages 2 and 3 after the micro-step's reduce-scatter (still in the compute dtype), into the
// fp32 slice. A 16-bit sum of many micro-steps keeps few bits of the later ones; fp32 keeps them.
// The fp32 reduction at stages 0/1 sends twice the bytes of bf16: with communication_data_type
// set to the 16-bit compute dtype, each rank's fp32 sum is rounded to it once into a scratch
// copy, that copy is reduced (summed in the compute dtype, as stages 2/3 reduce), and the owned
// range of the result is widened back into the fp32 gradient. MiCS's replica sum stays fp32.
//
// qgZ (zero_quantized_gradients, stages 2/3): each micro-step's reduce-scatter is the
// hierarchical quantized one (engine/quantized_reduce_scatter.hpp), summed in fp32, rounded once
// to the compute dtype (as a plain reduce-scatter's sum is) unless gradients accumulate in fp32.
// Each unit keeps its error-feedback buffers here, between steps; checkpoints save them.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <vector>

#include "backend/backend.hpp"
#include "engine/quantized_reduce_scatter.hpp"
#include "engine/reduce_buffers.hpp"
#include "engine/unit_shape.hpp"
#include "zero/comm.hpp"
#include "zero/config.hpp"
#include "zero/engine.hpp"
#include "zero/layout.hpp"

namespace zero {

class GradReducer {
 public:
  // How it reduces, besides what (the units' shapes) and over whom (the communicator).
  struct Options {
    ZeroOptimizationConfig zero;    // reduce_bucket_size, overlap_comm, reduce_scatter
    DType dtype = DType::f32;       // the compute dtype grads() hands out
    DType grad_dtype = DType::f32;  // what gradients accumulate in
    // What stages 0/1 reduce in (communication_data_type): grad_dtype, or the compute dtype the
    // fp32 sum is rounded to once, just before the reduction.
    DType comm_dtype = DType::f32;
    int stage = 0;
    // Stages 0/1 with gradient compression: the boundary starts no collective; the step
    // reduces the full gradients (full()) itself, as PowerSGD does (engine/powersgd.hpp).
    bool deferred = false;
    Communicator* replica = nullptr;        // MiCS's replica group, or null
    QuantizedReduceScatter* qgz = nullptr;  // qgZ, or null: plain reduce-scatter
  };
  GradReducer(Backend& backend, Communicator& comm, const Layout& layout, const std::vector<UnitShape>& shapes,
              const Options& opts);
  ~GradReducer();  // completes collectives still in flight: they reference our buffers

  void* grads(int unit);  // where the backward adds this micro-step's gradient
  // grads() is the step's accumulating buffer (stages 0/1 in the compute dtype): it holds the
  // sum of the micro-steps so far, not one micro-step's gradient.
  bool grads_accumulate() const { return !buffers().pooled_micro(); }
  int times_reduced(int unit) const;  // ready() calls since the last clear()
  // unit's gradient of this micro-step is complete; boundary: the step's last micro-step.
  // Returns true when it completes the micro-step (every unit ready; the last bucket flushed).
  bool ready(int unit, bool boundary);
  bool mid_micro_step() const { return reduced_this_micro_ != 0 || !pending_.empty(); }
  int reduced_this_micro() const { return reduced_this_micro_; }
  void wait_all();  // every bucket reduced and accumulated
  // MiCS: after wait_all() at the step's end, the owned slices summed over the replica group
  // (every data-parallel rank's gradient then counts once); nothing without MiCS.
  void all_reduce_replicas();
  void* owned(int unit);                                   // the gradient values the optimizer reads (owned range)
  void* full(int unit) { return state(unit).full.get(); }  // stages 0/1: the padded unit
  // Deferred: the boundary reduces nothing, the step reduces full() itself (PowerSGD, and the
  // optimizers that exchange the local gradients: Optimizer::local_gradients). Between steps.
  void set_deferred(bool deferred) { deferred_ = deferred && stage_ <= 1; }
  bool deferred() const { return deferred_; }
  DType grad_dtype() const { return gdt_; }  // owned()'s dtype
  void clear();                              // zero the gradients for the next step
  void report(MemoryReport& r) const;        // gradient storage and the staging buffers' peak
  // qgZ's error-feedback values, every unit's (intra then inter, unit by unit), read from the
  // backend's memory; empty when off. set_error_feedback writes them back (empty: zeros) and
  // throws unless `v` is empty or holds error_feedback_size() values.
  std::vector<float> error_feedback() const;
  std::size_t error_feedback_size() const;
  void set_error_feedback(const std::vector<float>& v);
  // After step(): zero the error feedback (drop), or multiply it by `rescale` (a new loss scale).
  void adjust_error_feedback(bool drop, double rescale);

 private:
  struct Unit {
    Buffer full;      // accumulation dtype, padded (stages 0 and 1)
    Buffer slice;     // accumulation dtype, slice (stages 2 and 3)
    Buffer micro;     // compute dtype: this micro-step's full-size gradient (stages 2/3, or
                      // stages 0/1 accumulating in another dtype)
    int reduced = 0;  // ready() calls since the last clear()
  };
  // Collectives in flight with what to do on completion.
  struct InFlight {
    std::vector<Work> works;
    std::vector<std::function<void()>> finish;
  };
  void flush_bucket();
  void flush_rounded(int unit, InFlight& f);
  void wait_in_flight(std::size_t keep);
  std::size_t esize() const { return dtype_size(dtype_); }
  // What it keeps and takes from its pools per unit, the rules zero-plan counts with.
  ReduceBuffers buffers() const {
    return {.stage = stage_,
            .dtype = dtype_,
            .grad_dtype = gdt_,
            .reduce_scatter = z_.reduce_scatter,
            .quantized = qgz_ != nullptr,
            .deferred = deferred_,
            .comm_dtype = cdt_};
  }
  // Unit ids index the per-unit vectors.
  Unit& state(int unit) { return unit_at(units_, unit); }
  const Unit& state(int unit) const { return unit_at(units_, unit); }
  const UnitShape& shape(int unit) const { return unit_at(shapes_, unit); }

  Backend& backend_;
  Communicator& comm_;
  Communicator* replica_;  // MiCS's replica group, or null
  const Layout& layout_;   // unit names, for the collective check's messages
  const std::vector<UnitShape>& shapes_;
  const ZeroOptimizationConfig z_;
  DType dtype_, gdt_, cdt_;
  int stage_;
  bool deferred_;
  std::vector<Unit> units_;
  BufferPool grad_pool_, scratch_pool_;
  std::vector<int> pending_;  // ready units not yet handed to a collective
  std::int64_t pending_elems_ = 0;
  int reduced_this_micro_ = 0;
  std::deque<InFlight> in_flight_;
  QuantizedReduceScatter* qgz_;                             // null: plain reduce-scatter
  std::vector<QuantizedReduceScatter::Feedback> feedback_;  // qgZ: per unit
};

}  // namespace zero
