// The collective watchdog: tickets complete in order and can be waited on from a stream or the
// host; a ticket that does not complete within the timeout is reported once with the rank, the
// collective and its size; a communicator's asynchronous error is reported; quick work raises
// no alarm; the ring of completion events wraps safely; ZERO_NCCL_TIMEOUT_S is validated.
// A stalled collective is simulated by a host function that blocks the stream.
#include <cuda_runtime_api.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

#include "cuda/watchdog.hpp"
#include "zero/error.hpp"

using zero::cuda::Watchdog;
using zero::cuda::WatchdogOptions;

namespace {

// Collects the failure reported on the watchdog thread.
struct Reports {
  std::mutex mu;
  std::condition_variable cv;
  std::string message;
  int count = 0;
  void add(const std::string& m) {
    std::lock_guard<std::mutex> lock(mu);
    message = m;
    ++count;
    cv.notify_all();
  }
  bool wait_for_one(double seconds) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return count > 0; });
  }
};

WatchdogOptions options(Reports& r, double timeout_s) {
  WatchdogOptions o;
  o.timeout_s = timeout_s;
  o.poll_s = 0.02;
  o.rank = 0;
  o.world = 1;
  cudaGetDevice(&o.device);
  o.on_failure = [&r](const std::string& m) { r.add(m); };
  return o;
}

void CUDART_CB sleep_host(void* seconds) {
  std::this_thread::sleep_for(std::chrono::duration<double>(*static_cast<double*>(seconds)));
}

struct OwnStream {
  cudaStream_t s = nullptr;
  OwnStream() { REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess); }
  ~OwnStream() {
    cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
  }
};

}  // namespace

TEST_CASE("tickets complete and can be waited on from the host or another stream", "[watchdog]") {
  Reports r;
  Watchdog w(options(r, 5.0));
  OwnStream a, b;
  static double block_s = 0.3;
  REQUIRE(cudaLaunchHostFunc(a.s, sleep_host, &block_s) == cudaSuccess);
  const std::uint64_t t = w.record(a.s, "all_reduce", 1024, 1);
  CHECK(t >= 1);
  CHECK_FALSE(w.done(t));  // the stream is blocked for 0.3 s
  // Stream b waits for the ticket: a host function queued after the wait runs after it.
  std::atomic<bool> b_ran{false};
  w.stream_wait(b.s, t);
  REQUIRE(cudaLaunchHostFunc(
              b.s, [](void* flag) { static_cast<std::atomic<bool>*>(flag)->store(true); }, &b_ran) == cudaSuccess);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK_FALSE(b_ran.load());
  w.host_wait(t);
  CHECK(w.done(t));
  cudaStreamSynchronize(b.s);
  CHECK(b_ran.load());
  CHECK(r.count == 0);
}

TEST_CASE("a collective past its deadline is reported with rank, kind and size", "[watchdog]") {
  Reports r;
  Watchdog w(options(r, 0.3));
  OwnStream s;
  static double stall_s = 2.0;
  REQUIRE(cudaLaunchHostFunc(s.s, sleep_host, &stall_s) == cudaSuccess);
  w.record(s.s, "reduce_scatter", 3u << 20, 1);
  REQUIRE(r.wait_for_one(1.5));  // well before the stall ends
  CHECK_THAT(r.message, Catch::Contains("[rank 0/1]") && Catch::Contains("reduce_scatter") &&
                            Catch::Contains("3.0 MiB") && Catch::Contains("did not complete within") &&
                            Catch::Contains("ZERO_NCCL_TIMEOUT_S"));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  CHECK(r.count == 1);  // reported once
}

TEST_CASE("a group is described as a group", "[watchdog]") {
  Reports r;
  Watchdog w(options(r, 0.2));
  OwnStream s;
  static double stall_s = 1.0;
  REQUIRE(cudaLaunchHostFunc(s.s, sleep_host, &stall_s) == cudaSuccess);
  w.record(s.s, "all_gather", 5u << 20, 7);
  REQUIRE(r.wait_for_one(1.0));
  CHECK_THAT(r.message, Catch::Contains("group of 7 collectives") && Catch::Contains("all_gather"));
}

TEST_CASE("quick work raises no alarm, and the ticket ring wraps", "[watchdog]") {
  Reports r;
  Watchdog w(options(r, 0.5));
  OwnStream s;
  std::uint64_t first = 0, last = 0;
  for (std::size_t i = 0; i < 3 * Watchdog::kSlots + 7; ++i) {
    const std::uint64_t t = w.record(s.s, "broadcast", 8, 1);
    if (i == 0) first = t;
    last = t;
  }
  CHECK(last - first == 3 * Watchdog::kSlots + 6);
  w.host_wait(last);
  CHECK(w.done(first));       // its slot was reused: completed long ago
  w.stream_wait(s.s, first);  // a no-op, not a wait on a newer collective's event
  std::this_thread::sleep_for(std::chrono::milliseconds(800));
  CHECK(r.count == 0);
}

TEST_CASE("an asynchronous communicator error is reported", "[watchdog]") {
  Reports r;
  WatchdogOptions o = options(r, 0.0);  // no deadline: only the error polling
  std::atomic<int> polls{0};
  o.async_error = [&polls]() -> std::string { return ++polls > 3 ? "NCCL reported an asynchronous error: boom" : ""; };
  Watchdog w(std::move(o));
  REQUIRE(r.wait_for_one(2.0));
  CHECK_THAT(r.message, Catch::Contains("boom"));
}

TEST_CASE("ZERO_NCCL_TIMEOUT_S is read and validated", "[watchdog]") {
  // ZERO_TIMEOUT_S, the host collectives' deadline, takes precedence (comm/collective_timeout.hpp):
  // set in the environment, it would hide every value below. It is restored at the end.
  const char* outer = std::getenv("ZERO_TIMEOUT_S");
  const bool had = outer != nullptr;
  const std::string saved = had ? outer : "";
  unsetenv("ZERO_TIMEOUT_S");
  unsetenv("ZERO_NCCL_TIMEOUT_S");
  CHECK(Watchdog::timeout_from_env() == 600.0);
  setenv("ZERO_NCCL_TIMEOUT_S", "12.5", 1);
  CHECK(Watchdog::timeout_from_env() == 12.5);
  setenv("ZERO_NCCL_TIMEOUT_S", "0", 1);
  CHECK(Watchdog::timeout_from_env() == 0.0);
  for (const char* bad : {"ten", "-1", "5s", "inf"}) {
    setenv("ZERO_NCCL_TIMEOUT_S", bad, 1);
    CHECK_THROWS_WITH(Watchdog::timeout_from_env(), Catch::Contains("ZERO_NCCL_TIMEOUT_S") && Catch::Contains(bad));
  }
  unsetenv("ZERO_NCCL_TIMEOUT_S");
  if (had) setenv("ZERO_TIMEOUT_S", saved.c_str(), 1);
}
