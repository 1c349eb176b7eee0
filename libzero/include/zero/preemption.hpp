// Stopping a training loop cleanly when the job is asked to end: StopSignal turns the first
// SIGTERM, SIGINT or SIGUSR1 into a request; the collective stop_requested(ctx) stops every rank
// after the same step. The loop it expects: docs/architecture.md, note preemption.
#pragma once

namespace zero {

class Context;

// The exit status of a process that stopped on request after saving its state: 75, BSD's
// EX_TEMPFAIL ("try again later"), which a job script can tell from success (0) and failure
// (1, or 128 + a signal number) and answer by requeueing the job with --resume.
inline constexpr int kExitStopped = 75;

// Installs handlers for SIGTERM, SIGINT and SIGUSR1 for its lifetime and restores the previous
// ones when destroyed. One at a time per process. The handler only records the signal and
// writes one line to stderr (both async-signal-safe); system calls are restarted (SA_RESTART),
// so a signal does not fail the MPI or file operation it interrupts.
class StopSignal {
 public:
  StopSignal();
  ~StopSignal();
  StopSignal(const StopSignal&) = delete;
  StopSignal& operator=(const StopSignal&) = delete;

  // The first stop signal this process received (SIGTERM, SIGINT, SIGUSR1), or 0.
  static int received();
};

// Collective over ctx.comm(): true on every rank when any rank has received a stop signal.
// One all-reduce of one number, cheap enough to call after every step.
bool stop_requested(Context& ctx);

}  // namespace zero
