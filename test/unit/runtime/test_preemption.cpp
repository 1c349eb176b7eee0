// zero::StopSignal in one process: the first stop signal is recorded and the process goes on,
// a second one ends it as the signal would, and the previous handlers come back afterwards.
// Each case runs in a forked child, so a signal that ends a process ends only the child.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "zero/preemption.hpp"

namespace {

// Runs fn in a child process; returns its wait status.
template <class F>
int in_child(F fn) {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) ::_exit(fn());
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  return status;
}

void (*handler_of(int signo))(int) {
  struct sigaction now {};
  ::sigaction(signo, nullptr, &now);
  return now.sa_handler;
}

}  // namespace

TEST_CASE("the first stop signal is a request, the process goes on", "[preemption]") {
  for (int signo : {SIGTERM, SIGINT, SIGUSR1}) {
    INFO("signal " << signo);
    const int status = in_child([signo] {
      zero::StopSignal stop;
      if (zero::StopSignal::received() != 0) return 10;
      ::raise(signo);
      return zero::StopSignal::received() == signo ? 0 : 11;
    });
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
}

TEST_CASE("a second stop signal ends the process at once", "[preemption]") {
  const int status = in_child([] {
    zero::StopSignal stop;
    ::raise(SIGTERM);
    ::raise(SIGUSR1);
    return 12;  // still alive: the second signal was swallowed
  });
  REQUIRE(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGUSR1);
}

TEST_CASE("the previous handlers come back, and one StopSignal at a time", "[preemption]") {
  const int status = in_child([] {
    // Catch installs its own handlers for some of these; whatever was there comes back.
    const int signals[] = {SIGTERM, SIGINT, SIGUSR1};
    void (*before[3])(int) = {};
    for (int i = 0; i < 3; ++i) before[i] = handler_of(signals[i]);
    {
      zero::StopSignal stop;
      if (handler_of(SIGUSR1) == before[2]) return 13;
      try {
        zero::StopSignal second;
        return 14;
      } catch (const std::exception&) {
      }
    }
    for (int i = 0; i < 3; ++i)
      if (handler_of(signals[i]) != before[i]) return 15;
    return 0;
  });
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(zero::kExitStopped == 75);
}

TEST_CASE("the stop message is written whole, in one line per signal", "[preemption]") {
  const struct {
    int signo;
    const char* name;
  } cases[] = {{SIGTERM, "SIGTERM"}, {SIGINT, "SIGINT"}, {SIGUSR1, "SIGUSR1"}};
  for (const auto& c : cases) {
    INFO(c.name);
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    const int status = in_child([&] {
      ::close(fds[0]);
      if (::dup2(fds[1], STDERR_FILENO) < 0) return 16;
      zero::StopSignal stop;
      ::raise(c.signo);
      return 0;
    });
    ::close(fds[1]);
    std::string text;
    char buf[512];
    for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) text.append(buf, static_cast<std::size_t>(n));
    ::close(fds[0]);
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    // Not cut: the whole sentence, ending with its newline, and nothing else.
    CHECK(text == std::string(c.name) +
                      " received: the job stops after the current step on every rank, with a checkpoint if the "
                      "loop saves one (if a rank is gone, the collective deadline ends the job instead); signal "
                      "again to end this process now, unsaved\n");
  }
}
