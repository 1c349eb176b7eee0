// The collective deadline's environment reader and the waiting ranks' backoff schedule.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>
#include <vector>

#include "comm/collective_timeout.hpp"
#include "zero/error.hpp"

namespace {

// Sets (or, with nullptr, clears) both variables for one case and restores them afterwards.
class TimeoutEnv {
 public:
  TimeoutEnv(const char* timeout, const char* nccl) {
    save("ZERO_TIMEOUT_S", timeout);
    save("ZERO_NCCL_TIMEOUT_S", nccl);
  }
  ~TimeoutEnv() {
    for (const auto& s : saved_)
      if (s.had)
        ::setenv(s.name.c_str(), s.value.c_str(), 1);
      else
        ::unsetenv(s.name.c_str());
  }

 private:
  struct Saved {
    std::string name, value;
    bool had;
  };
  void save(const char* name, const char* v) {
    const char* old = std::getenv(name);
    saved_.push_back({name, old ? old : "", old != nullptr});
    if (v)
      ::setenv(name, v, 1);
    else
      ::unsetenv(name);
  }
  std::vector<Saved> saved_;
};

std::string error_of(const char* timeout, const char* nccl) {
  TimeoutEnv env(timeout, nccl);
  try {
    zero::collective_timeout_s();
  } catch (const zero::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("collective_timeout_s reads ZERO_TIMEOUT_S, then its alias ZERO_NCCL_TIMEOUT_S, else 600") {
  {
    TimeoutEnv env(nullptr, nullptr);
    CHECK(zero::collective_timeout_s() == 600.0);
  }
  {
    TimeoutEnv env("2.5", nullptr);
    CHECK(zero::collective_timeout_s() == 2.5);
  }
  {
    TimeoutEnv env(nullptr, "7");
    CHECK(zero::collective_timeout_s() == 7.0);
  }
  {
    TimeoutEnv env("3", "7");  // the new name wins
    CHECK(zero::collective_timeout_s() == 3.0);
  }
  {
    TimeoutEnv env("", "9");  // empty counts as unset
    CHECK(zero::collective_timeout_s() == 9.0);
  }
  {
    TimeoutEnv env("0", nullptr);  // no deadline
    CHECK(zero::collective_timeout_s() == 0.0);
  }
}

TEST_CASE("collective_timeout_s refuses what is not a number of seconds, naming the variable") {
  for (const char* bad : {"abc", "-1", "5s", "nan", "inf", " "}) {
    INFO(bad);
    const std::string e = error_of(bad, nullptr);
    CHECK(e.find("ZERO_TIMEOUT_S='" + std::string(bad) + "'") != std::string::npos);
    CHECK(e.find("0 disables") != std::string::npos);
  }
  CHECK(error_of(nullptr, "x").find("ZERO_NCCL_TIMEOUT_S='x'") != std::string::npos);
}

TEST_CASE("Backoff spins first, then sleeps that double up to the cap") {
  using us = std::chrono::microseconds;
  zero::Backoff b(3, us(10), us(50));
  std::vector<long> got;
  for (int i = 0; i < 8; ++i) {
    got.push_back(static_cast<long>(std::chrono::duration_cast<us>(b.next()).count()));
    if (i == 2) CHECK_FALSE(b.spinning());
  }
  CHECK(got == std::vector<long>{0, 0, 0, 10, 20, 40, 50, 50});
}

TEST_CASE("Backoff's default pauses stay between a few microseconds and a few milliseconds") {
  zero::Backoff b;
  int spins = 0;
  while (b.spinning()) {
    CHECK(b.next() == zero::Backoff::Duration::zero());
    ++spins;
  }
  CHECK(spins > 0);
  zero::Backoff::Duration last{};
  for (int i = 0; i < 64; ++i) last = b.next();
  CHECK(last >= std::chrono::milliseconds(1));
  CHECK(last <= std::chrono::milliseconds(5));
}
