#include "cuda/streams.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <thread>

#include "cuda/cuda_check.hpp"
#include "zero/error.hpp"

namespace zero::cuda {

Stream Stream::create(bool high_priority) {
  int least = 0, greatest = 0;
  ZERO_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  Stream s;
  ZERO_CUDA_CHECK(cudaStreamCreateWithPriority(&s.s_, cudaStreamNonBlocking, high_priority ? greatest : least));
  return s;
}

void Stream::reset() noexcept {
  // Destroying a stream with work pending is allowed: the work completes, then the stream goes.
  if (s_) cudaStreamDestroy(s_);
  s_ = nullptr;
}

Event Event::create(bool with_timing) {
  Event e;
  ZERO_CUDA_CHECK(cudaEventCreateWithFlags(&e.e_, with_timing ? cudaEventDefault : cudaEventDisableTiming));
  return e;
}

void Event::reset() noexcept {
  if (e_) cudaEventDestroy(e_);
  e_ = nullptr;
}

void stream_after(cudaStream_t waiter, cudaStream_t producer, cudaEvent_t scratch) {
  if (waiter == producer) return;
  ZERO_CUDA_CHECK(cudaEventRecord(scratch, producer));
  ZERO_CUDA_CHECK(cudaStreamWaitEvent(waiter, scratch, 0));
}

bool stream_drain(cudaStream_t s, double timeout_s) {
  using Clock = std::chrono::steady_clock;
  const auto limit = std::chrono::duration<double>(std::min(timeout_s, 1e9));  // 1e9 s: "never"
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(limit);
  for (;;) {
    const cudaError_t q = cudaStreamQuery(s);
    if (q == cudaSuccess) return true;
    if (q != cudaErrorNotReady) {
      cudaGetLastError();
      return false;
    }
    if (timeout_s > 0.0 && Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

void refuse_capture(cudaStream_t s, const char* what) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaError_t rc = cudaStreamIsCapturing(s, &status);
  // The legacy stream answers "implicit" while a blocking stream captures: a collective ordered
  // after it would join (and break) that capture just the same.
  const bool implicit = rc == cudaErrorStreamCaptureImplicit;
  if (implicit)
    cudaGetLastError();
  else
    ZERO_CUDA_CHECK(rc);
  if (!implicit && status == cudaStreamCaptureStatusNone) return;
  ZERO_THROW(fmt::format(
      "{}: the compute stream is being captured into a CUDA graph ({}); libzero's collectives cannot be captured, "
      "because the collective watchdog tracks each one's completion on the device and a graph replay would bypass "
      "it. End the capture before engine.gather / reduce / step (or any Communicator call) and capture only the "
      "kernels between them",
      what,
      implicit                                  ? "another stream's capture includes the legacy default stream"
      : status == cudaStreamCaptureStatusActive ? "cudaStreamBeginCapture is active"
                                                : "the capture was invalidated"));
}

}  // namespace zero::cuda
