// Gradient reduction in buckets.
//
// reduce(u) says u's gradient for this micro-step is complete. Ready units are coalesced until
// reduce_bucket_size elements are pending, then handed to the collectives together. They sum;
// the average's 1/world is applied in fp32 by step() (an average in bf16/fp16 rounds 1/world
// to the data type, which biases every gradient by the same relative error, e.g. +0.195% for
// bf16 at 3 ranks):
//   stage 0: all-reduce (sum over ranks) of the full gradient, at the accumulation boundary;
//   (stages 1-3 with reduce_scatter: false all-reduce instead of reduce-scatter, as DeepSpeed
//   does, and keep the owned slice: more traffic, the same result;)
//   stage 1: reduce-scatter at the boundary; the rank's slice is copied back into its range;
//   stages 2/3: every micro-step, reduce-scatter of the micro-step's gradient buffer, added into
//               the rank's gradient slice; the full-size buffer then goes back to the pool.
// With overlap_comm the bucket's collectives run while the backward continues and are waited
// on only when their buffers are needed (two buckets in flight, then the oldest is completed);
// without it each bucket completes before reduce() returns.
#include <string>

#include "engine_impl.hpp"
#include "zero/error.hpp"

namespace zero {

UnitGrads EngineImpl::grads(int unit) {
  check_unit(unit, "grads");
  ZERO_CHECK(!eval_mode_, "grads(): the engine is in eval mode (set_eval(true)); gradients exist only in training");
  Unit& u = units_[static_cast<std::size_t>(unit)];
  const UnitInfo& ui = layout_.unit(unit);
  ZERO_CHECK(u.reduced == micro_,
             "grads(): unit '" + ui.name + "' was already reduced in this micro-step; ask for grads before reduce()");
  ZERO_CHECK(micro_ < gas_, "grads(): all " + std::to_string(gas_) +
                                " micro-steps of gradient_accumulation_steps are done; call step() first");
  if (stage_ <= 1) return UnitGrads(&ui, u.full_grads.get(), dtype_);
  if (!u.micro_grads) u.micro_grads = grad_pool_.acquire(static_cast<std::size_t>(u.padded) * esize(), true);
  return UnitGrads(&ui, u.micro_grads.get(), dtype_);
}

void EngineImpl::reduce(int unit) {
  check_unit(unit, "reduce");
  ZERO_CHECK(!eval_mode_, "reduce(): the engine is in eval mode (set_eval(true))");
  Unit& u = units_[static_cast<std::size_t>(unit)];
  const std::string& name = layout_.unit(unit).name;
  ZERO_CHECK(micro_ < gas_, "reduce(): unit '" + name + "' reduced after all " + std::to_string(gas_) +
                                " micro-steps of gradient_accumulation_steps; call step() first");
  ZERO_CHECK(u.reduced == micro_, "reduce(): unit '" + name + "' was reduced twice in micro-step " +
                                      std::to_string(micro_ + 1) + "; call reduce() once per unit per micro-step");
  ++u.reduced;
  ++reduced_this_micro_;
  bool boundary = micro_ == gas_ - 1;
  if (stage_ >= 2 || boundary) {
    if (stage_ >= 2 && !u.micro_grads)  // no gradient was written: it is zero
      u.micro_grads = grad_pool_.acquire(static_cast<std::size_t>(u.padded) * esize(), true);
    pending_.push_back(unit);
    pending_elems_ += u.padded;
    if (pending_elems_ >= cfg_.zero_optimization.reduce_bucket_size) flush_bucket();
  }
  if (reduced_this_micro_ == layout_.num_units()) {
    flush_bucket();
    finish_micro_step_order();
    reduced_this_micro_ = 0;
    ++micro_;
  }
}

void EngineImpl::flush_bucket() {
  if (pending_.empty()) return;
  InFlight f;
  // One communicator group per bucket: NCCL launches the bucket's collectives together.
  CommGroup group(*comm_);
  for (int unit : pending_) {
    Unit& u = units_[static_cast<std::size_t>(unit)];
    std::size_t slice_bytes = static_cast<std::size_t>(u.slice) * esize();
    if (stage_ == 0) {
      f.works.push_back(comm_->all_reduce_async(u.full_grads.get(), static_cast<std::size_t>(u.padded), dtype_, ReduceOp::sum));
    } else if (stage_ == 1) {
      if (!cfg_.zero_optimization.reduce_scatter) {  // all-reduce in place: the owned range is already there
        f.works.push_back(
            comm_->all_reduce_async(u.full_grads.get(), static_cast<std::size_t>(u.padded), dtype_, ReduceOp::sum));
        continue;
      }
      auto out = std::make_shared<Buffer>(scratch_pool_.acquire(slice_bytes, false));
      f.works.push_back(comm_->reduce_scatter_async(u.full_grads.get(), out->get(), static_cast<std::size_t>(u.slice),
                                                    dtype_, ReduceOp::sum));
      f.finish.push_back([this, &u, out, slice_bytes] {
        backend_->copy(own_grads(u), out->get(), slice_bytes);
        scratch_pool_.give_back(std::move(*out));
      });
    } else {
      auto out = std::make_shared<Buffer>(scratch_pool_.acquire(slice_bytes, false));
      auto src = std::make_shared<Buffer>(std::move(u.micro_grads));
      const char* reduced = out->as<char>();
      if (cfg_.zero_optimization.reduce_scatter) {
        f.works.push_back(comm_->reduce_scatter_async(src->get(), out->get(), static_cast<std::size_t>(u.slice), dtype_,
                                                      ReduceOp::sum));
      } else {
        f.works.push_back(comm_->all_reduce_async(src->get(), static_cast<std::size_t>(u.padded), dtype_, ReduceOp::sum));
        reduced = src->as<char>() + static_cast<std::size_t>(u.own_begin) * esize();
      }
      f.finish.push_back([this, &u, out, src, reduced] {
        backend_->accumulate(u.grad_slice.get(), reduced, dtype_, static_cast<std::size_t>(u.slice));
        scratch_pool_.give_back(std::move(*out));
        grad_pool_.give_back(std::move(*src));
      });
    }
  }
  group.end();  // before any wait: a group's Work can be waited on only once it is closed
  pending_.clear();
  pending_elems_ = 0;
  in_flight_.push_back(std::move(f));
  wait_in_flight(cfg_.zero_optimization.overlap_comm ? 1 : 0);
}

void EngineImpl::wait_in_flight(std::size_t keep) {
  while (in_flight_.size() > keep) {
    InFlight& f = in_flight_.front();
    for (auto& w : f.works) w.wait();
    for (auto& fin : f.finish) fin();
    in_flight_.pop_front();
  }
}

}  // namespace zero
