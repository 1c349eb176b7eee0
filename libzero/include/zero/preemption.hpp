// Stopping a training loop cleanly when the job is asked to end.
//
// Clusters end jobs with a signal: Slurm sends SIGTERM before the kill (or the signal
// `--signal=USR1@120` names, ahead of time), mpirun forwards SIGUSR1 to every rank, a user
// presses Ctrl-C (SIGINT). A StopSignal turns the first of these into a request and leaves the
// process running. The loop asks stop_requested(ctx) at every step boundary: a collective that
// every rank calls at the same point, so a signal that reached one rank only stops all of them
// after the same step. The loop then saves a checkpoint, says where it is, and exits with
// kExitStopped. A second signal to a process ends it at once (the signal's default action), for
// a user who will not wait for the save.
//
//   zero::StopSignal stop;                       // before the loop
//   for (step = ...; step <= steps; ++step) {
//     train_step();
//     if (zero::stop_requested(ctx)) { save_checkpoint(...); return zero::kExitStopped; }
//   }
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
