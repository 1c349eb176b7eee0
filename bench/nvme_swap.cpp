// bench_nvme_swap: does the NvmeSwapper (blocking into requests, checksums, the I/O thread) keep
// up with the disk? Writes and reads the same bytes through the swapper and through a raw
// io_uring loop with O_DIRECT, the same block size and the same queue depth, on the same
// directory, in the same run, alternating the two so drift in the device affects both.
#include <fcntl.h>
#include <liburing.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "timing.hpp"
#include "offload/nvme_swapper.hpp"
#include "offload/pinned_pool.hpp"

using namespace zero::offload;

namespace {

using zero::bench::now_s;

[[noreturn]] void die(const std::string& what, int err) {
  std::fprintf(stderr, "bench_nvme_swap: %s: %s\n", what.c_str(), std::strerror(err));
  std::exit(1);
}

// The yardstick: sequential O_DIRECT transfers of block_size with queue_depth in flight.
class RawRing {
 public:
  RawRing(const std::string& file, bool direct, unsigned depth) : depth_(depth) {
    fd_ = ::open(file.c_str(), O_RDWR | O_CREAT | (direct ? O_DIRECT : 0), 0600);
    if (fd_ < 0) die("open " + file, errno);
    const int rc = io_uring_queue_init(depth, &ring_, 0);
    if (rc < 0) die("io_uring_queue_init", -rc);
  }
  ~RawRing() {
    io_uring_queue_exit(&ring_);
    ::close(fd_);
  }
  RawRing(const RawRing&) = delete;
  RawRing& operator=(const RawRing&) = delete;

  void run(bool write, unsigned char* buf, std::size_t bytes, std::size_t block) {
    std::size_t next = 0, done = 0;
    unsigned inflight = 0;
    while (done < bytes) {
      while (inflight < depth_ && next < bytes) {
        const std::size_t len = std::min(block, bytes - next);
        io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
        if (write) {
          io_uring_prep_write(sqe, fd_, buf + next, static_cast<unsigned>(len), next);
        } else {
          io_uring_prep_read(sqe, fd_, buf + next, static_cast<unsigned>(len), next);
        }
        io_uring_sqe_set_data64(sqe, len);
        next += len;
        ++inflight;
      }
      io_uring_submit(&ring_);
      io_uring_cqe* cqe = nullptr;
      if (const int rc = io_uring_wait_cqe(&ring_, &cqe); rc < 0) die("io_uring_wait_cqe", -rc);
      if (cqe->res < 0) die(write ? "raw write" : "raw read", -cqe->res);
      if (static_cast<std::uint64_t>(cqe->res) != io_uring_cqe_get_data64(cqe)) {
        std::fprintf(stderr, "bench_nvme_swap: short raw transfer\n");
        std::exit(1);
      }
      done += static_cast<std::size_t>(cqe->res);
      --inflight;
      io_uring_cqe_seen(&ring_, cqe);
    }
  }

 private:
  int fd_ = -1;
  unsigned depth_;
  io_uring ring_{};
};

// "t<k>", built by appending (GCC 12 warns falsely on "literal" + std::to_string at -O3).
std::string key_of(std::size_t k) {
  std::string s("t");
  s += std::to_string(k);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"NVMe swapper read/write throughput against a raw O_DIRECT io_uring loop"};
  std::string path = "/tmp";
  std::size_t size_mib = 1024;
  std::size_t block_kib = 1024;
  int depth = 8;
  int tensors = 4;
  int reps = 3;
  app.add_option("--path", path, "directory on the disk to measure (default /tmp)");
  app.add_option("--size-mib", size_mib, "bytes moved per direction per rep, in MiB");
  app.add_option("--block-kib", block_kib, "aio block size in KiB (default 1024)");
  app.add_option("--queue-depth", depth, "requests in flight (default 8)");
  app.add_option("--tensors", tensors, "the swapper moves the bytes as this many keys at once");
  app.add_option("--reps", reps, "repetitions; the best of each is reported");
  CLI11_PARSE(app, argc, argv);

  const std::size_t bytes = size_mib << 20;
  const std::size_t block = block_kib << 10;
  AioOptions opt;
  opt.block_size = block;
  opt.queue_depth = depth;
  NvmeSwapper swapper(path, 0, opt);
  const bool direct = swapper.using_direct_io();

  PinnedPool pool(false);
  PinnedBuffer buf = pool.acquire(bytes);
  {
    std::mt19937_64 rng(1);
    auto* w = buf.as<std::uint64_t>();
    for (std::size_t i = 0; i < bytes / 8; ++i) w[i] = rng();
  }
  // The swapper's keys split the buffer into page-aligned pieces.
  std::vector<std::size_t> offsets, sizes;
  const std::size_t piece = (bytes / static_cast<std::size_t>(tensors) + 4095) / 4096 * 4096;
  for (std::size_t off = 0; off < bytes; off += piece) {
    offsets.push_back(off);
    sizes.push_back(std::min(piece, bytes - off));
    swapper.reserve(key_of(offsets.size() - 1), sizes.back());
  }
  swapper.check_space();

  const std::string raw_file = swapper.directory() + "/raw_yardstick.bin";
  RawRing raw(raw_file, direct, static_cast<unsigned>(depth));
  if (const int fd = ::open(raw_file.c_str(), O_WRONLY); fd >= 0) {
    ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));  // as check_space() does for the keys
    ::close(fd);
  }

  auto swap_all = [&](bool write) {
    std::vector<SwapHandle> hs;
    for (std::size_t k = 0; k < offsets.size(); ++k) {
      const std::string key = key_of(k);
      hs.push_back(write ? swapper.write_async(key, buf.as<unsigned char>() + offsets[k], sizes[k])
                         : swapper.read_async(key, buf.as<unsigned char>() + offsets[k], sizes[k]));
    }
    for (auto& h : hs) h.wait();
  };

  const double inf = std::numeric_limits<double>::infinity();
  double raw_w = inf, raw_r = inf, sw_w = inf, sw_r = inf;
  // Warm-up: allocates both files' blocks and starts the I/O thread.
  raw.run(true, buf.as<unsigned char>(), bytes, block);
  swap_all(true);
  for (int r = 0; r < reps; ++r) {
    double t = now_s();
    raw.run(true, buf.as<unsigned char>(), bytes, block);
    raw_w = std::min(raw_w, now_s() - t);
    t = now_s();
    swap_all(true);
    sw_w = std::min(sw_w, now_s() - t);
    t = now_s();
    raw.run(false, buf.as<unsigned char>(), bytes, block);
    raw_r = std::min(raw_r, now_s() - t);
    t = now_s();
    swap_all(false);  // verifies every block's checksum
    sw_r = std::min(sw_r, now_s() - t);
  }
  ::unlink(raw_file.c_str());

  const double gb = static_cast<double>(bytes) / 1e9;
  std::printf(
      "bench_nvme_swap: %s, %zu MiB per direction, block %zu KiB, queue depth %d, "
      "%zu keys, best of %d\n",
      swapper.directory().c_str(), size_mib, block_kib, depth, offsets.size(), reps);
  std::printf("I/O: %s, %s\n", swapper.using_io_uring() ? "io_uring" : "pread/pwrite fallback",
              direct ? "O_DIRECT" : "buffered (O_DIRECT unsupported here; page cache involved)");
  std::printf("\n%-6s | %12s | %12s | %7s\n", "", "raw GB/s", "swapper GB/s", "ratio");
  std::printf("%-6s | %12.2f | %12.2f | %6.1f%%\n", "write", gb / raw_w, gb / sw_w, 100.0 * raw_w / sw_w);
  std::printf("%-6s | %12.2f | %12.2f | %6.1f%%\n", "read", gb / raw_r, gb / sw_r, 100.0 * raw_r / sw_r);
  return 0;
}
