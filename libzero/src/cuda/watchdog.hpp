// Watchdog: completion tracking of device collectives, and the thread that makes sure a failed
// or stalled collective ends the job with a message instead of a silent hang.
//
// Every collective (or NCCL group) records an event on the communication stream when it is
// enqueued and gets a ticket. Work handles wait on the ticket's event (stream_wait / done), and
// a thread polls, every poll_s: the oldest unfinished ticket (collectives complete in stream
// order, so only the oldest can be overdue) against its deadline (enqueue time + timeout_s),
// CUDA errors of its event, and the communicator's asynchronous error (ncclCommGetAsyncError).
// On a failure it reports once, naming the rank, the collective, its size and how long it has
// been waiting, and by default aborts NCCL (so kernels stuck in it return) and then the job
// (MPI_Abort): one rank's failure must not leave the others blocked forever. A kernel's sticky
// fault, which the collective's event is often the first to show, is reported as a kernel
// failure with the way to find the kernel, not as the collective's (watchdog_report.hpp).
//
// CUDA graphs: a ticket recorded while a stream is being captured would be a node of the graph,
// not an event that completes, and would block the ring's tail (so every later collective would
// go unchecked). The communicators therefore refuse a collective while the compute stream is
// being captured (refuse_capture in streams.hpp): no ticket is ever recorded under capture.
// What remains is capture elsewhere: while a thread captures its own kernels in global mode, a
// query from this thread would invalidate that capture, so the thread runs in relaxed capture
// mode, and a query refused because of a capture counts as "not complete yet" (asked again at
// the next poll).
//
// The timeout is measured from the enqueue, so it includes the wait for compute kernels queued
// before the collective: it is a bound on "nothing happened", not a performance target
// (ZERO_NCCL_TIMEOUT_S, default 600; 0 disables the deadline, not the error polling).
//
// Tickets live in a fixed ring of events, so recording allocates nothing; a slot is reused only
// after its collective completed, which record() checks without blocking except when more than
// kSlots collectives are in flight at once.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace zero::cuda {

struct WatchdogFinding;  // watchdog_report.hpp

struct WatchdogOptions {
  double timeout_s = 600.0;  // 0: no deadline
  double poll_s = 0.1;
  int rank = 0, world = 1, device = 0;
  // Polled on the watchdog thread; a non-empty result is an asynchronous communicator error.
  std::function<std::string()> async_error;
  // Called before MPI_Abort by the default failure action (ncclCommAbort for NCCL).
  std::function<void()> abort_comm;
  // This rank's last collectives (the collective check's record), named in the report so that
  // every rank's report shows where it was; called on the watchdog thread.
  std::function<std::string()> recent_collectives;
  // Replaces the default failure action (tests): called once, on the watchdog thread.
  std::function<void(const std::string& message)> on_failure;
};

class Watchdog {
 public:
  static constexpr std::size_t kSlots = 1024;

  explicit Watchdog(WatchdogOptions o);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Records the completion of the work just enqueued on `stream`: `ops` collectives, the first
  // of kind `what` (a string literal), `bytes` in all. Returns its ticket (>= 1).
  std::uint64_t record(cudaStream_t stream, const char* what, std::size_t bytes, int ops);
  // Makes `stream` wait for ticket t (no host wait).
  void stream_wait(cudaStream_t stream, std::uint64_t t);
  // True once ticket t has completed on the device.
  bool done(std::uint64_t t);
  // Blocks the host until ticket t completes.
  void host_wait(std::uint64_t t);

  // ZERO_NCCL_TIMEOUT_S, validated (default 600).
  static double timeout_from_env();
  const WatchdogOptions& options() const { return o_; }

 private:
  using Clock = std::chrono::steady_clock;
  struct Slot {
    cudaEvent_t event = nullptr;
    std::uint64_t ticket = 0;
    const char* what = "";
    std::size_t bytes = 0;
    int ops = 0;
    Clock::time_point enqueued, deadline;
  };
  void run();
  void retire_completed_locked(int limit);
  std::string describe(const Slot& s, Clock::time_point now) const;
  void fail(const WatchdogFinding& finding);

  WatchdogOptions o_;
  std::vector<Slot> ring_;
  std::uint64_t head_ = 1, tail_ = 1;  // tickets [tail_, head_) are in flight
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace zero::cuda
