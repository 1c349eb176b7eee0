// CudaOffloadStaging: the CUDA backend's OffloadStaging (see backend/backend.hpp for the protocol).
//
// At begin() the copy (D2H) and upload (H2D) streams wait for the compute stream (the step's
// gradients are final); each add() then enqueues its range's gradient copies to pinned host
// memory on the copy stream, one per sub-group-sized chunk, each followed by an event.
// host_grads() waits only for the events of the chunks it returns, so the host AdamW of
// sub-group k overlaps the copies of k+1 onwards. params_ready() enqueues the updated
// parameters' copy back on the upload stream, which runs alongside the gradient copies still
// coming out, and finish() makes the compute stream wait for both streams (the next forward or
// the all-gather of updated parameters), without a host wait.
//
// Reusing the pinned buffers next step is safe without further events: finish() ordered the
// compute stream after this step's uploads, and the next begin() orders the copy stream after
// the compute stream, so when the host has waited for any gradient chunk of the next step,
// every parameter copy of this step has finished reading its host buffer.
//
// With a timeline sink set (set_timeline, for benchmarks) each chunk copy and each parameter copy
// is bracketed by timing events and each host_grads / params_ready call is stamped on the host;
// without one, every hot-path call pays a single null test.
#pragma once

#include <memory>
#include <vector>

#include "backend/backend.hpp"
#include "cuda/streams.hpp"
#include "offload/pinned_pool.hpp"

namespace zero::cuda {

class CudaOffloadStaging final : public OffloadStaging {
 public:
  CudaOffloadStaging(StreamSet& streams, offload::PinnedPool& pool);
  ~CudaOffloadStaging() override;

  void begin(std::size_t grad_esize, std::size_t param_esize, std::size_t chunk) override;
  void add(const void* grads, void* params, std::size_t n) override;
  const void* host_grads(std::size_t r, std::size_t begin, std::size_t n) override;
  void* host_params(std::size_t r, std::size_t begin) override;
  void params_ready(std::size_t r, std::size_t begin, std::size_t n) override;
  void finish() override;
  void set_timeline(OffloadTimeline* sink) override;
  std::int64_t host_bytes() const override;

 private:
  struct Trace;
  struct Range {
    const char* dev_grads = nullptr;
    char* dev_params = nullptr;
    std::size_t n = 0;
    offload::PinnedBuffer grads, params;
    std::vector<Event> chunk_done;
  };
  Range& range(std::size_t r, std::size_t begin, std::size_t n, const char* who);

  StreamSet& streams_;
  offload::PinnedPool& pool_;
  std::vector<Range> ranges_;  // kept across steps, with their buffers and events
  // Element sizes of the parameters (esize_) and of the gradients (gesize_, the accumulation dtype).
  std::size_t count_ = 0, gesize_ = 0, esize_ = 0, chunk_ = 1;
  Event ready_, done_;
  OffloadTimeline* sink_ = nullptr;  // set_timeline's; applies from the next begin()
  std::unique_ptr<Trace> trace_;     // created by the first traced step, kept for its events
  Trace* active_ = nullptr;          // trace_ from a traced step's begin() to its finish()
};

}  // namespace zero::cuda
