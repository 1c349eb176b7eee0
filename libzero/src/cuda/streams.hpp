// Streams and events of the CUDA backend, as move-only RAII handles, and the three streams the
// backend orders its work on.
//
//   compute: the user's kernels and the backend's own (fills, casts, optimizer, statistics).
//            The legacy default stream unless the user sets theirs, so a loop that launches on
//            stream 0 is ordered with the engine without doing anything.
//   comm:    collectives. Non-blocking (no implicit ordering with the legacy stream, which
//            would serialize communication with compute) and high priority (a collective that
//            is ready should not queue behind compute kernels).
//   copy:    offload copies from device memory to pinned host memory (D2H: gradients out);
//   upload:  offload copies from pinned host memory to device memory (H2D: parameters back).
//            Two streams, so the copy engines run both directions at once: the parameters of
//            sub-group k go back while the gradients of k+1 onwards still come out.
// The streams are ordered only by events: a collective's stream waits for the compute stream
// at the call, and the compute stream waits for the collective's completion event at
// Work::wait(). No stream or device synchronization happens in gather, reduce or step except
// where a value must reach the host (the gradient statistics, once per step).
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <chrono>
#include <utility>

namespace zero::cuda {

class Stream {
 public:
  Stream() = default;
  // A new non-blocking stream; high_priority takes the device's greatest priority.
  static Stream create(bool high_priority);
  Stream(Stream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  Stream& operator=(Stream&& o) noexcept {
    if (this != &o) {
      reset();
      s_ = std::exchange(o.s_, nullptr);
    }
    return *this;
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream() { reset(); }
  cudaStream_t get() const { return s_; }

 private:
  void reset() noexcept;
  cudaStream_t s_ = nullptr;
};

class Event {
 public:
  Event() = default;
  // Without timing (cheaper to record and wait on); with_timing for benchmarks.
  static Event create(bool with_timing = false);
  Event(Event&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  Event& operator=(Event&& o) noexcept {
    if (this != &o) {
      reset();
      e_ = std::exchange(o.e_, nullptr);
    }
    return *this;
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event() { reset(); }
  cudaEvent_t get() const { return e_; }

 private:
  void reset() noexcept;
  cudaEvent_t e_ = nullptr;
};

// The backend's streams. Communicators and the offload staging hold a reference, so a compute
// stream set later by the user is seen by all of them.
struct StreamSet {
  cudaStream_t compute = cudaStreamLegacy;
  cudaStream_t comm = nullptr;
  cudaStream_t copy = nullptr;
  cudaStream_t upload = nullptr;
  // Every stream the backend enqueues on (drains at shutdown and before freeing memory).
  std::array<cudaStream_t, 4> all() const { return {compute, comm, copy, upload}; }
};

// Makes `waiter` wait for everything enqueued on `producer` so far, through `scratch` (an event
// re-recorded at each call: a wait binds to the record made just before it).
void stream_after(cudaStream_t waiter, cudaStream_t producer, cudaEvent_t scratch);

// Waits, polling, until `s` has no pending work or `timeout_s` seconds have passed (0: no
// deadline). Returns false on timeout, or when the stream reports an error (the work is then
// lost anyway). For teardown and the allocator's trim, where a stream stuck behind a collective
// whose peers are gone must not hang the process the way cudaStreamSynchronize would.
bool stream_drain(cudaStream_t s, double timeout_s);

// Throws when `s` is being captured into a CUDA graph (or, for the legacy stream, when a blocking
// stream it would synchronize with is). Called by the communicators before a collective touches
// the streams: a captured collective would be recorded into the graph instead of run, its
// completion event would never fire outside a replay, and the watchdog's ticket for it would
// stay open forever, leaving every later collective unchecked. `what` names the collective.
void refuse_capture(cudaStream_t s, const char* what);

}  // namespace zero::cuda
