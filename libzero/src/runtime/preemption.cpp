#include "zero/preemption.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <string>

#include "zero/comm.hpp"
#include "zero/context.hpp"
#include "zero/error.hpp"

namespace zero {

namespace {

constexpr int kSignals[] = {SIGTERM, SIGINT, SIGUSR1};

// What the handler may touch: lock-free atomics and memory prepared before it was installed.
volatile std::sig_atomic_t g_received = 0;
bool g_installed = false;
struct sigaction g_previous[std::size(kSignals)];
char g_message[256];
std::size_t g_message_size = 0;

extern "C" void on_stop_signal(int signo) {
  if (g_received != 0) {
    // The second signal: the user will not wait for the save. End as the signal would have.
    ::signal(signo, SIG_DFL);
    ::raise(signo);
    return;
  }
  g_received = signo;
  const ssize_t ignored = ::write(STDERR_FILENO, g_message, g_message_size);
  (void)ignored;  // nothing to do about a failed write inside a handler
}

}  // namespace

StopSignal::StopSignal() {
  ZERO_CHECK(!g_installed, "StopSignal: one is already installed in this process; keep a single "
                           "StopSignal for the whole training loop");
  const std::string msg = rank_prefix() +
                          "stop requested by a signal: the job stops after the current step and "
                          "saves a checkpoint if every rank reaches it (send the signal again to end "
                          "this process now). If a rank has died instead, mpirun or srun sends this "
                          "signal to the others: they end without a save, and --resume starts from "
                          "the last checkpoint\n";
  g_message_size = std::min(msg.size(), sizeof g_message);
  std::memcpy(g_message, msg.data(), g_message_size);
  g_received = 0;
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (std::size_t i = 0; i < std::size(kSignals); ++i)
    ZERO_CHECK(::sigaction(kSignals[i], &sa, &g_previous[i]) == 0,
               std::string("StopSignal: sigaction failed: ") + std::strerror(errno));
  g_installed = true;
}

StopSignal::~StopSignal() {
  for (std::size_t i = 0; i < std::size(kSignals); ++i) ::sigaction(kSignals[i], &g_previous[i], nullptr);
  g_installed = false;
}

int StopSignal::received() { return g_received; }

bool stop_requested(Context& ctx) {
  const double mine = g_received != 0 ? 1.0 : 0.0;
  return ctx.comm().all_reduce_scalar(mine, ReduceOp::max) > 0.0;
}

}  // namespace zero
