// How long a rank waits for a collective, and how it waits.
//
// Every collective has a deadline: a rank that waits longer than collective_timeout_s() for its
// peers ends the job with a message instead of hanging it (a stopped process, a dead node that
// keeps its socket). One reader serves every backend, so ZERO_TIMEOUT_S means the same for MPI
// and NCCL; ZERO_NCCL_TIMEOUT_S, its older spelling, still works.
//
// A waiting rank polls with Backoff: a short spin keeps the latency of fast collectives, then
// sleeps that double up to a cap, so ranks waiting on a straggler leave its cores (and their own
// node's other ranks) alone instead of burning them at 100%.
#pragma once

#include <chrono>
#include <cstdint>

namespace zero {

// ZERO_TIMEOUT_S, else ZERO_NCCL_TIMEOUT_S, else 600 seconds; 0 disables the deadline. A value
// that is not a number of seconds >= 0 throws zero::Error naming the variable.
double collective_timeout_s();

// Exit status of a job that a collective's deadline ended (as timeout(1) uses).
constexpr int kCollectiveTimeoutExit = 124;

class Backoff {
 public:
  using Duration = std::chrono::nanoseconds;
  // `spins` polls without sleeping, then sleeps of `first`, 2*first, ... up to `cap`.
  explicit Backoff(int spins = 256, Duration first = std::chrono::microseconds(8),
                   Duration cap = std::chrono::milliseconds(1))
      : spins_(spins), next_(first), cap_(cap) {}
  // The pause to take before the next poll (zero while spinning).
  Duration next();
  void pause();  // sleeps next()
  bool spinning() const { return polls_ < spins_; }

 private:
  int spins_, polls_ = 0;
  Duration next_, cap_;
};

}  // namespace zero
