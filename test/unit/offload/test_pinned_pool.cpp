// PinnedPool: alignment, size classes, reuse of freed blocks, byte accounting, and the failure
// to pin when RLIMIT_MEMLOCK forbids it (required: a clear error; optional: pageable fallback).
#include <catch2/catch.hpp>

#include <linux/capability.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "zero/error.hpp"
#include "offload/pinned_pool.hpp"

using zero::offload::PinnedBuffer;
using zero::offload::PinnedPool;

namespace {

bool aligned(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 4096 == 0; }

// Lowers RLIMIT_MEMLOCK to zero and, for root, drops CAP_IPC_LOCK from the effective set (root
// may lock memory regardless of the limit). Both are restored at scope exit.
class NoMemlock {
 public:
  NoMemlock() {
    getrlimit(RLIMIT_MEMLOCK, &saved_);
    rlimit none = saved_;
    none.rlim_cur = 0;
    ok_ = setrlimit(RLIMIT_MEMLOCK, &none) == 0;
    hdr_.version = _LINUX_CAPABILITY_VERSION_3;
    hdr_.pid = 0;
    if (syscall(SYS_capget, &hdr_, caps_) == 0) {
      const int word = CAP_IPC_LOCK / 32;
      const std::uint32_t bit = 1u << (CAP_IPC_LOCK % 32);
      had_cap_ = (caps_[word].effective & bit) != 0;
      if (had_cap_) {
        __user_cap_data_struct dropped[2];
        std::memcpy(dropped, caps_, sizeof dropped);
        dropped[word].effective &= ~bit;
        ok_ = ok_ && syscall(SYS_capset, &hdr_, dropped) == 0;
      }
    }
  }
  ~NoMemlock() {
    if (had_cap_) syscall(SYS_capset, &hdr_, caps_);
    setrlimit(RLIMIT_MEMLOCK, &saved_);
  }
  bool active() const { return ok_; }

 private:
  rlimit saved_{};
  __user_cap_header_struct hdr_{};
  __user_cap_data_struct caps_[2]{};
  bool had_cap_ = false;
  bool ok_ = false;
};

}  // namespace

TEST_CASE("size classes are page multiples at most 25% above the request", "[pinned_pool]") {
  CHECK(PinnedPool::size_class(1) == 4096);
  CHECK(PinnedPool::size_class(4096) == 4096);
  CHECK(PinnedPool::size_class(4097) == 8192);
  CHECK(PinnedPool::size_class(1 << 20) == (1u << 20));
  CHECK(PinnedPool::size_class((1 << 20) + 1) == (1u << 20) + (1u << 18));
  for (std::size_t b = 1; b < (std::size_t{1} << 34); b = b * 3 + 7) {
    const std::size_t c = PinnedPool::size_class(b);
    INFO("bytes " << b << " class " << c);
    REQUIRE(c >= b);
    REQUIRE(c % 4096 == 0);
    if (b > 4096) REQUIRE(static_cast<double>(c) <= 1.25 * static_cast<double>(b) + 1);
  }
}

TEST_CASE("buffers are aligned, usable and reused by size class", "[pinned_pool]") {
  PinnedPool pool(/*require_pinned=*/false);
  CHECK(pool.bytes_reserved() == 0);
  const std::size_t c1 = PinnedPool::size_class(100000);
  void* first = nullptr;
  {
    PinnedBuffer a = pool.acquire(100000);
    REQUIRE(a);
    REQUIRE(aligned(a.data()));
    CHECK(a.size() == 100000);
    CHECK(a.capacity() == c1);
    std::memset(a.data(), 0x5a, a.capacity());
    first = a.data();
    CHECK(pool.bytes_in_use() == c1);
    CHECK(pool.bytes_reserved() == c1);
    if (a.pinned()) CHECK(pool.bytes_pinned() == c1);

    PinnedBuffer b = pool.acquire(5000);
    CHECK(b.data() != a.data());
    CHECK(pool.bytes_in_use() == c1 + 8192);
    CHECK(pool.bytes_reserved() == c1 + 8192);
  }
  // Both blocks went back to the cache: nothing in use, nothing freed.
  CHECK(pool.bytes_in_use() == 0);
  CHECK(pool.bytes_reserved() == c1 + 8192);

  // A request of the same class gets the cached block; another class gets a new one.
  PinnedBuffer again = pool.acquire(c1 - 10);
  CHECK(again.data() == first);
  CHECK(pool.bytes_reserved() == c1 + 8192);
  PinnedBuffer other = pool.acquire(3 * c1);
  CHECK(pool.bytes_reserved() == c1 + 8192 + PinnedPool::size_class(3 * c1));

  // Moving a buffer moves ownership, not the block.
  PinnedBuffer moved = std::move(again);
  CHECK_FALSE(again);  // NOLINT(bugprone-use-after-move): checking the moved-from state
  CHECK(moved.data() == first);
  moved.reset();
  CHECK_FALSE(moved);
  CHECK(pool.bytes_in_use() == PinnedPool::size_class(3 * c1));

  pool.trim();  // frees the cached 8 KiB and c1 blocks, keeps the one in use
  CHECK(pool.bytes_reserved() == PinnedPool::size_class(3 * c1));
  CHECK(pool.acquire(0).data() == nullptr);
}

TEST_CASE("pinning works when the limit allows it", "[pinned_pool]") {
  rlimit rl{};
  getrlimit(RLIMIT_MEMLOCK, &rl);
  if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < (1u << 20) && geteuid() != 0) {
    WARN("RLIMIT_MEMLOCK below 1 MiB: skipping the pinned allocation check");
    return;
  }
  PinnedPool pool(/*require_pinned=*/true);
  PinnedBuffer b = pool.acquire(256 * 1024);
  CHECK(b.pinned());
  CHECK(pool.bytes_pinned() == 256 * 1024);
}

TEST_CASE("failing to pin: an error when required, a pageable fallback otherwise", "[pinned_pool]") {
  NoMemlock guard;
  if (!guard.active()) {
    WARN("could not lower RLIMIT_MEMLOCK / drop CAP_IPC_LOCK here; skipping");
    return;
  }
  // The sanitizers replace mlock with a no-op that always succeeds: check that locking fails.
  {
    void* page = nullptr;
    REQUIRE(posix_memalign(&page, 4096, 1 << 20) == 0);
    const bool locked = mlock(page, 1 << 20) == 0;
    if (locked) munlock(page, 1 << 20);
    std::free(page);
    if (locked) {
      WARN("mlock succeeds despite RLIMIT_MEMLOCK 0 (sanitizer build?); skipping");
      return;
    }
  }
  {
    PinnedPool strict(/*require_pinned=*/true);
    REQUIRE_THROWS_AS(strict.acquire(3 << 20), zero::Error);
    try {
      strict.acquire(3 << 20);
    } catch (const zero::Error& e) {
      const std::string msg = e.what();
      CHECK_THAT(msg, Catch::Contains("3.0 MiB"));
      CHECK_THAT(msg, Catch::Contains("RLIMIT_MEMLOCK"));
      CHECK_THAT(msg, Catch::Contains("ulimit -l"));
    }
    CHECK(strict.bytes_reserved() == 0);
  }
  PinnedPool lenient(/*require_pinned=*/false);
  PinnedBuffer b = lenient.acquire(1 << 20);
  REQUIRE(b);
  CHECK_FALSE(b.pinned());
  CHECK(aligned(b.data()));
  CHECK(lenient.bytes_pinned() == 0);
  CHECK(lenient.bytes_reserved() == (1u << 20));
}

TEST_CASE("buffers may outlive their pool, and the pool is thread-safe", "[pinned_pool]") {
  PinnedBuffer survivor;
  {
    PinnedPool pool(false);
    survivor = pool.acquire(12345);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&pool, t] {
        for (int i = 0; i < 200; ++i) {
          PinnedBuffer b = pool.acquire(static_cast<std::size_t>(4096 * (1 + (i + t) % 5)));
          static_cast<unsigned char*>(b.data())[0] = 1;
        }
      });
    }
    for (auto& th : threads) th.join();
    CHECK(pool.bytes_in_use() == PinnedPool::size_class(12345));
  }
  std::memset(survivor.data(), 1, survivor.size());  // still valid after the pool is gone
  survivor.reset();
}
