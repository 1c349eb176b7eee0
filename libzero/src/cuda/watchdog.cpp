#include "cuda/watchdog.hpp"

#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <optional>

#include "comm/collective_timeout.hpp"
#include "runtime/log.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/watchdog_report.hpp"
#include "zero/error.hpp"

namespace zero::cuda {

namespace {

// While another thread captures a stream into a CUDA graph (global capture mode), a query from
// this thread is an illegal call that invalidates the capture, and the error it returns says so.
// The thread switches to relaxed capture mode at start, and a capture error still counts as
// "not complete yet": the event is queried again at the next poll.
bool capture_error(cudaError_t e) {
  return e == cudaErrorStreamCaptureUnsupported || e == cudaErrorStreamCaptureInvalidated ||
         e == cudaErrorStreamCaptureImplicit || e == cudaErrorStreamCaptureWrongThread || e == cudaErrorCapturedEvent ||
         e == cudaErrorStreamCaptureIsolation;
}

}  // namespace

Watchdog::Watchdog(WatchdogOptions o) : o_(std::move(o)), ring_(kSlots) {
  ZERO_CHECK(o_.timeout_s >= 0.0 && o_.poll_s > 0.0, "Watchdog: the timeout must be >= 0 and the poll interval > 0");
  o_.timeout_s = std::min(o_.timeout_s, 1e9);  // ~30 years: "never", without overflowing the clock
  for (auto& s : ring_) ZERO_CUDA_CHECK(cudaEventCreateWithFlags(&s.event, cudaEventDisableTiming));
  thread_ = std::thread([this] { run(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  for (auto& s : ring_)
    if (s.event) cudaEventDestroy(s.event);
}

double Watchdog::timeout_from_env() { return collective_timeout_s(); }

void Watchdog::retire_completed_locked(int limit) {
  for (int k = 0; k < limit && tail_ < head_; ++k) {
    if (cudaEventQuery(ring_[tail_ % kSlots].event) != cudaSuccess) break;
    ++tail_;
  }
}

std::uint64_t Watchdog::record(cudaStream_t stream, const char* what, std::size_t bytes, int ops) {
  std::unique_lock<std::mutex> lock(mu_);
  retire_completed_locked(8);  // keeps the ring drained between the watchdog's polls
  while (head_ - tail_ >= kSlots) {
    // kSlots collectives in flight: the oldest must finish before its slot is reused. Wait
    // unlocked, so the watchdog thread can still report it if it never finishes.
    const std::uint64_t oldest = tail_;
    cudaEvent_t ev = ring_[oldest % kSlots].event;
    lock.unlock();
    ZERO_CUDA_CHECK(cudaEventSynchronize(ev));
    lock.lock();
    if (tail_ == oldest) ++tail_;
  }
  const std::uint64_t t = head_;
  Slot& s = ring_[t % kSlots];
  ZERO_CUDA_CHECK(cudaEventRecord(s.event, stream));
  s.ticket = t;
  s.what = what;
  s.bytes = bytes;
  s.ops = ops;
  s.enqueued = Clock::now();
  s.deadline = s.enqueued + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o_.timeout_s));
  ++head_;
  return t;
}

void Watchdog::stream_wait(cudaStream_t stream, std::uint64_t t) {
  std::lock_guard<std::mutex> lock(mu_);
  if (t < tail_) return;  // completed (and maybe its slot reused): nothing to wait for
  const Slot& s = ring_[t % kSlots];
  if (s.ticket != t) return;
  ZERO_CUDA_CHECK(cudaStreamWaitEvent(stream, s.event, 0));
}

bool Watchdog::done(std::uint64_t t) {
  std::lock_guard<std::mutex> lock(mu_);
  if (t < tail_) return true;
  const Slot& s = ring_[t % kSlots];
  if (s.ticket != t) return true;
  const cudaError_t q = cudaEventQuery(s.event);
  if (q == cudaErrorNotReady) return false;
  if (capture_error(q)) {
    cudaGetLastError();
    return false;
  }
  ZERO_CUDA_CHECK(q);
  return true;
}

void Watchdog::host_wait(std::uint64_t t) {
  cudaEvent_t ev = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (t < tail_ || ring_[t % kSlots].ticket != t) return;
    ev = ring_[t % kSlots].event;
  }
  ZERO_CUDA_CHECK(cudaEventSynchronize(ev));
}

std::string Watchdog::describe(const Slot& s, Clock::time_point now) const {
  const double waited = std::chrono::duration<double>(now - s.enqueued).count();
  if (s.ops > 1)
    return fmt::format("a group of {} collectives (first: {}; {} in all; #{}), enqueued {:.1f} s ago", s.ops, s.what,
                       format_bytes(s.bytes), s.ticket, waited);
  return fmt::format("{} of {} (#{}), enqueued {:.1f} s ago", s.what, format_bytes(s.bytes), s.ticket, waited);
}

void Watchdog::run() {
  cudaSetDevice(o_.device);  // event queries need the device's context on this thread
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
  const auto poll = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o_.poll_s));
  for (;;) {
    std::optional<WatchdogFinding> failure;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (cv_.wait_for(lock, poll, [this] { return stop_; })) return;
      const auto now = Clock::now();
      while (tail_ < head_) {
        const Slot& s = ring_[tail_ % kSlots];
        const cudaError_t q = cudaEventQuery(s.event);
        if (q == cudaSuccess) {
          ++tail_;
          continue;
        }
        if (capture_error(q)) {
          cudaGetLastError();
          break;
        }
        if (q != cudaErrorNotReady) {
          // A kernel's sticky fault shows here first when a collective is in flight: it is
          // reported as the kernel failure it is (watchdog_report.hpp), not as the collective's.
          failure = event_error(cudaGetErrorName(q), cudaGetErrorString(q), describe(s, now));
        } else if (o_.timeout_s > 0.0 && now > s.deadline) {
          failure = stalled(describe(s, now), o_.timeout_s);
        }
        cudaGetLastError();
        break;
      }
    }
    if (!failure && o_.async_error) {
      std::string nccl = o_.async_error();
      if (!nccl.empty()) {
        // NCCL fails too once a kernel has spoiled the context: the context's own state tells.
        // Any call on it returns a sticky error; an event query never blocks.
        const cudaError_t d = cudaEventQuery(ring_[0].event);
        const bool bad = d != cudaSuccess && d != cudaErrorNotReady;
        cudaGetLastError();
        failure =
            comm_error(std::move(nccl), bad ? cudaGetErrorName(d) : "cudaSuccess", bad ? cudaGetErrorString(d) : "");
      }
    }
    if (failure) {
      fail(*failure);
      return;
    }
  }
}

void Watchdog::fail(const WatchdogFinding& finding) {
  // The options carry the rank: this thread must not depend on the Context.
  const std::string recent = o_.recent_collectives ? o_.recent_collectives() : std::string();
  const std::string message = watchdog_message(finding, o_.rank, o_.world, recent);
  if (o_.on_failure) {
    o_.on_failure(message);
    return;
  }
  // Not log(): the job aborts next, so the line must get out even if the main thread, stuck in
  // the collective, holds stderr's lock, and whatever ZERO_LOG_LEVEL says.
  write_last_words(message + '\n');
  if (o_.abort_comm) o_.abort_comm();
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  // MPI_Abort from a second thread goes beyond MPI_THREAD_FUNNELED, but the process is being
  // torn down and MPI_Abort is the one call that reaches the other ranks' launcher.
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();
}

}  // namespace zero::cuda
