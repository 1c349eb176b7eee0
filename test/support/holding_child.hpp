// A second process for tests of "two jobs, one directory": a forked child runs a setup (it takes
// a lock, writes files), tells the parent it is ready, and then stays alive, holding what it
// took, until the parent kills it. The parent acts as the second job meanwhile.
#pragma once

#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <exception>
#include <functional>

namespace zero::test {

class HoldingChild {
 public:
  // Runs setup in the child; returns once it has finished (REQUIREs that it succeeded).
  explicit HoldingChild(const std::function<void()>& setup) {
    int ready[2];
    REQUIRE(::pipe(ready) == 0);
    std::fflush(nullptr);
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      ::close(ready[0]);
      char ok = 0;
      try {
        setup();
        ok = 1;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "child: %s\n", e.what());
      }
      if (::write(ready[1], &ok, 1) != 1) ::_exit(2);
      for (;;) ::pause();  // holding, until killed
    }
    ::close(ready[1]);
    char ok = 0;
    const bool got = ::read(ready[0], &ok, 1) == 1;
    ::close(ready[0]);
    if (!got || ok != 1) kill();
    REQUIRE(got);
    REQUIRE(ok == 1);
  }
  ~HoldingChild() { kill(); }
  HoldingChild(const HoldingChild&) = delete;
  HoldingChild& operator=(const HoldingChild&) = delete;

  pid_t pid() const { return pid_; }

  // SIGKILL: the child runs no more code, as when a job is killed outright.
  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
};

}  // namespace zero::test
