// NvmeSwapper and SwapPipeline: round trips of many sizes, corruption and truncation detection,
// disk-space checks, injected I/O failures (ENOSPC, EINTR, short transfers), the fallbacks, and
// the three-buffer pipeline over sub-groups.
#include <catch2/catch.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "holding_child.hpp"
#include "zero/error.hpp"
#include "offload/nvme_swapper.hpp"
#include "offload/pinned_pool.hpp"
#include "offload/swap_pipeline.hpp"

using namespace zero::offload;

namespace {

// A scratch directory on the same filesystem as /tmp (a real disk here, so O_DIRECT applies).
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/zero_swap_test_XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    REQUIRE(mkdtemp(buf.data()) != nullptr);
    path_ = buf.data();
  }
  ~TempDir() {
    const std::string cmd = "rm -rf '" + path_ + "'";
    if (std::system(cmd.c_str()) != 0) WARN("could not remove " << path_);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Builds "<prefix><i><suffix>" by appending: GCC 12 at -O3 gives a false -Wrestrict for
// "literal" + std::to_string(i) (GCC bug 105651).
std::string key_name(const char* prefix, std::size_t i, const char* suffix = "") {
  std::string s(prefix);
  s += std::to_string(i);
  s += suffix;
  return s;
}

void fill_random(void* p, std::size_t n, unsigned seed) {
  std::mt19937_64 rng(seed);
  auto* b = static_cast<unsigned char*>(p);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const std::uint64_t x = rng();
    std::memcpy(b + i, &x, 8);
  }
  for (; i < n; ++i) b[i] = static_cast<unsigned char>(rng());
}

std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") out.push_back(name);
  }
  closedir(d);
  return out;
}

void round_trip(NvmeSwapper& sw, PinnedPool& pool, const std::string& key, std::size_t bytes, unsigned seed) {
  PinnedBuffer src = pool.acquire(bytes + 1);
  PinnedBuffer dst = pool.acquire(bytes + 1);
  fill_random(src.data(), bytes, seed);
  std::memset(dst.data(), 0xEE, bytes + 1);
  sw.reserve(key, bytes);
  SwapHandle w = sw.write_async(key, src.data(), bytes);
  sw.wait(w);
  SwapHandle r = sw.read_async(key, dst.data(), bytes);
  r.wait();
  INFO("key " << key << " bytes " << bytes);
  REQUIRE(std::memcmp(src.data(), dst.data(), bytes) == 0);
  REQUIRE(dst.as<unsigned char>()[bytes] == 0xEE);  // nothing written past the end
}

void corrupt_byte(const std::string& path, off_t offset) {
  const int fd = ::open(path.c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  unsigned char b = 0;
  REQUIRE(::pread(fd, &b, 1, offset) == 1);
  b ^= 0x10;
  REQUIRE(::pwrite(fd, &b, 1, offset) == 1);
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

TEST_CASE("round trips of many sizes, io_uring and O_DIRECT when available", "[nvme_swapper]") {
  TempDir tmp;
  PinnedPool pool(false);
  AioOptions opt;
  opt.block_size = 64 * 1024;
  opt.queue_depth = 4;
  NvmeSwapper sw(tmp.path(), 3, opt);
  CHECK(sw.directory() == tmp.path() + "/zero_rank3");
  if (!sw.using_io_uring()) WARN("io_uring unavailable here: tested the pread/pwrite fallback");
  if (!sw.using_direct_io()) WARN("O_DIRECT unavailable under " << tmp.path());
  const std::size_t bs = opt.block_size;
  const std::size_t sizes[] = {0,
                               1,
                               100,
                               4095,
                               4096,
                               4097,
                               8191,
                               bs - 1,
                               bs,
                               bs + 1,
                               bs + 4096,
                               3 * bs + 12345,
                               2 * bs + 4096 * 3,
                               5 * 1024 * 1024 + 7};
  unsigned seed = 1;
  for (std::size_t bytes : sizes) round_trip(sw, pool, key_name("t", bytes), bytes, seed++);
  // Overwrite a key with different contents and a different size.
  round_trip(sw, pool, "t4097", 4000, 99);
  CHECK(sw.file_path("unit3/master") == sw.directory() + "/unit3%2Fmaster.swp");
  round_trip(sw, pool, "unit3/master", 200000, 7);
}

TEST_CASE("many transfers in flight at once", "[nvme_swapper]") {
  TempDir tmp;
  PinnedPool pool(false);
  NvmeSwapper sw(tmp.path(), 0);  // defaults: 1 MiB blocks, queue depth 8
  CHECK(sw.options().block_size == (1u << 20));
  CHECK(sw.options().queue_depth == 8);
  const int count = 12;
  std::vector<PinnedBuffer> src, dst;
  std::vector<SwapHandle> handles;
  for (int i = 0; i < count; ++i) {
    const std::size_t bytes = (std::size_t{1} << 20) * (i % 4) + 4096 * i + 17 * i;
    src.push_back(pool.acquire(bytes));
    dst.push_back(pool.acquire(bytes));
    fill_random(src.back().data(), bytes, 1000 + i);
    sw.reserve(key_name("k", static_cast<std::size_t>(i)), bytes);
  }
  sw.check_space();
  for (int i = 0; i < count; ++i) {
    const std::string key = key_name("k", static_cast<std::size_t>(i));
    handles.push_back(sw.write_async(key, src[i].data(), src[i].size()));
  }
  for (auto& h : handles) h.wait();
  handles.clear();
  for (int i = 0; i < count; ++i) {
    const std::string key = key_name("k", static_cast<std::size_t>(i));
    handles.push_back(sw.read_async(key, dst[i].data(), dst[i].size()));
  }
  for (int i = 0; i < count; ++i) {
    handles[i].wait();
    // (An empty buffer may have no memory at all, which memcmp must not be given.)
    REQUIRE((src[i].size() == 0 || std::memcmp(src[i].data(), dst[i].data(), src[i].size()) == 0));
  }
}

TEST_CASE("a corrupted byte is detected and named", "[nvme_swapper]") {
  TempDir tmp;
  PinnedPool pool(false);
  AioOptions opt;
  opt.block_size = 16 * 1024;
  NvmeSwapper sw(tmp.path(), 0, opt);
  const std::size_t bytes = 100000;  // 7 blocks, the last one partial
  PinnedBuffer buf = pool.acquire(bytes);
  fill_random(buf.data(), bytes, 5);
  sw.reserve("unit1/m", bytes);
  sw.write_async("unit1/m", buf.data(), bytes).wait();
  const std::string file = sw.file_path("unit1/m");

  for (const std::size_t at : {std::size_t{2 * 16384 + 77}, std::size_t{bytes - 1}}) {
    corrupt_byte(file, static_cast<off_t>(at));
    SwapHandle r = sw.read_async("unit1/m", buf.data(), bytes);
    try {
      r.wait();
      FAIL("corruption at byte " << at << " was not detected");
    } catch (const zero::Error& e) {
      const std::string msg = e.what();
      INFO(msg);
      CHECK_THAT(msg, Catch::Contains("checksum mismatch"));
      CHECK_THAT(msg, Catch::Contains(file));
      CHECK_THAT(msg, Catch::Contains("block " + std::to_string(at / 16384)));
    }
    corrupt_byte(file, static_cast<off_t>(at));  // flip it back: the file reads cleanly again
    std::vector<unsigned char> expect(bytes);
    fill_random(expect.data(), bytes, 5);
    sw.read_async("unit1/m", buf.data(), bytes).wait();
    REQUIRE(std::memcmp(expect.data(), buf.data(), bytes) == 0);
  }
}

TEST_CASE("a truncated file is detected", "[nvme_swapper]") {
  TempDir tmp;
  PinnedPool pool(false);
  AioOptions opt;
  opt.block_size = 16 * 1024;
  NvmeSwapper sw(tmp.path(), 0, opt);
  const std::size_t bytes = 50000;
  PinnedBuffer buf = pool.acquire(bytes);
  fill_random(buf.data(), bytes, 6);
  sw.reserve("x", bytes);
  sw.write_async("x", buf.data(), bytes).wait();
  REQUIRE(::truncate(sw.file_path("x").c_str(), 40000) == 0);
  try {
    sw.read_async("x", buf.data(), bytes).wait();
    FAIL("truncation was not detected");
  } catch (const zero::Error& e) {
    const std::string msg = e.what();
    INFO(msg);
    CHECK_THAT(msg, Catch::Contains("truncated"));
    CHECK_THAT(msg, Catch::Contains(sw.file_path("x")));
    CHECK_THAT(msg, Catch::Contains("block 2"));
  }

  // A file that ends while the read is in flight (the kernel reports end of file).
  sw.reserve("y", bytes);
  sw.write_async("y", buf.data(), bytes).wait();
  sw.set_fault_hook([](const SwapIoEvent& ev) -> std::optional<int> {
    if (!ev.write && ev.offset >= 32768 && ev.offset < 49152) return 0;  // block 2 only
    return std::nullopt;
  });
  REQUIRE_THROWS_WITH(sw.read_async("y", buf.data(), bytes).wait(),
                      Catch::Contains("truncated") && Catch::Contains("block 2"));
  sw.set_fault_hook(nullptr);
}

TEST_CASE("check_space fails before writing anything when the disk is too small", "[nvme_swapper]") {
  TempDir tmp;
  NvmeSwapper sw(tmp.path(), 1);
  struct statvfs vfs {};
  REQUIRE(statvfs(tmp.path().c_str(), &vfs) == 0);
  const std::uint64_t free_bytes = static_cast<std::uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  sw.reserve("small", 1 << 20);
  sw.reserve("huge", static_cast<std::size_t>(free_bytes + (std::uint64_t{1} << 40)));
  CHECK(sw.bytes_reserved() >= free_bytes);
  try {
    sw.check_space();
    FAIL("check_space accepted more than the free space");
  } catch (const zero::Error& e) {
    const std::string msg = e.what();
    INFO(msg);
    CHECK_THAT(msg, Catch::Contains("not enough disk space"));
    CHECK_THAT(msg, Catch::Contains(sw.directory()));
    CHECK_THAT(msg, Catch::Contains("free"));
  }
  CHECK(list_dir(sw.directory()).empty());  // nothing was written or preallocated
}

TEST_CASE("check_space preallocates the reserved files", "[nvme_swapper]") {
  TempDir tmp;
  NvmeSwapper sw(tmp.path(), 0);
  sw.reserve("a", 3 << 20);
  sw.reserve("b", 12345);
  sw.check_space();
  struct stat st {};
  REQUIRE(stat(sw.file_path("a").c_str(), &st) == 0);
  CHECK(st.st_size == (3 << 20));
  REQUIRE(stat(sw.file_path("b").c_str(), &st) == 0);
  CHECK(st.st_size == 16384);  // rounded up to whole pages
  sw.check_space();            // idempotent
}

TEST_CASE("a write failing with ENOSPC gives a clear error", "[nvme_swapper]") {
  TempDir tmp;
  PinnedPool pool(false);
  AioOptions opt;
  opt.block_size = 8192;
  NvmeSwapper sw(tmp.path(), 0, opt);
  const std::size_t bytes = 10 * 8192;
  PinnedBuffer buf = pool.acquire(bytes);
  fill_random(buf.data(), bytes, 8);
  sw.reserve("unit2/v", bytes);
  sw.set_fault_hook([](const SwapIoEvent& ev) -> std::optional<int> {
    if (ev.write && ev.offset == 3 * 8192) return -ENOSPC;
    return std::nullopt;
  });
  try {
    sw.write_async("unit2/v", buf.data(), bytes).wait();
    FAIL("the injected ENOSPC was not reported");
  } catch (const zero::Error& e) {
    const std::string msg = e.what();
    INFO(msg);
    CHECK_THAT(msg, Catch::Contains("ENOSPC"));
    CHECK_THAT(msg, Catch::Contains(sw.file_path("unit2/v")));
    CHECK_THAT(msg, Catch::Contains("block 3"));
    CHECK_THAT(msg, Catch::Contains("check_space"));
  }
  sw.set_fault_hook(nullptr);
  // The failed write leaves nothing readable behind, and the key can be written again.
  REQUIRE_THROWS_WITH(sw.read_async("unit2/v", buf.data(), bytes), Catch::Contains("no completed write"));
  round_trip(sw, pool, "unit2/v", bytes, 9);
}

TEST_CASE("a really full filesystem: a 1 MiB tmpfs (needs root)", "[nvme_swapper]") {
  TempDir tmp;
  if (geteuid() != 0 || ::mount("zero_swap_test", tmp.path().c_str(), "tmpfs", 0, "size=1m") != 0) {
    WARN("cannot mount a small tmpfs here (not root, or no CAP_SYS_ADMIN); skipped");
    return;
  }
  struct Unmount {
    std::string path;
    ~Unmount() { ::umount2(path.c_str(), MNT_DETACH); }
  } unmount{tmp.path()};
  PinnedPool pool(false);
  NvmeSwapper sw(tmp.path(), 0);
  const std::size_t bytes = 2 << 20;
  sw.reserve("unit0/master", bytes);
  REQUIRE_THROWS_WITH(sw.check_space(), Catch::Contains("not enough disk space"));
  CHECK(list_dir(sw.directory()).empty());
  // Writing without the check runs into the real ENOSPC, which is reported, not ignored.
  PinnedBuffer buf = pool.acquire(bytes);
  fill_random(buf.data(), bytes, 12);
  try {
    sw.write_async("unit0/master", buf.data(), bytes).wait();
    FAIL("writing 2 MiB to a 1 MiB filesystem succeeded");
  } catch (const zero::Error& e) {
    const std::string msg = e.what();
    INFO(msg);
    CHECK_THAT(msg, Catch::Contains("ENOSPC") || Catch::Contains("no progress"));
    CHECK_THAT(msg, Catch::Contains(sw.file_path("unit0/master")));
  }
}

TEST_CASE("interrupted and short transfers are resubmitted", "[nvme_swapper]") {
  TempDir tmp;
  PinnedPool pool(false);
  AioOptions opt;
  opt.block_size = 32768;
  opt.queue_depth = 3;
  NvmeSwapper sw(tmp.path(), 0, opt);
  std::atomic<int> injected{0};
  std::map<std::pair<bool, std::uint64_t>, int> seen;  // only touched by the I/O thread
  sw.set_fault_hook([&](const SwapIoEvent& ev) -> std::optional<int> {
    int& count = seen[{ev.write, ev.offset}];
    ++count;
    if (ev.result <= 0) return std::nullopt;
    // First completion at an offset: alternately EINTR, EAGAIN, or half the data (page multiple).
    if (count == 1) {
      ++injected;
      switch ((ev.offset / 4096) % 3) {
        case 0: return -EINTR;
        case 1: return -EAGAIN;
        default:
          if (ev.length >= 8192) return static_cast<int>(ev.length / 8192 * 4096);
          return -EINTR;
      }
    }
    return std::nullopt;
  });
  for (std::size_t bytes : {std::size_t{5 * 32768 + 100}, std::size_t{4096}, std::size_t{777}}) {
    round_trip(sw, pool, key_name("r", bytes), bytes, static_cast<unsigned>(bytes));
  }
  CHECK(injected.load() > 10);
}

TEST_CASE("fallbacks: pread/pwrite and buffered I/O", "[nvme_swapper]") {
  TempDir tmp;
  PinnedPool pool(false);
  AioOptions opt;
  opt.block_size = 16384;
  SECTION("no io_uring") {
    opt.use_io_uring = false;
    NvmeSwapper sw(tmp.path(), 0, opt);
    CHECK_FALSE(sw.using_io_uring());
    for (std::size_t bytes : {1, 4096, 16384 * 3 + 5}) round_trip(sw, pool, "a", bytes, 3);
  }
  SECTION("no O_DIRECT") {
    opt.direct_io = false;
    NvmeSwapper sw(tmp.path(), 0, opt);
    CHECK_FALSE(sw.using_direct_io());
    for (std::size_t bytes : {1, 4096, 16384 * 3 + 5}) round_trip(sw, pool, "a", bytes, 4);
    // Buffered I/O takes unaligned buffers too.
    std::vector<unsigned char> src(1001), dst(1001);
    fill_random(src.data(), src.size(), 10);
    sw.reserve("u", src.size());
    sw.write_async("u", src.data() + 1, 1000).wait();
    sw.read_async("u", dst.data() + 1, 1000).wait();
    REQUIRE(std::memcmp(src.data() + 1, dst.data() + 1, 1000) == 0);
  }
  SECTION("tmpfs (/dev/shm), where O_DIRECT may be refused") {
    struct stat st {};
    if (stat("/dev/shm", &st) != 0 || !S_ISDIR(st.st_mode) || access("/dev/shm", W_OK) != 0) {
      WARN("no writable /dev/shm; skipped");
      return;
    }
    NvmeSwapper sw("/dev/shm", 9000 + static_cast<int>(getpid() % 1000), opt);
    round_trip(sw, pool, "a", 16384 * 2 + 99, 5);
  }
}

TEST_CASE("misuse is reported clearly", "[nvme_swapper]") {
  TempDir tmp;
  PinnedPool pool(false);
  NvmeSwapper sw(tmp.path(), 0);
  PinnedBuffer buf = pool.acquire(1 << 16);
  REQUIRE_THROWS_WITH(sw.write_async("nope", buf.data(), 10), Catch::Contains("not reserved"));
  sw.reserve("k", 100);
  REQUIRE_THROWS_WITH(sw.write_async("k", buf.data(), 101), Catch::Contains("reservation"));
  if (sw.using_direct_io()) {
    REQUIRE_THROWS_WITH(sw.write_async("k", buf.as<char>() + 8, 50), Catch::Contains("aligned"));
  }
  REQUIRE_THROWS_WITH(sw.read_async("k", buf.data(), 100), Catch::Contains("no completed write"));
  sw.reserve("big", 1 << 16);
  SwapHandle w = sw.write_async("big", buf.data(), 1 << 16);
  REQUIRE_THROWS_WITH(sw.write_async("big", buf.data(), 1 << 16), Catch::Contains("in progress"));
  w.wait();
  REQUIRE_THROWS_WITH(sw.read_async("big", buf.data(), 100), Catch::Contains("were written"));
  REQUIRE_THROWS_WITH(NvmeSwapper(tmp.path() + "/missing", 0), Catch::Contains("nvme_path"));
  AioOptions bad;
  bad.block_size = 1000;
  REQUIRE_THROWS_WITH(NvmeSwapper(tmp.path(), 0, bad), Catch::Contains("block_size"));
}

TEST_CASE("swap files are removed with the swapper", "[nvme_swapper]") {
  TempDir tmp;
  PinnedPool pool(false);
  std::string dir;
  {
    NvmeSwapper sw(tmp.path(), 2);
    dir = sw.directory();
    round_trip(sw, pool, "a", 5000, 1);
    round_trip(sw, pool, "b/c", 9000, 2);
    CHECK(list_dir(dir).size() == 2);
  }
  struct stat st {};
  CHECK(stat(dir.c_str(), &st) != 0);  // the rank directory is gone too
}

TEST_CASE("SwapPipeline streams sub-groups through three buffers", "[nvme_swapper]") {
  TempDir tmp;
  PinnedPool pool(false);
  AioOptions opt;
  opt.block_size = 65536;
  NvmeSwapper sw(tmp.path(), 0, opt);
  const std::size_t groups = 7;
  std::vector<std::vector<SwapSegment>> layout;
  for (std::size_t g = 0; g < groups; ++g) {
    const std::size_t n = 10000 + 3001 * g;  // floats per segment, varied
    layout.push_back({{key_name("sg", g, "/master"), n * 4},
                      {key_name("sg", g, "/m"), n * 4},
                      {key_name("sg", g, "/v"), n * 4 + 2}});
  }
  SwapPipeline pipe(sw, pool, layout);
  CHECK(pipe.group_count() == groups);
  sw.check_space();
  auto value = [](std::size_t g, std::size_t s, std::size_t i) {
    return static_cast<float>(g * 1000000 + s * 100000 + i % 99991);
  };
  std::vector<std::size_t> order;
  pipe.run(SwapPipeline::Mode::write_only, [&](std::size_t g, SwapGroupView& view) {
    order.push_back(g);
    REQUIRE(view.segment_count() == 3);
    for (std::size_t s = 0; s < 3; ++s) {
      REQUIRE(reinterpret_cast<std::uintptr_t>(view.segment(s)) % 4096 == 0);
      float* x = view.as<float>(s);
      for (std::size_t i = 0; i < view.bytes(s) / 4; ++i) x[i] = value(g, s, i);
    }
  });
  CHECK(order == std::vector<std::size_t>{0, 1, 2, 3, 4, 5, 6});
  for (int pass = 1; pass <= 2; ++pass) {
    pipe.run(SwapPipeline::Mode::read_write, [&](std::size_t g, SwapGroupView& view) {
      for (std::size_t s = 0; s < 3; ++s) {
        float* x = view.as<float>(s);
        for (std::size_t i = 0; i < view.bytes(s) / 4; ++i) {
          if (x[i] != value(g, s, i) + static_cast<float>(pass - 1)) {
            FAIL("group " << g << " segment " << s << " element " << i << " = " << x[i]);
          }
          x[i] += 1.0f;
        }
      }
    });
  }
  std::size_t checked = 0;
  pipe.run(SwapPipeline::Mode::read_only, [&](std::size_t g, SwapGroupView& view) {
    CHECK(view.key(0) == key_name("sg", g, "/master"));
    const float* x = view.as<float>(2);
    for (std::size_t i = 0; i < view.bytes(2) / 4; ++i) REQUIRE(x[i] == value(g, 2, i) + 2.0f);
    ++checked;
  });
  CHECK(checked == groups);

  // An exception from the work function stops the pass cleanly (transfers in flight finish).
  REQUIRE_THROWS_WITH(pipe.run(SwapPipeline::Mode::read_write,
                               [&](std::size_t g, SwapGroupView&) {
                                 if (g == 3) throw std::runtime_error("stop at 3");
                               }),
                      "stop at 3");
  // Groups 0..2 were written back unchanged, the rest never touched: all still read cleanly.
  pipe.run(SwapPipeline::Mode::read_only,
           [&](std::size_t g, SwapGroupView& view) { REQUIRE(view.as<float>(0)[5] == value(g, 0, 5) + 2.0f); });
}

// ---------------------------------------------------------------- two jobs, one nvme_path

namespace {

std::string this_host() {
  char host[256] = {};
  REQUIRE(::gethostname(host, sizeof host - 1) == 0);
  return host;
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace

TEST_CASE("a second job on the same nvme_path is refused, naming the holder's host and pid", "[nvme_swapper]") {
  TempDir tmp;
  std::string held_file;
  zero::test::HoldingChild first([&] {
    // The first job: swaps a tensor and keeps running (the swapper is never destroyed).
    auto* sw = new NvmeSwapper(tmp.path(), 0);
    PinnedPool pool(false);
    PinnedBuffer buf = pool.acquire(8192);
    std::memset(buf.data(), 7, 8192);
    sw->reserve("unit0/master", 8192);
    sw->write_async("unit0/master", buf.data(), 8192).wait();
  });
  const std::string file = tmp.path() + "/zero_rank0/unit0%2Fmaster.swp";
  REQUIRE(exists(file));
  try {
    NvmeSwapper second(tmp.path(), 0);
    FAIL("a second swapper took a rank directory another process holds");
  } catch (const zero::Error& e) {
    const std::string msg = e.what();
    INFO(msg);
    CHECK_THAT(msg, Catch::Contains(tmp.path() + "/zero_rank0.lock") && Catch::Contains("in use by another job") &&
                        Catch::Contains("host " + this_host() + " pid " + std::to_string(first.pid())) &&
                        Catch::Contains("nvme_path"));
  }
  CHECK(exists(file));  // the refused job touched nothing of the first one's
  {
    // Another rank's directory is free: the ranks of one job never refuse each other.
    NvmeSwapper other_rank(tmp.path(), 1);
    // Within one process, swappers share the lock (a rank's parameter and optimizer swappers).
    NvmeSwapper a(tmp.path(), 1);
    CHECK(a.directory() == other_rank.directory());
  }
  first.kill();
  // The kernel dropped the killed job's lock; its leftover file is reclaimed by the next job.
  NvmeSwapper after(tmp.path(), 0);
  CHECK_FALSE(exists(file));
}

TEST_CASE("swap files of a killed job are reclaimed at start, so the space check passes", "[nvme_swapper]") {
  TempDir tmp;
  // On a 1 MiB tmpfs (when this runs as root) the stale files leave too little space for the
  // new job's: without the reclaim its space check fails. Elsewhere the files must still go.
  const bool small_fs = geteuid() == 0 && ::mount("zero_swap_test", tmp.path().c_str(), "tmpfs", 0, "size=1m") == 0;
  struct Unmount {
    std::string path;
    bool mounted;
    ~Unmount() {
      if (mounted) ::umount2(path.c_str(), MNT_DETACH);
    }
  } unmount{tmp.path(), small_fs};
  if (!small_fs) WARN("no small tmpfs (not root): the space check is not at its limit here");
  const std::size_t bytes = 640 << 10;
  {
    zero::test::HoldingChild killed([&] {
      auto* sw = new NvmeSwapper(tmp.path(), 0);
      sw->reserve("old/master", bytes);
      sw->reserve("old/m", 4096);
      sw->check_space();  // preallocates: the files hold their space
    });
  }  // SIGKILL: no destructor ran
  const std::string dir = tmp.path() + "/zero_rank0";
  REQUIRE(list_dir(dir).size() == 2);
  NvmeSwapper sw(tmp.path(), 0);
  CHECK(list_dir(dir).empty());
  sw.reserve("new/master", bytes);
  sw.check_space();
  PinnedPool pool(false);
  round_trip(sw, pool, "new/master", bytes, 21);
}

TEST_CASE("an exception unwinding through a swapper removes its files and its lock", "[nvme_swapper]") {
  TempDir tmp;
  PinnedPool pool(false);
  std::string dir;
  try {
    NvmeSwapper sw(tmp.path(), 0);
    dir = sw.directory();
    sw.reserve("unit0/master", 1 << 20);
    sw.reserve("unit0/m", 1 << 20);
    sw.check_space();
    PinnedBuffer buf = pool.acquire(1 << 20);
    fill_random(buf.data(), 1 << 20, 5);
    SwapHandle pending = sw.write_async("unit0/master", buf.data(), 1 << 20);  // in flight at the throw
    REQUIRE(list_dir(dir).size() == 2);
    throw std::runtime_error("the step failed");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()) == "the step failed");
  }
  CHECK_FALSE(exists(dir));
  CHECK_FALSE(exists(dir + ".lock"));
  CHECK(list_dir(tmp.path()).empty());
}
