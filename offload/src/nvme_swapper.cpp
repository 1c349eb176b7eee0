// NvmeSwapper, the caller's side: the swap directory and its capability probes, keys and their
// files, the space check, and requests handed to the I/O thread (swap_io.cpp).
#include "offload/nvme_swapper.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "runtime/job_lock.hpp"
#include "runtime/log.hpp"
#include "runtime/strings.hpp"
#include "swap_core.hpp"
#include "zero/error.hpp"

namespace zero::offload {
namespace detail {
namespace {

// Keys become file names: [A-Za-z0-9._-] kept, anything else (the '/' of "unit3/master") as %XX,
// which is unambiguous and keeps every file directly in the rank directory.
std::string file_name_for(const std::string& key) {
  std::string out;
  for (const unsigned char ch : key) {
    if (std::isalnum(ch) || ch == '.' || ch == '_' || ch == '-') {
      out += static_cast<char>(ch);
    } else {
      fmt::format_to(std::back_inserter(out), "%{:02X}", ch);
    }
  }
  return out + ".swp";
}

// "1.50 GiB (1610612736 bytes)": the exact count too, for comparing with df.
std::string bytes_text(std::uint64_t b) { return fmt::format("{} ({} bytes)", format_bytes(b), b); }

// Swap files in a rank directory whose lock nobody held: a job that ended without running its
// destructors (SIGKILL, a node crash, an MPI abort) left them. They would count against the
// free-space check and fill the disk, and no live job reads them.
void reclaim_stale(const std::string& dir, const std::string& previous_holder) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::size_t count = 0;
  std::uint64_t bytes = 0;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const bool ours = name == ".direct_probe" || (name.size() > 4 && name.compare(name.size() - 4, 4, ".swp") == 0);
    struct stat st {};
    if (!ours || ::lstat(e.path().c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (::unlink(e.path().c_str()) != 0) {
      ZERO_THROW(fmt::format("cannot remove the stale swap file {} left by an earlier job: {}; delete it by hand",
                             e.path().string(), errno_text(errno)));
    }
    ++count;
    bytes += static_cast<std::uint64_t>(st.st_blocks) * 512;
  }
  if (count > 0) {
    log_warning("removed {} swap file{} ({}) from {}, left by a job that ended without cleaning up ({})", count,
                count == 1 ? "" : "s", bytes_text(bytes), dir,
                previous_holder.empty() ? std::string("holder unknown") : escape_bytes(previous_holder));
  }
}

}  // namespace
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
    log_error("an NVMe swap transfer nobody waited for failed: {}", e.what());
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
  ZERO_CHECK(
      options.block_size > 0 && options.block_size % detail::kPage == 0 && options.block_size <= (std::size_t{1} << 30),
      fmt::format("aio.block_size must be a positive multiple of 4096 up to 1 GiB (got {})", options.block_size));
  ZERO_CHECK(options.queue_depth >= 1 && options.queue_depth <= 1024,
             fmt::format("aio.queue_depth must be between 1 and 1024 (got {})", options.queue_depth));
  ZERO_CHECK(!nvme_path.empty(),
             "nvme_path is empty; set offload_optimizer.nvme_path "
             "(or offload_param.nvme_path) to a directory on a local disk");
  struct stat st {};
  ZERO_CHECK(::stat(nvme_path.c_str(), &st) == 0 && S_ISDIR(st.st_mode),
             "nvme_path '" + nvme_path +
                 "' is not an existing directory; create it or fix "
                 "offload_optimizer.nvme_path / offload_param.nvme_path");
  c.dir = fmt::format("{}{}zero_rank{}", nvme_path, nvme_path.back() == '/' ? "" : "/", rank);
  if (::mkdir(c.dir.c_str(), 0700) != 0 && errno != EEXIST) {
    ZERO_THROW("cannot create the swap directory " + c.dir + ": " + detail::errno_text(errno) +
               "; check permissions on " + nvme_path);
  }
  // The lock sits beside the directory, so the directory holds swap files only and can be
  // removed while the lock is still held. Swappers of one process (the parameter and the
  // optimizer swapper of one rank) share it.
  JobLock::Taken taken =
      JobLock::take(c.dir + ".lock", LockMode::exclusive, "the NVMe swap directory " + c.dir,
                    "wait for it to end or stop it, or give this job its own nvme_path (offload_optimizer.nvme_path, "
                    "offload_param.nvme_path)",
                    /*remove_file=*/true);
  c.lock = std::move(taken.lock);
  if (taken.first) detail::reclaim_stale(c.dir, taken.previous_holder);

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
      log_info(
          "O_DIRECT is not supported on {} ({}; tmpfs or a network filesystem?); NVMe swap uses buffered I/O "
          "there",
          c.dir, detail::errno_text(err));
    }
  }

  if (options.use_io_uring) {
    const int rc = io_uring_queue_init(static_cast<unsigned>(options.queue_depth), &c.ring, 0);
    if (rc == 0) {
      c.uring = true;
    } else {
      log_info(
          "io_uring is unavailable ({}; old kernel or a seccomp profile that blocks it); NVMe swap falls back "
          "to pread/pwrite, one request at a time",
          detail::errno_text(-rc));
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
  c.lock.reset();  // last: the directory is clean before another job may take it
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

NvmeSwapper::Space NvmeSwapper::space() const {
  SwapCore& c = *core_;
  std::lock_guard lock(c.mutex);
  Space sp;
  sp.dir = c.dir;
  // Space still to be claimed: the reserved size minus what existing files already hold.
  for (const auto& [key, ks] : c.keys) {
    const std::uint64_t want = detail::round_up(ks.reserved, detail::kPage);
    struct stat st {};
    const std::uint64_t have = ::stat(ks.path.c_str(), &st) == 0 ? static_cast<std::uint64_t>(st.st_blocks) * 512 : 0;
    if (want > have) sp.needed += want - have;
  }
  struct statvfs vfs {};
  ZERO_CHECK(::statvfs(c.dir.c_str(), &vfs) == 0, "statvfs(" + c.dir + ") failed: " + detail::errno_text(errno));
  sp.free = static_cast<std::uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  sp.capacity_known = vfs.f_blocks != 0;
  struct stat dst {};
  if (::stat(c.dir.c_str(), &dst) == 0) sp.filesystem = static_cast<std::uint64_t>(dst.st_dev);
  return sp;
}

void NvmeSwapper::check_space() {
  const Space sp = space();
  if (!sp.capacity_known) {
    log_warning(
        "the filesystem of {} reports no capacity (ramfs?): the {} NVMe swap needs are not checked against "
        "free space",
        sp.dir, detail::bytes_text(sp.needed));
  } else {
    ZERO_CHECK(sp.needed <= sp.free,
               fmt::format("not enough disk space for NVMe swap in {}: {} swapped tensors need {} more, but only {} "
                           "are free. Free space there, point nvme_path at a larger device, use more ranks, or "
                           "offload to cpu instead of nvme",
                           sp.dir, core_->keys.size(), detail::bytes_text(sp.needed), detail::bytes_text(sp.free)));
  }
  preallocate();
}

void NvmeSwapper::preallocate() {
  SwapCore& c = *core_;
  std::lock_guard lock(c.mutex);
  for (auto& [key, ks] : c.keys) {
    const auto want = static_cast<off_t>(detail::round_up(ks.reserved, detail::kPage));
    if (want == 0) continue;
    const int fd = ::open(ks.path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    ZERO_CHECK(fd >= 0, "cannot create swap file " + ks.path + ": " + detail::errno_text(errno));
    ks.created = true;
    const int rc = ::posix_fallocate(fd, 0, want);
    ::close(fd);
    if (rc == ENOSPC || rc == EDQUOT) {
      ZERO_THROW(
          fmt::format("not enough disk space for NVMe swap in {}: preallocating {} for {} failed with {}. "
                      "Free space there or point nvme_path at a larger device",
                      c.dir, detail::bytes_text(static_cast<std::uint64_t>(want)), ks.path, detail::errno_text(rc)));
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
  ZERO_CHECK(bytes <= ks.reserved,
             fmt::format("NvmeSwapper::write_async: {} bytes for key '{}' exceed its reservation of {}; reserve the "
                         "largest size",
                         bytes, key, ks.reserved));
  ZERO_CHECK(!ks.busy,
             "NvmeSwapper::write_async: key '" + key + "' has a transfer in progress; wait for its handle first");
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
  ZERO_CHECK(fd >= 0, "cannot open swap file " + ks.path + " for writing: " + detail::errno_text(errno) +
                          "; check permissions and space on " + c.dir);
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
  ZERO_CHECK(it != c.keys.end(), "NvmeSwapper::read_async: key '" + key + "' was never reserved or written");
  KeyState& ks = it->second;
  ZERO_CHECK(!ks.busy,
             "NvmeSwapper::read_async: key '" + key + "' has a transfer in progress; wait for its handle first");
  ZERO_CHECK(ks.valid, "NvmeSwapper::read_async: key '" + key +
                           "' has no completed write to read back (never written, or the last "
                           "write failed)");
  ZERO_CHECK(bytes == ks.written, fmt::format("NvmeSwapper::read_async: asked for {} bytes of key '{}' but {} were "
                                              "written",
                                              bytes, key, ks.written));
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
  ZERO_CHECK(fd >= 0, "cannot open swap file " + ks.path + " for reading: " + detail::errno_text(errno) +
                          "; was it deleted during training?");
  struct stat st {};
  const std::uint64_t expect = c.direct ? detail::round_up(bytes, detail::kPage) : bytes;
  if (::fstat(fd, &st) != 0 || static_cast<std::uint64_t>(st.st_size) < expect) {
    ::close(fd);
    const std::uint64_t size = static_cast<std::uint64_t>(st.st_size);
    ZERO_THROW(
        fmt::format("swap file {} is truncated: it has {} bytes but {} were written (block {} onwards is "
                    "missing). Something cut the file during training; do not clean {} while a job runs",
                    ks.path, size, expect, size / c.opt.block_size, c.dir));
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
