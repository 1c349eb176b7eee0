// Stage-3 parameter gathering.
//
// The first micro-step records the order in which units are gathered (forward, then backward).
// Every later micro-step must repeat it: each gather is checked against the recorded position,
// so a changed graph is an immediate error on the rank that changed, never a collective that
// waits forever. Knowing the order lets the engine all-gather ahead: after each gather, units
// next in the order are started until stage3_prefetch_bucket_size elements are in flight,
// never exceeding stage3_max_live_parameters gathered elements. A released unit whose next
// use (cyclically, across micro-steps) is within stage3_max_reuse_distance elements is kept.
#include <string>

#include "engine_impl.hpp"
#include "zero/error.hpp"

namespace zero {

std::int64_t EngineImpl::live_elements() const {
  std::int64_t n = 0;
  for (const auto& u : units_)
    if (u.gathered) n += u.padded;
  return n;
}

void EngineImpl::start_gather(int unit) {
  Unit& u = units_[static_cast<std::size_t>(unit)];
  u.gathered = gather_pool_.acquire(static_cast<std::size_t>(u.padded) * esize(), false);
  checkout_shard(unit, true);  // NVMe: read the slice now, ahead of the gather
  u.gather_work = comm_->all_gather_async(shard(u), u.gathered.get(), static_cast<std::size_t>(u.slice), dtype_);
}

void EngineImpl::finish_gather(int unit) {
  Unit& u = units_[static_cast<std::size_t>(unit)];
  if (!u.gather_work.pending()) return;
  u.gather_work.wait();
  checkin_shard(unit, false);
}

void EngineImpl::set_eval(bool on) {
  ZERO_CHECK(!on || (micro_ == 0 && reduced_this_micro_ == 0 && pos_ == 0),
             "set_eval(true) in the middle of a training micro-step; evaluate between steps");
  eval_mode_ = on;
}

UnitParams EngineImpl::gather(int unit) {
  check_unit(unit, "gather");
  Unit& u = units_[static_cast<std::size_t>(unit)];
  if (stage_ == 3 && !eval_mode_) {
    if (recording_) {
      order_.push_back(unit);
    } else {
      std::size_t expect_pos = pos_ % order_.size();
      int expected = order_[expect_pos];
      if (expected != unit)
        ZERO_THROW("gather order changed: gather #" + std::to_string(pos_ + 1) + " of this micro-step asked for unit '" +
                   layout_.unit(unit).name + "' but the order recorded in the first micro-step has '" +
                   layout_.unit(expected).name + "' there (" + std::to_string(order_.size()) +
                   " gathers per micro-step). Stage 3 prefetches along the recorded order, so every micro-step "
                   "must gather the same units in the same order; use set_eval(true) for forward-only passes");
    }
    ++pos_;
  }
  if (!u.sharded_params) return UnitParams(this, unit, u.full_params.get(), u.token);

  if (!u.gathered) {
    // Make room: drop kept (unreferenced) units, furthest first would be ideal; any is correct.
    std::int64_t limit = cfg_.zero_optimization.stage3_max_live_parameters;
    for (auto& other : units_) {
      if (live_elements() + u.padded <= limit) break;
      if (other.gathered && other.refs == 0 && !other.gather_work.pending()) gather_pool_.give_back(std::move(other.gathered));
    }
    start_gather(unit);
  }
  finish_gather(unit);
  ++u.refs;
  if (!eval_mode_ && !recording_) prefetch_after(pos_);
  return UnitParams(this, unit, u.gathered.get(), u.token);
}

void EngineImpl::prefetch_after(std::size_t pos) {
  const auto& z = cfg_.zero_optimization;
  std::int64_t in_flight = 0;
  for (const auto& u : units_)
    if (u.gather_work.pending()) in_flight += u.padded;
  std::int64_t live = live_elements();
  // Look ahead along the recorded order (cyclically: the next micro-step starts over).
  for (std::size_t k = 0; k < order_.size(); ++k) {
    int next = order_[(pos + k) % order_.size()];
    Unit& n = units_[static_cast<std::size_t>(next)];
    if (!n.sharded_params || n.gathered) continue;
    if (in_flight + n.padded > z.stage3_prefetch_bucket_size) break;
    if (live + n.padded > z.stage3_max_live_parameters) break;
    start_gather(next);
    in_flight += n.padded;
    live += n.padded;
  }
}

void EngineImpl::release(int unit, std::uint64_t token) {
  Unit& u = units_[static_cast<std::size_t>(unit)];
  if (!u.sharded_params || token != u.token || u.refs == 0) return;
  if (--u.refs > 0) return;
  // Keep it if it is needed again soon: distance = elements gathered before its next use.
  bool keep = false;
  if (!eval_mode_ && !recording_ && !order_.empty()) {
    std::int64_t distance = 0;
    for (std::size_t k = 0; k < order_.size(); ++k) {
      int next = order_[(pos_ + k) % order_.size()];
      if (next == unit) {
        keep = distance <= cfg_.zero_optimization.stage3_max_reuse_distance;
        break;
      }
      distance += units_[static_cast<std::size_t>(next)].padded;
    }
  }
  if (!keep) {
    gather_pool_.give_back(std::move(u.gathered));
    ++u.token;
  }
}

void EngineImpl::drop_gathered() {
  for (auto& u : units_) {
    finish_gather(static_cast<int>(&u - units_.data()));
    if (u.gathered) {
      ZERO_CHECK(u.refs == 0, "step(): unit '" + layout_.unit(static_cast<int>(&u - units_.data())).name +
                                  "' is still held by a UnitParams handle; release gathered units before step()");
      gather_pool_.give_back(std::move(u.gathered));
    }
    ++u.token;
  }
}

void EngineImpl::finish_micro_step_order() {
  if (stage_ != 3) return;
  if (!recording_ && pos_ != order_.size())
    ZERO_THROW("gather order changed: this micro-step gathered " + std::to_string(pos_) +
               " units but the first micro-step gathered " + std::to_string(order_.size()));
  recording_ = false;
  pos_ = 0;
}

}  // namespace zero
