#include "cuda/offload_staging.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <string>

#include "cuda/cuda_check.hpp"
#include "zero/error.hpp"

namespace zero::cuda {

namespace {

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A timing event from `pool`, created the first time slot `i` is used and reused by later steps.
Event& timing_event(std::vector<Event>& pool, std::size_t i) {
  while (pool.size() <= i) pool.push_back(Event::create(true));
  return pool[i];
}

}  // namespace

// The timeline's working state: events stay with the staging from step to step; the times are
// read only in finish(), after both copy streams are drained.
struct CudaOffloadStaging::Trace {
  OffloadTimeline* sink = nullptr;
  Event origin;
  double origin_s = 0;
  std::vector<std::vector<Event>> chunk_events;  // per range: start, end of each chunk's copy
  std::vector<Event> param_events;               // start, end of each parameter copy, in order
  std::size_t params_used = 0;                   // param_events used by this step
  struct Pending {
    std::size_t first_chunk = 0, last_chunk = 0;
    bool d2h = false;
    std::size_t param_event = 0;  // index of the copy's start event, when h2d
    bool h2d = false;
  };
  std::vector<Pending> pending;  // one per sink->groups entry

  double host_ms(double t) const { return (t - origin_s) * 1e3; }
  double device_ms(const Event& e) const {
    float ms = 0.0f;
    ZERO_CUDA_CHECK(cudaEventElapsedTime(&ms, origin.get(), e.get()));
    return ms;
  }
};

CudaOffloadStaging::CudaOffloadStaging(StreamSet& streams, offload::PinnedPool& pool) : streams_(streams), pool_(pool) {
  ready_ = Event::create();
  done_ = Event::create();
}

CudaOffloadStaging::~CudaOffloadStaging() {
  // Copies may still read or write the pinned buffers.
  if (streams_.copy) cudaStreamSynchronize(streams_.copy);
  if (streams_.upload) cudaStreamSynchronize(streams_.upload);
}

void CudaOffloadStaging::begin(std::size_t grad_esize, std::size_t param_esize, std::size_t chunk) {
  ZERO_CHECK(grad_esize > 0 && param_esize > 0 && chunk > 0,
             "OffloadStaging::begin: element sizes and chunk must be positive");
  count_ = 0;
  gesize_ = grad_esize;
  esize_ = param_esize;
  chunk_ = chunk;
  stream_after(streams_.copy, streams_.compute, ready_.get());
  stream_after(streams_.upload, streams_.compute, ready_.get());
  // A sink set (or removed) since the last step takes effect here, at a step's start.
  active_ = nullptr;
  if (sink_) {
    if (!trace_) {
      trace_ = std::make_unique<Trace>();
      trace_->origin = Event::create(true);
    }
    trace_->sink = sink_;
    active_ = trace_.get();
    // The step's gradients are final when the copy stream passes the origin. The engine has
    // just waited for the gradient statistics, so this wait costs next to nothing.
    Trace& t = *active_;
    const double recorded_s = steady_seconds();
    ZERO_CUDA_CHECK(cudaEventRecord(t.origin.get(), streams_.copy));
    ZERO_CUDA_CHECK(cudaEventSynchronize(t.origin.get()));
    t.origin_s = steady_seconds();
    t.params_used = 0;
    t.pending.clear();
    t.sink->groups.clear();
    t.sink->origin_s = t.origin_s;
    t.sink->origin_uncertainty = (t.origin_s - recorded_s) * 1e3;
    t.sink->finish = 0;
  }
}

void CudaOffloadStaging::add(const void* grads, void* params, std::size_t n) {
  if (count_ == ranges_.size()) ranges_.emplace_back();
  Range& r = ranges_[count_++];
  r.dev_grads = static_cast<const char*>(grads);
  r.dev_params = static_cast<char*>(params);
  r.n = n;
  const std::size_t bytes = n * esize_, grad_bytes = n * gesize_;
  if (r.grads.capacity() < grad_bytes || r.params.capacity() < bytes) {
    // Sizes change only if the model does; the old buffers may still be read by copies.
    ZERO_CUDA_CHECK(cudaStreamSynchronize(streams_.copy));
    ZERO_CUDA_CHECK(cudaStreamSynchronize(streams_.upload));
    r.grads = pool_.acquire(grad_bytes);
    r.params = pool_.acquire(bytes);
  }
  const std::size_t chunks = (n + chunk_ - 1) / chunk_;
  while (r.chunk_done.size() < chunks) r.chunk_done.push_back(Event::create());
  std::vector<Event>* timing = nullptr;
  if (active_) {
    if (active_->chunk_events.size() < count_) active_->chunk_events.resize(count_);
    timing = &active_->chunk_events[count_ - 1];
  }
  for (std::size_t c = 0; c < chunks; ++c) {
    const std::size_t off = c * chunk_ * gesize_, len = std::min(chunk_, n - c * chunk_) * gesize_;
    if (timing) ZERO_CUDA_CHECK(cudaEventRecord(timing_event(*timing, 2 * c).get(), streams_.copy));
    ZERO_CUDA_CHECK(
        cudaMemcpyAsync(r.grads.as<char>() + off, r.dev_grads + off, len, cudaMemcpyDefault, streams_.copy));
    ZERO_CUDA_CHECK(cudaEventRecord(r.chunk_done[c].get(), streams_.copy));
    if (timing) ZERO_CUDA_CHECK(cudaEventRecord(timing_event(*timing, 2 * c + 1).get(), streams_.copy));
  }
}

CudaOffloadStaging::Range& CudaOffloadStaging::range(std::size_t r, std::size_t begin, std::size_t n, const char* who) {
  ZERO_CHECK(r < count_ && begin + n <= ranges_[r].n,
             fmt::format("OffloadStaging::{}: range {} [{}, {}) was not declared by add() in this step", who, r, begin,
                         begin + n));
  return ranges_[r];
}

const void* CudaOffloadStaging::host_grads(std::size_t r, std::size_t begin, std::size_t n) {
  Range& rg = range(r, begin, n, "host_grads");
  const double wait_start = active_ ? steady_seconds() : 0.0;
  if (n > 0)
    for (std::size_t c = begin / chunk_; c <= (begin + n - 1) / chunk_; ++c)
      ZERO_CUDA_CHECK(cudaEventSynchronize(rg.chunk_done[c].get()));
  if (active_ && n > 0) {
    Trace& t = *active_;
    OffloadTimeline::Group g;
    g.range = r;
    g.begin = begin;
    g.n = n;
    g.wait_start = t.host_ms(wait_start);
    g.host_start = t.host_ms(steady_seconds());
    g.host_end = g.host_start;
    t.sink->groups.push_back(g);
    Trace::Pending p;
    p.first_chunk = begin / chunk_;
    p.last_chunk = (begin + n - 1) / chunk_;
    p.d2h = true;
    t.pending.push_back(p);
  }
  return rg.grads.as<char>() + begin * gesize_;
}

void* CudaOffloadStaging::host_params(std::size_t r, std::size_t begin) {
  return range(r, begin, 0, "host_params").params.as<char>() + begin * esize_;
}

void CudaOffloadStaging::params_ready(std::size_t r, std::size_t begin, std::size_t n) {
  Range& rg = range(r, begin, n, "params_ready");
  if (n == 0) return;
  const std::size_t off = begin * esize_;
  Event* copy_start = nullptr;
  Event* copy_end = nullptr;
  if (active_) {
    Trace& t = *active_;
    const double host_end = t.host_ms(steady_seconds());
    // The group host_grads opened for this sub-range (the engine's order: host_grads, the
    // host step, params_ready); a range with no such group gets one of its own.
    std::size_t k = t.pending.size();
    auto opened = [&](std::size_t i) {
      const OffloadTimeline::Group& g = t.sink->groups[i];
      return g.range == r && g.begin == begin && !t.pending[i].h2d;
    };
    while (k > 0 && !opened(k - 1)) --k;
    if (k == 0) {
      OffloadTimeline::Group g;
      g.range = r;
      g.begin = begin;
      g.n = n;
      g.wait_start = g.host_start = host_end;
      t.sink->groups.push_back(g);
      t.pending.emplace_back();
      k = t.pending.size();
    }
    t.sink->groups[k - 1].host_end = host_end;
    t.pending[k - 1].h2d = true;
    t.pending[k - 1].param_event = t.params_used;
    // Both events exist before either is addressed: creating one may move the others.
    timing_event(t.param_events, t.params_used + 1);
    copy_start = &t.param_events[t.params_used];
    copy_end = &t.param_events[t.params_used + 1];
    t.params_used += 2;
  }
  if (copy_start) ZERO_CUDA_CHECK(cudaEventRecord(copy_start->get(), streams_.upload));
  ZERO_CUDA_CHECK(
      cudaMemcpyAsync(rg.dev_params + off, rg.params.as<char>() + off, n * esize_, cudaMemcpyDefault, streams_.upload));
  if (copy_end) ZERO_CUDA_CHECK(cudaEventRecord(copy_end->get(), streams_.upload));
}

void CudaOffloadStaging::finish() {
  // The compute stream next zeroes the gradients (read by the D2H copies) and reads the
  // parameters (written by the H2D copies): it waits for both streams.
  stream_after(streams_.compute, streams_.copy, done_.get());
  stream_after(streams_.compute, streams_.upload, done_.get());
  if (active_) {
    Trace& t = *active_;
    t.sink->finish = t.host_ms(steady_seconds());
    ZERO_CUDA_CHECK(cudaStreamSynchronize(streams_.copy));
    ZERO_CUDA_CHECK(cudaStreamSynchronize(streams_.upload));
    for (std::size_t k = 0; k < t.pending.size(); ++k) {
      const Trace::Pending& p = t.pending[k];
      OffloadTimeline::Group& g = t.sink->groups[k];
      if (p.d2h) {
        const std::vector<Event>& ev = t.chunk_events[g.range];
        g.d2h_start = t.device_ms(ev[2 * p.first_chunk]);
        g.d2h_end = t.device_ms(ev[2 * p.last_chunk + 1]);
      }
      if (p.h2d) {
        g.h2d_start = t.device_ms(t.param_events[p.param_event]);
        g.h2d_end = t.device_ms(t.param_events[p.param_event + 1]);
      }
    }
    active_ = nullptr;  // the sink is complete; the caller may read or drop it now
  }
}

void CudaOffloadStaging::set_timeline(OffloadTimeline* sink) { sink_ = sink; }

// Every range's buffers, kept across steps (their sizes change only if the model does).
std::int64_t CudaOffloadStaging::host_bytes() const {
  std::size_t bytes = 0;
  for (const Range& r : ranges_) bytes += r.grads.size() + r.params.size();
  return static_cast<std::int64_t>(bytes);
}

}  // namespace zero::cuda
