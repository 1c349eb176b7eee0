// Gradient reduction in buckets (see engine/reduce.hpp).
#include "engine/reduce.hpp"

#include <fmt/format.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "zero/error.hpp"

namespace zero {

GradReducer::GradReducer(Backend& backend, Communicator& comm, const Layout& layout,
                         const std::vector<UnitShape>& shapes, const Options& opts)
    : backend_(backend),
      comm_(comm),
      replica_(opts.replica),
      layout_(layout),
      shapes_(shapes),
      z_(opts.zero),
      dtype_(opts.dtype),
      gdt_(opts.grad_dtype),
      cdt_(opts.comm_dtype),
      stage_(opts.stage),
      deferred_(opts.deferred && opts.stage <= 1),
      units_(shapes.size()),
      grad_pool_(backend),
      scratch_pool_(backend),
      qgz_(opts.qgz) {
  ZERO_CHECK(gdt_ == dtype_ || gdt_ == DType::f32,
             "GradReducer: gradients accumulate in the compute dtype or in fp32 (data_types.grad_accum_dtype)");
  ZERO_CHECK(cdt_ == gdt_ || (gdt_ == DType::f32 && cdt_ == dtype_),
             "GradReducer: stages 0 and 1 reduce in the accumulation dtype or, from fp32, in the compute dtype "
             "(communication_data_type)");
  for (std::size_t i = 0; i < shapes_.size(); ++i)
    (stage_ <= 1 ? units_[i].full : units_[i].slice) = backend_.alloc(buffers().stored_bytes(shapes_[i]));
  if (qgz_) {
    ZERO_CHECK(stage_ >= 2 && z_.reduce_scatter, "GradReducer: qgZ needs stage 2 or 3 with reduce_scatter");
    for (const auto& s : shapes_) feedback_.push_back(qgz_->make_feedback(static_cast<std::size_t>(s.slice)));
  }
}

GradReducer::~GradReducer() {
  try {
    for (auto& f : in_flight_)
      for (auto& w : f.works) w.wait();
  } catch (...) {
  }
}

void* GradReducer::grads(int unit) {
  Unit& u = state(unit);
  if (!buffers().pooled_micro()) return u.full.get();
  if (!u.micro) u.micro = grad_pool_.acquire(buffers().micro_bytes(shape(unit)), true);
  return u.micro.get();
}

int GradReducer::times_reduced(int unit) const { return state(unit).reduced; }

bool GradReducer::ready(int unit, bool boundary) {
  Unit& u = state(unit);
  ++u.reduced;
  ++reduced_this_micro_;
  if (buffers().separate_micro() && u.micro) {
    // Into the fp32 sum now, so the micro buffer goes back to the pool for the next unit.
    backend_.accumulate(u.full.get(), gdt_, u.micro.get(), dtype_, static_cast<std::size_t>(shape(unit).padded));
    grad_pool_.give_back(std::move(u.micro));
  }
  if (buffers().reduces(boundary)) {
    // Stages 2/3: no gradient was written means it is zero. Not at stages 0/1, whose gradients
    // are in full() already: a micro-step buffer taken here would stay out through the step.
    if (stage_ >= 2) (void)grads(unit);
    pending_.push_back(unit);
    pending_elems_ += shape(unit).padded;
    if (bucket_full(pending_elems_, z_.reduce_bucket_size)) flush_bucket();
  }
  if (reduced_this_micro_ < static_cast<int>(units_.size())) return false;
  flush_bucket();
  reduced_this_micro_ = 0;
  return true;
}

void GradReducer::flush_bucket() {
  if (pending_.empty()) return;
  InFlight f;
  // One communicator group per bucket: NCCL launches the bucket's collectives together. Not
  // with qgZ, whose all-to-alls run on its own communicators: an NCCL group is open for the
  // whole thread, not for one communicator, so it would hold them back until group.end(),
  // after their completion events were recorded, and their Works would not wait for them.
  std::optional<CommGroup> group;
  if (!qgz_) group.emplace(comm_);
  for (int unit : pending_) {
    const CommSiteScope site("reduce", &layout_.unit(unit).name);
    Unit& u = state(unit);
    const UnitShape& s = shape(unit);
    const std::size_t scratch_bytes = buffers().scratch_bytes(s);
    if (buffers().rounded_reduction()) {
      flush_rounded(unit, f);
    } else if (stage_ == 0) {
      f.works.push_back(comm_.all_reduce_async(u.full.get(), static_cast<std::size_t>(s.padded), gdt_, ReduceOp::sum));
    } else if (stage_ == 1) {
      if (!z_.reduce_scatter) {  // all-reduce in place: the owned range is already there
        f.works.push_back(
            comm_.all_reduce_async(u.full.get(), static_cast<std::size_t>(s.padded), gdt_, ReduceOp::sum));
        continue;
      }
      auto out = std::make_shared<Buffer>(scratch_pool_.acquire(scratch_bytes, false));
      f.works.push_back(
          comm_.reduce_scatter_async(u.full.get(), out->get(), static_cast<std::size_t>(s.slice), gdt_, ReduceOp::sum));
      f.finish.push_back([this, unit, out, scratch_bytes] {
        backend_.copy(owned(unit), out->get(), scratch_bytes);
        scratch_pool_.give_back(std::move(*out));
      });
    } else if (qgz_) {
      auto src = std::make_shared<Buffer>(std::move(u.micro));
      // fp32 sum, then (16-bit gradients) its rounding to the compute dtype after it.
      const std::size_t n = static_cast<std::size_t>(s.slice);
      auto sum = std::make_shared<Buffer>(scratch_pool_.acquire(scratch_bytes, false));
      f.works.push_back(qgz_->start(src->get(), dtype_, n, unit_at(feedback_, unit), sum->as<float>()));
      f.finish.push_back([this, &u, n, sum, src] {
        if (gdt_ == DType::f32) {
          backend_.accumulate(u.slice.get(), gdt_, sum->get(), DType::f32, n);
        } else {
          char* rounded = sum->as<char>() + n * sizeof(float);
          backend_.convert(sum->get(), DType::f32, rounded, dtype_, n);
          backend_.accumulate(u.slice.get(), gdt_, rounded, dtype_, n);
        }
        scratch_pool_.give_back(std::move(*sum));
        grad_pool_.give_back(std::move(*src));
      });
    } else {
      auto out = std::make_shared<Buffer>(scratch_pool_.acquire(scratch_bytes, false));
      auto src = std::make_shared<Buffer>(std::move(u.micro));
      const char* reduced = out->as<char>();
      if (z_.reduce_scatter) {
        f.works.push_back(comm_.reduce_scatter_async(src->get(), out->get(), static_cast<std::size_t>(s.slice), dtype_,
                                                     ReduceOp::sum));
      } else {
        f.works.push_back(
            comm_.all_reduce_async(src->get(), static_cast<std::size_t>(s.padded), dtype_, ReduceOp::sum));
        reduced = src->as<char>() + static_cast<std::size_t>(s.own_begin) * esize();
      }
      f.finish.push_back([this, &u, &s, out, src, reduced] {
        backend_.accumulate(u.slice.get(), gdt_, reduced, dtype_, static_cast<std::size_t>(s.slice));
        scratch_pool_.give_back(std::move(*out));
        grad_pool_.give_back(std::move(*src));
      });
    }
  }
  if (group) group->end();  // before any wait: a group's Work can be waited on only once it is closed
  pending_.clear();
  pending_elems_ = 0;
  in_flight_.push_back(std::move(f));
  wait_in_flight(z_.overlap_comm ? 1 : 0);
}

// Stages 0/1 with communication_data_type: the fp32 sum rounded once to cdt_, reduced in cdt_
// (an all-reduce in place, or a reduce-scatter into the slice after it), and widened back into
// the fp32 gradient.
void GradReducer::flush_rounded(int unit, InFlight& f) {
  Unit& u = state(unit);
  const UnitShape& s = shape(unit);
  const auto padded = static_cast<std::size_t>(s.padded), slice = static_cast<std::size_t>(s.slice);
  auto wire = std::make_shared<Buffer>(scratch_pool_.acquire(buffers().scratch_bytes(s), false));
  backend_.convert(u.full.get(), gdt_, wire->get(), cdt_, padded);
  // What comes back: stage 1's slice into the owned range, or the whole all-reduced unit (as the
  // fp32 all-reduce leaves it).
  const char* reduced = wire->as<char>();
  void* into = u.full.get();
  std::size_t n = padded;
  if (stage_ == 1 && z_.reduce_scatter) {
    char* out = wire->as<char>() + padded * dtype_size(cdt_);
    f.works.push_back(comm_.reduce_scatter_async(wire->get(), out, slice, cdt_, ReduceOp::sum));
    reduced = out;
    into = owned(unit);
    n = slice;
  } else {
    f.works.push_back(comm_.all_reduce_async(wire->get(), padded, cdt_, ReduceOp::sum));
  }
  f.finish.push_back([this, wire, reduced, into, n] {
    backend_.convert(reduced, cdt_, into, gdt_, n);
    scratch_pool_.give_back(std::move(*wire));
  });
}

void GradReducer::wait_in_flight(std::size_t keep) {
  while (in_flight_.size() > keep) {
    InFlight& f = in_flight_.front();
    for (auto& w : f.works) w.wait();
    for (auto& fin : f.finish) fin();
    in_flight_.pop_front();
  }
}

void GradReducer::wait_all() { wait_in_flight(0); }

void GradReducer::all_reduce_replicas() {
  if (replica_ == nullptr) return;
  std::vector<Work> works;
  {
    CommGroup group(*replica_);
    for (int unit = 0; unit < layout_.num_units(); ++unit) {
      const CommSiteScope site("reduce across MiCS groups", &layout_.unit(unit).name);
      works.push_back(
          replica_->all_reduce_async(owned(unit), static_cast<std::size_t>(shape(unit).own_len), gdt_, ReduceOp::sum));
    }
    group.end();
  }
  for (auto& w : works) w.wait();
}

void* GradReducer::owned(int unit) {
  Unit& u = state(unit);
  if (stage_ <= 1) return u.full.as<char>() + static_cast<std::size_t>(shape(unit).own_begin) * dtype_size(gdt_);
  return u.slice.get();
}

void GradReducer::clear() {
  for (std::size_t i = 0; i < units_.size(); ++i) {
    Unit& u = units_[i];
    backend_.zero((stage_ <= 1 ? u.full : u.slice).get(), buffers().stored_bytes(shapes_[i]));
    u.reduced = 0;
  }
}

void GradReducer::report(MemoryReport& r) const {
  for (const auto& s : shapes_) r.grads += static_cast<std::int64_t>(buffers().stored_bytes(s));
  // Every pool counts what it has held from the backend, freed buffers kept for reuse included
  // (a freed buffer serves only a request of its own size, so units of different sizes leave
  // some beside those in use): that is the memory the backend gave up, on a device its HBM.
  // qgZ's packed messages and partial sums come from its own pool.
  r.qgz_buffers = qgz_ ? qgz_->scratch_bytes() : 0;
  r.comm_buffers = grad_pool_.held_peak() + scratch_pool_.held_peak() + r.qgz_buffers;
  r.error_feedback += static_cast<std::int64_t>(error_feedback_size() * sizeof(float));
}

void GradReducer::adjust_error_feedback(bool drop, double rescale) {
  if (!drop && rescale == 1.0) return;
  if (drop) {
    set_error_feedback({});
    return;
  }
  // A new loss scale (rare: fp16 only); the values make a round trip through the host, which
  // on a device waits for the stream once.
  const float f = static_cast<float>(rescale);  // scales are powers of two: exact
  std::vector<float> v = error_feedback();
  for (float& x : v) x *= f;
  set_error_feedback(v);
}

std::size_t GradReducer::error_feedback_size() const {
  std::size_t n = 0;
  for (const auto& f : feedback_) n += f.intra_n + f.inter_n;
  return n;
}

std::vector<float> GradReducer::error_feedback() const {
  std::vector<float> all(error_feedback_size());
  std::size_t at = 0;
  for (const auto& f : feedback_) {
    backend_.to_host(all.data() + at, f.intra.get(), f.intra_n * sizeof(float));
    at += f.intra_n;
    backend_.to_host(all.data() + at, f.inter.get(), f.inter_n * sizeof(float));
    at += f.inter_n;
  }
  return all;
}

void GradReducer::set_error_feedback(const std::vector<float>& v) {
  ZERO_CHECK(
      v.empty() || v.size() == error_feedback_size(),
      fmt::format("set_rank_state: {} values for qgZ's error-feedback buffers of {}", v.size(), error_feedback_size()));
  std::size_t at = 0;
  for (auto& f : feedback_) {
    for (auto [buf, n] : {std::pair{&f.intra, f.intra_n}, std::pair{&f.inter, f.inter_n}}) {
      if (v.empty())
        backend_.zero(buf->get(), n * sizeof(float));
      else
        backend_.from_host(buf->get(), v.data() + at, n * sizeof(float));
      at += n;
    }
  }
}

}  // namespace zero
