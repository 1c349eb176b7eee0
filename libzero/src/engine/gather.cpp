// Stage-3 parameter gathering (see engine/gather.hpp).
#include "engine/gather.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "comm/quantize.hpp"
#include "zero/error.hpp"

namespace zero {

ParamGatherer::ParamGatherer(Backend& backend, Communicator& comm, ParamStore& params, const Layout& layout,
                             const std::vector<UnitShape>& shapes, const Options& opts)
    : backend_(backend),
      comm_(comm),
      params_(params),
      layout_(layout),
      shapes_(shapes),
      z_(opts.zero),
      dtype_(opts.dtype),
      pool_(backend),
      units_(shapes.size()),
      hpz_(opts.hpz),
      qwz_block_(opts.zero.zero_quantized_weights
                     ? static_cast<std::size_t>(opts.zero.zero_quantized_weights_block_size)
                     : 0) {}

std::int64_t ParamGatherer::secondary_bytes() const {
  std::int64_t n = 0;
  for (const auto& u : units_)
    if (u.secondary) n += static_cast<std::int64_t>(u.secondary.bytes());
  return n;
}

ParamGatherer::~ParamGatherer() {
  try {
    for (auto& u : units_) u.work.wait();
  } catch (...) {
  }
}

std::int64_t ParamGatherer::live_elements() const {
  std::int64_t n = 0;
  for (std::size_t i = 0; i < units_.size(); ++i)
    if (units_[i].gathered) n += shapes_[i].padded;
  return n;
}

int ParamGatherer::held_unit() const {
  for (std::size_t i = 0; i < units_.size(); ++i)
    if (units_[i].refs > 0) return static_cast<int>(i);
  return -1;
}

void ParamGatherer::start(int unit, const char* why, bool eval) {
  const CommSiteScope site(why, &layout_.unit(unit).name, eval);
  Unit& u = state(unit);
  const UnitShape& s = shape(unit);
  u.gathered = pool_.acquire(static_cast<std::size_t>(s.padded) * dtype_size(dtype_), false);
  u.from_secondary = hpz_ != nullptr && u.secondary_valid;
  if (u.from_secondary) {
    const std::size_t chunk = static_cast<std::size_t>(s.padded / hpz_->size());
    u.work = hpz_->all_gather_async(u.secondary.get(), u.gathered.get(), chunk, dtype_);
  } else if (qwz_block_ > 0) {
    params_.checkout(unit, true);
    const std::size_t packed = quant::packed_bytes(static_cast<std::size_t>(s.slice), qwz_block_);
    u.q_send = pool_.acquire(packed, false);
    u.q_recv = pool_.acquire(packed * static_cast<std::size_t>(comm_.size()), false);
    backend_.quantize_int8(params_.shard(unit), dtype_, static_cast<std::size_t>(s.slice), qwz_block_, u.q_send.get());
    // Packed bytes travel as fp32 words: the all-gather copies them, it computes nothing.
    u.work = comm_.all_gather_async(u.q_send.get(), u.q_recv.get(), packed / sizeof(float), DType::f32);
  } else {
    params_.checkout(unit, true);  // NVMe: read the slice now, ahead of the gather
    u.work = comm_.all_gather_async(params_.shard(unit), u.gathered.get(), static_cast<std::size_t>(s.slice), dtype_);
  }
  ++all_gathers_;
}

void ParamGatherer::finish(int unit) {
  Unit& u = state(unit);
  if (!u.work.pending()) return;
  u.work.wait();
  if (u.from_secondary) return;
  params_.checkin(unit, false);
  if (u.q_recv) {  // qwZ: every rank's packed slice into the compute dtype
    const UnitShape& s = shape(unit);
    const std::size_t slice = static_cast<std::size_t>(s.slice);
    backend_.dequantize_int8(u.q_recv.get(), static_cast<std::size_t>(comm_.size()), slice, qwz_block_,
                             u.gathered.get(), dtype_);  // one launch for every rank's slice
    pool_.give_back(std::move(u.q_send));
    pool_.give_back(std::move(u.q_recv));
  }
  if (hpz_ != nullptr) {  // keep this rank's chunk for the group's later gathers
    const UnitShape& s = shape(unit);
    const std::size_t bytes = static_cast<std::size_t>(s.padded / hpz_->size()) * dtype_size(dtype_);
    if (!u.secondary) u.secondary = backend_.alloc(bytes);
    backend_.copy(u.secondary.get(), u.gathered.as<char>() + static_cast<std::size_t>(hpz_->rank()) * bytes, bytes);
    u.secondary_valid = true;
  }
}

void ParamGatherer::check_order(int unit) {
  if (recording_) {
    order_.push_back(unit);
  } else {
    std::size_t expect_pos = pos_ % order_.size();
    int expected = order_[expect_pos];
    if (expected != unit)
      ZERO_THROW(
          fmt::format("gather order changed: gather #{} of this micro-step asked for unit '{}' but the order "
                      "recorded in the first micro-step has '{}' there ({} gathers per micro-step). Stage 3 "
                      "prefetches along the recorded order, so every micro-step must gather the same units in "
                      "the same order; use set_eval(true) for forward-only passes",
                      pos_ + 1, layout_.unit(unit).name, layout_.unit(expected).name, order_.size()));
  }
  ++pos_;
}

ParamGatherer::Lease ParamGatherer::acquire(int unit, bool training, bool wrap) {
  Unit& u = state(unit);
  const UnitShape& s = shape(unit);
  if (training) check_order(unit);
  if (!s.sharded_params) return Lease{params_.full(unit), u.token};

  if (!u.gathered) {
    // Make room: drop kept (unreferenced) units, furthest first would be ideal; any is correct.
    for (std::size_t i = 0; i < units_.size(); ++i) {
      if (live_elements() + s.padded <= z_.stage3_max_live_parameters) break;
      Unit& other = units_[i];
      if (other.gathered && other.refs == 0 && !other.work.pending()) pool_.give_back(std::move(other.gathered));
    }
    start(unit, "gather", !training);
  }
  finish(unit);
  ++u.refs;
  if (training && !recording_) prefetch_after(pos_, wrap);
  return Lease{u.gathered.get(), u.token};
}

void ParamGatherer::prefetch_after(std::size_t pos, bool wrap) {
  std::int64_t in_flight = 0;
  for (std::size_t i = 0; i < units_.size(); ++i)
    if (units_[i].work.pending()) in_flight += shapes_[i].padded;
  std::int64_t live = live_elements();
  // Look ahead along the recorded order; past its end only when the next micro-step follows.
  const std::size_t ahead = wrap ? order_.size() : order_.size() - std::min(pos, order_.size());
  for (std::size_t k = 0; k < ahead; ++k) {
    int next = order_[(pos + k) % order_.size()];
    Unit& n = state(next);
    const UnitShape& ns = shape(next);
    if (!ns.sharded_params || n.gathered) continue;
    if (in_flight + ns.padded > z_.stage3_prefetch_bucket_size) break;
    if (live + ns.padded > z_.stage3_max_live_parameters) break;
    start(next, "prefetch", false);
    in_flight += ns.padded;
    live += ns.padded;
  }
}

void ParamGatherer::release(int unit, std::uint64_t token, bool training) {
  Unit& u = state(unit);
  if (!shape(unit).sharded_params || token != u.token || u.refs == 0) return;
  if (--u.refs > 0) return;
  // Keep it if it is needed again soon: distance = elements gathered before its next use.
  bool keep = false;
  if (training && !recording_ && !order_.empty()) {
    std::int64_t distance = 0;
    for (std::size_t k = 0; k < order_.size(); ++k) {
      int next = order_[(pos_ + k) % order_.size()];
      if (next == unit) {
        keep = distance <= z_.stage3_max_reuse_distance;
        break;
      }
      distance += shape(next).padded;
    }
  }
  if (!keep) {
    pool_.give_back(std::move(u.gathered));
    ++u.token;
  }
}

void ParamGatherer::hold_all() {
  // Start every all-gather first, then wait: the collectives overlap one another.
  for (std::size_t i = 0; i < units_.size(); ++i) {
    if (shapes_[i].sharded_params && !units_[i].gathered) start(static_cast<int>(i), "gather_all", true);
  }
  for (std::size_t i = 0; i < units_.size(); ++i) {
    if (!shapes_[i].sharded_params) continue;
    finish(static_cast<int>(i));
    ++units_[i].refs;
  }
  holding_all_ = true;
}

void ParamGatherer::release_all() {
  if (!holding_all_) return;
  holding_all_ = false;
  for (std::size_t i = 0; i < units_.size(); ++i)
    if (shapes_[i].sharded_params) release(static_cast<int>(i), units_[i].token, false);
}

void ParamGatherer::drop_all(const char* what) {
  for (std::size_t i = 0; i < units_.size(); ++i) {
    Unit& u = units_[i];
    finish(static_cast<int>(i));
    if (u.gathered) {
      ZERO_CHECK(u.refs == 0, std::string(what) + ": unit '" + layout_.unit(static_cast<int>(i)).name +
                                  "' is still held by a UnitParams handle; release gathered units before step()");
      pool_.give_back(std::move(u.gathered));
    }
    u.secondary_valid = false;  // the parameters are about to change; the buffer stays for the next step
    ++u.token;
  }
}

void ParamGatherer::finish_micro_step() {
  if (!recording_ && pos_ != order_.size())
    ZERO_THROW(
        fmt::format("gather order changed: this micro-step gathered {} units but the first micro-step gathered {}",
                    pos_, order_.size()));
  recording_ = false;
  pos_ = 0;
}

}  // namespace zero
