#include "cuda/streams.hpp"

#include <algorithm>

#include <thread>

#include "cuda/cuda_check.hpp"

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

}  // namespace zero::cuda
