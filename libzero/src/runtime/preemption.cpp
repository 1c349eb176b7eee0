#include "zero/preemption.hpp"

#include <signal.h>
#include <unistd.h>

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

// The line the handler writes, one per signal, prepared whole before the handlers are installed
// and written with one write(2), so that two ranks' lines sharing a terminal or a log do not
// interleave. It says what the library does (the loop decides about the checkpoint).
constexpr char kText[] =
    "the job stops after the current step on every rank, with a checkpoint if the loop saves one (if a rank is "
    "gone, the collective deadline ends the job instead); signal again to end this process now, unsaved\n";
// Room for the rank prefix ("[rank 2147483647/2147483647] ") and "SIGUSR1 received: ".
constexpr std::size_t kMessageBytes = sizeof kText + 64;
char g_message[std::size(kSignals)][kMessageBytes];
std::size_t g_message_size[std::size(kSignals)] = {};

extern "C" void on_stop_signal(int signo) {
  if (g_received != 0) {
    // The second signal: the user will not wait for the save. End as the signal would have.
    ::signal(signo, SIG_DFL);
    ::raise(signo);
    return;
  }
  g_received = signo;
  std::size_t i = 0;
  while (i + 1 < std::size(kSignals) && kSignals[i] != signo) ++i;
  const ssize_t ignored = ::write(STDERR_FILENO, g_message[i], g_message_size[i]);
  (void)ignored;  // nothing to do about a failed write inside a handler
}

}  // namespace

StopSignal::StopSignal() {
  ZERO_CHECK(!g_installed,
             "StopSignal: one is already installed in this process; keep a single "
             "StopSignal for the whole training loop");
  const char* const names[] = {"SIGTERM", "SIGINT", "SIGUSR1"};
  static_assert(std::size(names) == std::size(kSignals));
  for (std::size_t i = 0; i < std::size(kSignals); ++i) {
    const std::string msg = rank_prefix() + names[i] + " received: " + kText;
    ZERO_CHECK(msg.size() <= kMessageBytes, "StopSignal: the stop message does not fit its buffer");
    std::memcpy(g_message[i], msg.data(), msg.size());
    g_message_size[i] = msg.size();
  }
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
