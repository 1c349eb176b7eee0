// NvmeSwapper: request bookkeeping on the caller's side, and one I/O thread that cuts requests
// into block-sized pieces, keeps up to queue_depth of them in flight (io_uring, or pread/pwrite
// as a fallback), resubmits short and interrupted transfers, and checks every block's checksum.
#include "zero/offload/nvme_swapper.hpp"

#include <fcntl.h>
#include <liburing.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "checksum.hpp"
#include "zero/error.hpp"

namespace zero::offload {
namespace detail {
namespace {

constexpr std::size_t kPage = 4096;
constexpr int kMaxRetries = 1000;  // EINTR/EAGAIN resubmissions of one request before giving up

std::size_t round_up(std::size_t x, std::size_t a) { return (x + a - 1) / a * a; }

std::string errno_text(int err) {
  std::string name;
  switch (err) {
    case ENOSPC: name = "ENOSPC"; break;
    case EIO: name = "EIO"; break;
    case EINVAL: name = "EINVAL"; break;
    case EDQUOT: name = "EDQUOT"; break;
    case EROFS: name = "EROFS"; break;
    case EACCES: name = "EACCES"; break;
    case ENOENT: name = "ENOENT"; break;
    default: name = "errno " + std::to_string(err);
  }
  return std::string(std::strerror(err)) + " (" + name + ")";
}

std::string human_bytes(std::uint64_t b) {
  char buf[64];
  const double x = static_cast<double>(b);
  if (b >= (1ULL << 30)) {
    std::snprintf(buf, sizeof buf, "%.2f GiB", x / (1ULL << 30));
  } else if (b >= (1ULL << 20)) {
    std::snprintf(buf, sizeof buf, "%.2f MiB", x / (1ULL << 20));
  } else {
    std::snprintf(buf, sizeof buf, "%llu bytes", static_cast<unsigned long long>(b));
  }
  return std::string(buf) + " (" + std::to_string(b) + " bytes)";
}

// Keys become file names: [A-Za-z0-9._-] kept, anything else (the '/' of "unit3/master") as %XX,
// which is unambiguous and keeps every file directly in the rank directory.
std::string file_name_for(const std::string& key) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (const unsigned char ch : key) {
    if (std::isalnum(ch) || ch == '.' || ch == '_' || ch == '-') {
      out += static_cast<char>(ch);
    } else {
      out += '%';
      out += hex[ch >> 4];
      out += hex[ch & 15];
    }
  }
  return out + ".swp";
}

void note(const std::string& text) {
  std::fprintf(stderr, "%snote: %s\n", rank_prefix().c_str(), text.c_str());
}

}  // namespace

struct KeyState {
  std::string path;
  std::size_t reserved = 0;
  std::size_t written = 0;  // bytes of the last successful write
  bool valid = false;       // a write completed and nothing has overwritten it since
  bool busy = false;        // a transfer is in progress
  bool created = false;     // this swapper created the file
  std::vector<std::uint64_t> sums;  // per block, of the last write
};

struct SwapRequest {
  bool write = false;
  std::string key;
  KeyState* ks = nullptr;
  int fd = -1;
  unsigned char* buf = nullptr;
  std::size_t bytes = 0;
  std::size_t nblocks = 0;
  // Submission cursor (I/O thread only).
  std::size_t next_block = 0;
  int next_segment = 0;
  // Completion accounting (I/O thread only).
  std::size_t blocks_left = 0;
  int last_block_segments_left = 0;
  int inflight = 0;
  int verifying = 0;  // blocks read but not yet checked; the buffer is still in use
  bool failed = false;
  bool finished = false;
  std::string error;
  bool done = false;  // guarded by SwapCore::mutex
};

// Splits a transfer into blocks. With O_DIRECT a last block whose length is not a page multiple
// travels as two pieces (its aligned part and one bounced page), which its completion counts.
void plan_blocks(SwapRequest& r, std::size_t bytes, std::size_t block_size, bool direct) {
  r.bytes = bytes;
  r.nblocks = (bytes + block_size - 1) / block_size;
  r.blocks_left = r.nblocks;
  const std::size_t last = bytes - (r.nblocks - 1) * block_size;
  r.last_block_segments_left = direct ? (last >= kPage ? 1 : 0) + (last % kPage != 0 ? 1 : 0) : 1;
}

// One I/O request in flight: a block, or part of the last block.
struct Chunk {
  std::shared_ptr<SwapRequest> req;
  std::size_t block = 0;
  std::uint64_t offset = 0;     // file offset of the request's first byte
  unsigned char* ptr = nullptr; // memory of the request's first byte
  std::size_t length = 0;       // bytes asked of the kernel
  std::size_t need = 0;         // bytes that must arrive (a bounced read may stop short)
  std::size_t done = 0;
  unsigned char* tail_dst = nullptr;  // bounced read: where the `need` bytes go
  int retries = 0;
  unsigned char* page = nullptr;      // this slot's bounce page
};

struct SwapCore {
  AioOptions opt;
  std::string dir;
  bool uring = false;
  bool direct = false;
  io_uring ring{};
  SwapFaultHook hook;

  std::mutex mutex;
  std::condition_variable work_cv;  // new requests, or stop
  std::condition_variable done_cv;  // a request finished
  std::deque<std::shared_ptr<SwapRequest>> queue;
  std::map<std::string, KeyState> keys;
  bool stop = false;
  std::thread worker;

  // I/O thread state.
  std::vector<Chunk> chunks;
  std::vector<int> free_chunks;
  std::vector<std::pair<int, int>> sync_done;  // (chunk, result) in pread/pwrite mode
  // Blocks read but not yet checksummed. Checking waits until replacement requests have been
  // submitted, so the disk is never idle while the CPU hashes.
  std::vector<std::pair<std::shared_ptr<SwapRequest>, std::size_t>> to_verify;
  int inflight = 0;
  unsigned char* pages = nullptr;

  ~SwapCore() {
    if (uring) io_uring_queue_exit(&ring);
    std::free(pages);
  }

  void run();
  void fill();
  void reap();
  void submit(int idx);
  void complete(int idx, int res);
  void segment_done(Chunk& c);
  void verify_pending();
  void fail(SwapRequest& r, const std::string& message);
  void maybe_finish(SwapRequest& r);
  std::size_t block_bytes(const SwapRequest& r, std::size_t b) const {
    const std::size_t off = b * opt.block_size;
    return std::min(opt.block_size, r.bytes - off);
  }
};

void SwapCore::run() {
  for (;;) {
    fill();
    if (!to_verify.empty()) {
      verify_pending();
      continue;
    }
    if (inflight == 0) {
      std::unique_lock lock(mutex);
      work_cv.wait(lock, [&] { return stop || !queue.empty(); });
      if (queue.empty()) return;  // stop requested and nothing left to do
      continue;
    }
    reap();
  }
}

// Starts as many pieces as free slots allow, oldest request first, then checksums the blocks
// just handed to the kernel while they are being written.
void SwapCore::fill() {
  int started = 0;
  std::pair<SwapRequest*, std::size_t> to_hash[1024];
  int hash_count = 0;
  while (!free_chunks.empty()) {
    std::shared_ptr<SwapRequest> r;
    {
      std::lock_guard lock(mutex);
      while (!queue.empty() &&
             (queue.front()->failed || queue.front()->next_block >= queue.front()->nblocks)) {
        queue.pop_front();
      }
      if (queue.empty()) break;
      r = queue.front();
    }
    const std::size_t b = r->next_block;
    const std::size_t off = b * opt.block_size;
    const std::size_t len = block_bytes(*r, b);
    // With O_DIRECT the kernel needs page multiples: a last block of odd length goes as its
    // page-aligned part plus one bounced page for the remainder.
    const std::size_t aligned = direct ? len / kPage * kPage : len;
    const std::size_t rest = len - aligned;
    const int idx = free_chunks.back();
    free_chunks.pop_back();
    Chunk& c = chunks[idx];
    c.req = r;
    c.block = b;
    c.done = 0;
    c.retries = 0;
    c.tail_dst = nullptr;
    const bool first_segment = r->next_segment == 0;
    if (first_segment && aligned > 0) {
      c.offset = off;
      c.ptr = r->buf + off;
      c.length = c.need = aligned;
      r->next_segment = rest > 0 ? 1 : 0;
    } else {
      c.offset = off + aligned;
      c.length = kPage;
      c.ptr = c.page;
      if (r->write) {
        std::memcpy(c.page, r->buf + off + aligned, rest);
        std::memset(c.page + rest, 0, kPage - rest);
        c.need = kPage;
      } else {
        c.need = rest;
        c.tail_dst = r->buf + off + aligned;
      }
      r->next_segment = 0;
    }
    if (r->next_segment == 0) ++r->next_block;
    if (r->write && first_segment && hash_count < 1024) to_hash[hash_count++] = {r.get(), b};
    ++r->inflight;
    ++inflight;
    submit(idx);
    ++started;
  }
  if (uring && started > 0) {
    int rc;
    do {
      rc = io_uring_submit(&ring);
    } while (rc == -EINTR || rc == -EAGAIN);
    // A failure here leaves the entries in the submission queue; the next submit retries them.
  }
  for (int i = 0; i < hash_count; ++i) {
    SwapRequest& r = *to_hash[i].first;
    const std::size_t b = to_hash[i].second;
    r.ks->sums[b] = checksum64(r.buf + b * opt.block_size, block_bytes(r, b), b);
  }
}

void SwapCore::submit(int idx) {
  Chunk& c = chunks[idx];
  SwapRequest& r = *c.req;
  unsigned char* p = c.ptr + c.done;
  const std::size_t n = c.length - c.done;
  const auto off = static_cast<off_t>(c.offset + c.done);
  if (uring) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring);
    if (sqe == nullptr) {  // the ring is sized to queue_depth, so this only follows a failed submit
      io_uring_submit(&ring);
      sqe = io_uring_get_sqe(&ring);
    }
    if (sqe == nullptr) {
      sync_done.emplace_back(idx, -EAGAIN);
      return;
    }
    if (r.write) {
      io_uring_prep_write(sqe, r.fd, p, static_cast<unsigned>(n), static_cast<__u64>(off));
    } else {
      io_uring_prep_read(sqe, r.fd, p, static_cast<unsigned>(n), static_cast<__u64>(off));
    }
    io_uring_sqe_set_data64(sqe, static_cast<__u64>(idx));
    return;
  }
  const ssize_t got = r.write ? ::pwrite(r.fd, p, n, off) : ::pread(r.fd, p, n, off);
  sync_done.emplace_back(idx, got < 0 ? -errno : static_cast<int>(got));
}

void SwapCore::reap() {
  // Results that never reached the kernel (pread/pwrite mode, or no free submission entry).
  while (!sync_done.empty()) {
    auto [idx, res] = sync_done.front();
    sync_done.erase(sync_done.begin());
    complete(idx, res);
  }
  if (!uring || inflight == 0) return;
  io_uring_submit(&ring);  // anything resubmitted by complete() above
  io_uring_cqe* cqe = nullptr;
  const int rc = io_uring_wait_cqe(&ring, &cqe);
  if (rc == -EINTR || rc == -EAGAIN) return;
  if (rc < 0) {
    // The ring itself is broken and no completion will come: end every piece in flight with
    // the error, so their requests fail and their waiters wake up.
    for (std::size_t i = 0; i < chunks.size(); ++i) {
      if (chunks[i].req) complete(static_cast<int>(i), rc);
    }
    return;
  }
  unsigned seen = 0;
  unsigned head;
  io_uring_for_each_cqe(&ring, head, cqe) {
    complete(static_cast<int>(io_uring_cqe_get_data64(cqe)), cqe->res);
    ++seen;
  }
  io_uring_cq_advance(&ring, seen);
  io_uring_submit(&ring);
}

void SwapCore::complete(int idx, int res) {
  Chunk& c = chunks[idx];
  SwapRequest& r = *c.req;
  if (hook) {
    const SwapIoEvent ev{r.write, r.ks->path, c.offset + c.done, c.length - c.done, res};
    if (auto replaced = hook(ev)) res = *replaced;
  }
  const std::uint64_t at = c.offset + c.done;
  bool resubmit = false;
  if (r.failed) {
    // The request already failed; drain this piece without further work.
  } else if (res == -EINTR || res == -EAGAIN) {
    if (++c.retries <= kMaxRetries) {
      resubmit = true;
    } else {
      fail(r, "NVMe swap " + std::string(r.write ? "write to " : "read from ") + r.ks->path +
                  " kept failing with " + errno_text(-res) + " at offset " + std::to_string(at) +
                  " after " + std::to_string(kMaxRetries) + " retries; the device is overloaded "
                  "or failing (check dmesg)");
    }
  } else if (res < 0) {
    std::string msg = "NVMe swap " + std::string(r.write ? "write to " : "read from ") +
                      r.ks->path + " failed at offset " + std::to_string(at) + " (block " +
                      std::to_string(c.block) + "): " + errno_text(-res) + ".";
    if (-res == ENOSPC || -res == EDQUOT) {
      msg += " The filesystem holding " + dir + " is full. Call check_space() before training "
             "(the engine does), free space there, or point nvme_path at a larger device.";
    } else if (-res == EINVAL && direct) {
      msg += " The filesystem rejected an O_DIRECT transfer; set AioOptions::direct_io = false "
             "or use a local NVMe filesystem (ext4, xfs).";
    } else {
      msg += " Check the device (dmesg) and that nothing else modifies " + dir + ".";
    }
    fail(r, msg);
  } else if (res == 0 && c.done < c.need) {
    if (r.write) {
      fail(r, "NVMe swap write to " + r.ks->path + " made no progress at offset " +
                  std::to_string(at) + " (block " + std::to_string(c.block) +
                  "); the filesystem may be full (check df " + dir + ")");
    } else {
      fail(r, "swap file " + r.ks->path + " is truncated: block " + std::to_string(c.block) +
                  " (file bytes " + std::to_string(c.block * opt.block_size) + ".." +
                  std::to_string(c.block * opt.block_size + block_bytes(r, c.block)) +
                  ") ends early at offset " + std::to_string(at) +
                  ". The file was cut or replaced while in use; do not clean " + dir +
                  " during training");
    }
  } else {
    c.done += static_cast<std::size_t>(res);
    if (c.done < c.need) {
      // Short transfer: the kernel may stop early (signals, memory pressure); send the rest.
      // An O_DIRECT read that ends off a page boundary can only have hit the end of the file.
      if (!r.write && direct && c.done % kPage != 0) {
        fail(r, "swap file " + r.ks->path + " is truncated: block " + std::to_string(c.block) +
                    " ends at file offset " + std::to_string(c.offset + c.done) +
                    "; do not clean " + dir + " during training");
      } else {
        resubmit = true;
      }
    } else {
      segment_done(c);
    }
  }
  if (resubmit) {
    submit(idx);
    return;
  }
  std::shared_ptr<SwapRequest> keep = std::move(c.req);
  free_chunks.push_back(idx);
  --inflight;
  --r.inflight;
  maybe_finish(r);
}

void SwapCore::segment_done(Chunk& c) {
  SwapRequest& r = *c.req;
  if (c.tail_dst != nullptr) std::memcpy(c.tail_dst, c.ptr, c.need);
  const bool last = c.block + 1 == r.nblocks;
  if (last && --r.last_block_segments_left > 0) return;
  if (r.write) {
    --r.blocks_left;
    return;
  }
  ++r.verifying;
  to_verify.emplace_back(c.req, c.block);
}

void SwapCore::verify_pending() {
  for (auto& [req, b] : to_verify) {
    SwapRequest& r = *req;
    --r.verifying;
    --r.blocks_left;
    if (!r.failed) {
      const std::size_t off = b * opt.block_size;
      const std::size_t len = block_bytes(r, b);
      if (checksum64(r.buf + off, len, b) != r.ks->sums[b]) {
        fail(r, "checksum mismatch in swap file " + r.ks->path + ", block " + std::to_string(b) +
                    " (file bytes " + std::to_string(off) + ".." + std::to_string(off + len) +
                    "): the data read back differs from what was written. Something modified "
                    "the file or the device returned bad data; check dmesg and the drive's "
                    "health, and resume from the last checkpoint");
      }
    }
    maybe_finish(r);
  }
  to_verify.clear();
}

void SwapCore::fail(SwapRequest& r, const std::string& message) {
  if (!r.failed) {
    r.failed = true;
    r.error = message;
  }
}

void SwapCore::maybe_finish(SwapRequest& r) {
  if (r.finished || r.inflight > 0 || r.verifying > 0) return;
  if (!r.failed && r.blocks_left > 0) return;
  r.finished = true;
  if (r.fd >= 0) ::close(r.fd);
  r.fd = -1;
  std::lock_guard lock(mutex);
  r.ks->busy = false;
  if (r.write) {
    r.ks->valid = !r.failed;
    r.ks->written = r.failed ? 0 : r.bytes;
  }
  r.done = true;
  done_cv.notify_all();
}

}  // namespace detail

using detail::KeyState;
using detail::SwapCore;
using detail::SwapRequest;

// ---- SwapHandle ----

namespace {
// A handle dropped without wait() still has to hold its buffer's owner back until the transfer
// ends; a failure it carries can only be reported, not thrown, from a destructor.
void wait_quietly(SwapHandle& h) noexcept {
  try {
    h.wait();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%serror: an NVMe swap transfer nobody waited for failed: %s\n",
                 rank_prefix().c_str(), e.what());
  }
}
}  // namespace

SwapHandle& SwapHandle::operator=(SwapHandle&& other) noexcept {
  if (this != &other) {
    wait_quietly(*this);
    core_ = std::move(other.core_);
    req_ = std::move(other.req_);
  }
  return *this;
}

SwapHandle::~SwapHandle() { wait_quietly(*this); }

bool SwapHandle::ready() const {
  if (!req_) return true;
  std::lock_guard lock(core_->mutex);
  return req_->done;
}

void SwapHandle::wait() {
  if (!req_) return;
  {
    std::unique_lock lock(core_->mutex);
    core_->done_cv.wait(lock, [&] { return req_->done; });
  }
  const std::shared_ptr<SwapRequest> req = std::move(req_);
  core_.reset();
  if (req->failed) ZERO_THROW(req->error);
}

// ---- NvmeSwapper ----

NvmeSwapper::NvmeSwapper(const std::string& nvme_path, int rank, const AioOptions& options)
    : core_(std::make_shared<SwapCore>()) {
  SwapCore& c = *core_;
  c.opt = options;
  ZERO_CHECK(options.block_size > 0 && options.block_size % detail::kPage == 0 &&
                 options.block_size <= (std::size_t{1} << 30),
             "aio.block_size must be a positive multiple of 4096 up to 1 GiB (got " +
                 std::to_string(options.block_size) + ")");
  ZERO_CHECK(options.queue_depth >= 1 && options.queue_depth <= 1024,
             "aio.queue_depth must be between 1 and 1024 (got " +
                 std::to_string(options.queue_depth) + ")");
  ZERO_CHECK(!nvme_path.empty(), "nvme_path is empty; set offload_optimizer.nvme_path "
                                 "(or offload_param.nvme_path) to a directory on a local disk");
  struct stat st{};
  ZERO_CHECK(::stat(nvme_path.c_str(), &st) == 0 && S_ISDIR(st.st_mode),
             "nvme_path '" + nvme_path + "' is not an existing directory; create it or fix "
             "offload_optimizer.nvme_path / offload_param.nvme_path");
  c.dir = nvme_path + (nvme_path.back() == '/' ? "" : "/") + "zero_rank" + std::to_string(rank);
  if (::mkdir(c.dir.c_str(), 0700) != 0 && errno != EEXIST) {
    ZERO_THROW("cannot create the swap directory " + c.dir + ": " +
               detail::errno_text(errno) + "; check permissions on " + nvme_path);
  }

  // O_DIRECT support is a property of the filesystem: probe it once with a real aligned write.
  if (options.direct_io) {
    const std::string probe = c.dir + "/.direct_probe";
    const int fd = ::open(probe.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0600);
    if (fd >= 0) {
      void* page = nullptr;
      if (posix_memalign(&page, detail::kPage, detail::kPage) == 0) {
        std::memset(page, 0, detail::kPage);
        c.direct = ::pwrite(fd, page, detail::kPage, 0) == static_cast<ssize_t>(detail::kPage);
        std::free(page);
      }
      ::close(fd);
    }
    const int err = errno;
    ::unlink(probe.c_str());
    if (!c.direct) {
      detail::note("O_DIRECT is not supported on " + c.dir + " (" + detail::errno_text(err) +
                   "; tmpfs or a network filesystem?); NVMe swap uses buffered I/O there");
    }
  }

  if (options.use_io_uring) {
    const int rc = io_uring_queue_init(static_cast<unsigned>(options.queue_depth), &c.ring, 0);
    if (rc == 0) {
      c.uring = true;
    } else {
      detail::note("io_uring is unavailable (" + detail::errno_text(-rc) +
                   "; old kernel or a seccomp profile that blocks it); NVMe swap falls back to "
                   "pread/pwrite, one request at a time");
    }
  }

  const std::size_t slots = static_cast<std::size_t>(options.queue_depth);
  void* pages = nullptr;
  ZERO_CHECK(posix_memalign(&pages, detail::kPage, slots * detail::kPage) == 0,
             "out of host memory for NVMe swap bounce pages");
  c.pages = static_cast<unsigned char*>(pages);
  c.chunks.resize(slots);
  for (std::size_t i = 0; i < slots; ++i) {
    c.chunks[i].page = c.pages + i * detail::kPage;
    c.free_chunks.push_back(static_cast<int>(slots - 1 - i));
  }
  c.sync_done.reserve(slots);
  c.to_verify.reserve(slots);
  c.worker = std::thread([core = core_.get()] { core->run(); });
}

NvmeSwapper::~NvmeSwapper() {
  SwapCore& c = *core_;
  {
    std::lock_guard lock(c.mutex);
    c.stop = true;
  }
  c.work_cv.notify_all();
  if (c.worker.joinable()) c.worker.join();
  if (!c.opt.keep_files) {
    for (const auto& [key, ks] : c.keys) {
      if (ks.created) ::unlink(ks.path.c_str());
    }
    ::rmdir(c.dir.c_str());  // only succeeds when empty; other files are not ours to remove
  }
}

void NvmeSwapper::reserve(const std::string& key, std::size_t bytes) {
  ZERO_CHECK(!key.empty(), "NvmeSwapper::reserve: the key is empty");
  std::lock_guard lock(core_->mutex);
  KeyState& ks = core_->keys[key];
  if (ks.path.empty()) ks.path = core_->dir + "/" + detail::file_name_for(key);
  ks.reserved = std::max(ks.reserved, bytes);
}

std::uint64_t NvmeSwapper::bytes_reserved() const {
  std::lock_guard lock(core_->mutex);
  std::uint64_t total = 0;
  for (const auto& [key, ks] : core_->keys) total += detail::round_up(ks.reserved, detail::kPage);
  return total;
}

void NvmeSwapper::check_space() {
  SwapCore& c = *core_;
  std::lock_guard lock(c.mutex);
  // Space still to be claimed: the reserved size minus what existing files already hold.
  std::uint64_t needed = 0;
  for (const auto& [key, ks] : c.keys) {
    const std::uint64_t want = detail::round_up(ks.reserved, detail::kPage);
    struct stat st{};
    const std::uint64_t have =
        ::stat(ks.path.c_str(), &st) == 0 ? static_cast<std::uint64_t>(st.st_blocks) * 512 : 0;
    if (want > have) needed += want - have;
  }
  struct statvfs vfs{};
  ZERO_CHECK(::statvfs(c.dir.c_str(), &vfs) == 0,
             "statvfs(" + c.dir + ") failed: " + detail::errno_text(errno));
  const std::uint64_t free_bytes = static_cast<std::uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  ZERO_CHECK(needed <= free_bytes,
             "not enough disk space for NVMe swap in " + c.dir + ": " +
                 std::to_string(c.keys.size()) + " swapped tensors need " +
                 detail::human_bytes(needed) + " more, but only " +
                 detail::human_bytes(free_bytes) + " are free. Free space there, point nvme_path "
                 "at a larger device, use more ranks, or offload to cpu instead of nvme");
  // Claim the space now so no write can hit ENOSPC mid-step.
  for (auto& [key, ks] : c.keys) {
    const auto want = static_cast<off_t>(detail::round_up(ks.reserved, detail::kPage));
    if (want == 0) continue;
    const int fd = ::open(ks.path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    ZERO_CHECK(fd >= 0, "cannot create swap file " + ks.path + ": " + detail::errno_text(errno));
    ks.created = true;
    const int rc = ::posix_fallocate(fd, 0, want);
    ::close(fd);
    if (rc == ENOSPC || rc == EDQUOT) {
      ZERO_THROW("not enough disk space for NVMe swap in " + c.dir + ": preallocating " +
                 detail::human_bytes(static_cast<std::uint64_t>(want)) + " for " + ks.path +
                 " failed with " + detail::errno_text(rc) +
                 ". Free space there or point nvme_path at a larger device");
    }
    // Other failures (a filesystem without fallocate) leave allocation to the writes.
  }
}

SwapHandle NvmeSwapper::write_async(const std::string& key, const void* src, std::size_t bytes) {
  SwapCore& c = *core_;
  auto req = std::make_shared<SwapRequest>();
  SwapHandle h;
  std::lock_guard lock(c.mutex);
  auto it = c.keys.find(key);
  ZERO_CHECK(it != c.keys.end(), "NvmeSwapper::write_async: key '" + key +
                                     "' was not reserved; call reserve(key, bytes) before "
                                     "training so check_space() can account for it");
  KeyState& ks = it->second;
  ZERO_CHECK(bytes <= ks.reserved, "NvmeSwapper::write_async: " + std::to_string(bytes) +
                                       " bytes for key '" + key + "' exceed its reservation of " +
                                       std::to_string(ks.reserved) + "; reserve the largest size");
  ZERO_CHECK(!ks.busy, "NvmeSwapper::write_async: key '" + key +
                           "' has a transfer in progress; wait for its handle first");
  ZERO_CHECK(bytes == 0 || src != nullptr, "NvmeSwapper::write_async: null source buffer");
  ZERO_CHECK(!c.direct || reinterpret_cast<std::uintptr_t>(src) % detail::kPage == 0,
             "NvmeSwapper::write_async: the buffer for key '" + key +
                 "' is not 4096-byte aligned, which O_DIRECT needs; allocate it from a PinnedPool");
  ks.valid = false;
  if (bytes == 0) {
    ks.valid = true;
    ks.written = 0;
    req->done = req->finished = true;
    h.core_ = core_;
    h.req_ = req;
    return h;
  }
  const int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (c.direct ? O_DIRECT : 0);
  const int fd = ::open(ks.path.c_str(), flags, 0600);
  ZERO_CHECK(fd >= 0, "cannot open swap file " + ks.path + " for writing: " +
                          detail::errno_text(errno) + "; check permissions and space on " + c.dir);
  ks.created = true;
  ks.busy = true;
  req->write = true;
  req->key = key;
  req->ks = &ks;
  req->fd = fd;
  req->buf = static_cast<unsigned char*>(const_cast<void*>(src));
  detail::plan_blocks(*req, bytes, c.opt.block_size, c.direct);
  ks.sums.resize(req->nblocks);
  c.queue.push_back(req);
  c.work_cv.notify_one();
  // The handle is filled last: a handle holding a request that never reached the queue would
  // wait for it forever when an exception above destroys it.
  h.core_ = core_;
  h.req_ = req;
  return h;
}

SwapHandle NvmeSwapper::read_async(const std::string& key, void* dst, std::size_t bytes) {
  SwapCore& c = *core_;
  auto req = std::make_shared<SwapRequest>();
  SwapHandle h;
  std::lock_guard lock(c.mutex);
  auto it = c.keys.find(key);
  ZERO_CHECK(it != c.keys.end(),
             "NvmeSwapper::read_async: key '" + key + "' was never reserved or written");
  KeyState& ks = it->second;
  ZERO_CHECK(!ks.busy, "NvmeSwapper::read_async: key '" + key +
                           "' has a transfer in progress; wait for its handle first");
  ZERO_CHECK(ks.valid, "NvmeSwapper::read_async: key '" + key +
                           "' has no completed write to read back (never written, or the last "
                           "write failed)");
  ZERO_CHECK(bytes == ks.written, "NvmeSwapper::read_async: asked for " + std::to_string(bytes) +
                                      " bytes of key '" + key + "' but " +
                                      std::to_string(ks.written) + " were written");
  ZERO_CHECK(bytes == 0 || dst != nullptr, "NvmeSwapper::read_async: null destination buffer");
  ZERO_CHECK(!c.direct || reinterpret_cast<std::uintptr_t>(dst) % detail::kPage == 0,
             "NvmeSwapper::read_async: the buffer for key '" + key +
                 "' is not 4096-byte aligned, which O_DIRECT needs; allocate it from a PinnedPool");
  if (bytes == 0) {
    req->done = req->finished = true;
    h.core_ = core_;
    h.req_ = req;
    return h;
  }
  const int fd = ::open(ks.path.c_str(), O_RDONLY | O_CLOEXEC | (c.direct ? O_DIRECT : 0));
  ZERO_CHECK(fd >= 0, "cannot open swap file " + ks.path + " for reading: " +
                          detail::errno_text(errno) + "; was it deleted during training?");
  struct stat st{};
  const std::uint64_t expect = c.direct ? detail::round_up(bytes, detail::kPage) : bytes;
  if (::fstat(fd, &st) != 0 || static_cast<std::uint64_t>(st.st_size) < expect) {
    ::close(fd);
    const std::uint64_t size = static_cast<std::uint64_t>(st.st_size);
    ZERO_THROW("swap file " + ks.path + " is truncated: it has " + std::to_string(size) +
               " bytes but " + std::to_string(expect) + " were written (block " +
               std::to_string(size / c.opt.block_size) + " onwards is missing). Something cut "
               "the file during training; do not clean " + c.dir + " while a job runs");
  }
  ks.busy = true;
  req->write = false;
  req->key = key;
  req->ks = &ks;
  req->fd = fd;
  req->buf = static_cast<unsigned char*>(dst);
  detail::plan_blocks(*req, bytes, c.opt.block_size, c.direct);
  c.queue.push_back(req);
  c.work_cv.notify_one();
  h.core_ = core_;
  h.req_ = req;
  return h;
}

const std::string& NvmeSwapper::directory() const { return core_->dir; }

std::string NvmeSwapper::file_path(const std::string& key) const {
  return core_->dir + "/" + detail::file_name_for(key);
}

bool NvmeSwapper::using_io_uring() const { return core_->uring; }
bool NvmeSwapper::using_direct_io() const { return core_->direct; }
const AioOptions& NvmeSwapper::options() const { return core_->opt; }

void NvmeSwapper::set_fault_hook(SwapFaultHook hook) {
  std::lock_guard lock(core_->mutex);
  core_->hook = std::move(hook);
}

}  // namespace zero::offload
