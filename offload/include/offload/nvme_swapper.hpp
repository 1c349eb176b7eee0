// Named tensors swapped between host memory and files on a fast local disk.
//
// When optimizer state (or, at stage 3, parameters) does not fit in host memory, each rank keeps
// it in files under <nvme_path>/zero_rank<r>/, one file per key ("unit3/master"), and streams it
// through pinned buffers around each optimizer step. Throughput is what matters, so I/O goes
// through io_uring with O_DIRECT (no page cache copy, no eviction storms) in requests of at most
// `block_size` bytes with up to `queue_depth` of them in flight. One background thread drives the
// ring, so transfers proceed while the caller computes; write_async/read_async return a handle
// and wait() collects the result.
//
// A swap file is scratch data for the current run, but a bad disk or a full one must never feed
// garbage to the optimizer. Every block gets a 64-bit checksum when it is written; the table of
// checksums stays in host memory (8 bytes per block, out of reach of whatever damages the file)
// and every block read is verified against it. A corrupted or truncated file, a failed write or
// a full disk is a zero::Error naming the file, block and byte range. check_space() compares the
// reserved total with the free space and preallocates the files before training, so a full disk
// is reported up front instead of halfway through a step.
//
// One job per rank directory: a swapper holds an flock on <nvme_path>/zero_rank<r>.lock for its
// lifetime, so a second job given the same nvme_path is refused with the holder's host and pid
// instead of overwriting swap files under a running optimizer. The files are removed on every
// exit that runs destructors (normal end, an exception, a preemption stop); a job killed
// outright leaves them, and the next swapper that takes the lock removes them before its
// space check, since nothing alive can be using them.
//
// Fallbacks, each announced once on stderr: no io_uring (old kernel, seccomp profile in a
// container) -> pread/pwrite in the I/O thread, one request at a time; no O_DIRECT (tmpfs on
// older kernels, some network filesystems) -> buffered I/O.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace zero::offload {

namespace detail {
struct SwapCore;
struct SwapRequest;
}  // namespace detail

struct AioOptions {
  std::size_t block_size = std::size_t{1} << 20;  // bytes per request; a multiple of 4096
  int queue_depth = 8;                            // requests in flight
  bool direct_io = true;                          // O_DIRECT when the filesystem supports it
  bool use_io_uring = true;                       // false forces the pread/pwrite path
  bool keep_files = false;                        // leave the swap files behind at destruction (for inspection;
                                                  // the next swapper on the directory removes them)
};

// A pending transfer. Move-only; destroying a handle that was not waited for waits for the
// transfer (so its buffer is never written after it is freed) and reports a failure on stderr.
class SwapHandle {
 public:
  SwapHandle() = default;
  SwapHandle(SwapHandle&&) noexcept = default;
  SwapHandle& operator=(SwapHandle&& other) noexcept;
  SwapHandle(const SwapHandle&) = delete;
  SwapHandle& operator=(const SwapHandle&) = delete;
  ~SwapHandle();

  bool valid() const noexcept { return req_ != nullptr; }
  // True when the transfer has finished (successfully or not); never blocks.
  bool ready() const;
  // Blocks until the transfer has finished; throws zero::Error if it failed. The handle is
  // empty afterwards.
  void wait();

 private:
  friend class NvmeSwapper;
  std::shared_ptr<detail::SwapCore> core_;
  std::shared_ptr<detail::SwapRequest> req_;
};

// What a fault hook sees for each completed I/O request.
struct SwapIoEvent {
  bool write;
  std::string_view path;
  std::uint64_t offset;  // file offset of the request
  std::size_t length;    // bytes asked for
  int result;            // bytes transferred, or -errno
};
// Returns a replacement result (a shorter count, or -errno) to simulate a failure, or nullopt.
using SwapFaultHook = std::function<std::optional<int>(const SwapIoEvent&)>;

class NvmeSwapper {
 public:
  // Creates <nvme_path>/zero_rank<rank>/ (nvme_path must exist) and locks it; removes swap
  // files a killed job left there. Throws zero::Error, naming the holder when another job
  // holds the directory.
  NvmeSwapper(const std::string& nvme_path, int rank, const AioOptions& options = {});
  ~NvmeSwapper();  // waits for outstanding transfers; removes the files unless keep_files
  NvmeSwapper(const NvmeSwapper&) = delete;
  NvmeSwapper& operator=(const NvmeSwapper&) = delete;

  // Declares a tensor that will be swapped, with its largest size. Writing a key that was not
  // reserved is an error, so check_space() always sees the whole footprint.
  void reserve(const std::string& key, std::size_t bytes);
  // Total file bytes the reservations need (each file rounded up to 4096 bytes).
  std::uint64_t bytes_reserved() const;

  // Fails (zero::Error with bytes needed, bytes free and the directory) if the free space of the
  // directory's filesystem cannot hold the reserved files, before writing anything; otherwise
  // preallocates the files so later writes cannot run out of space.
  void check_space();
  // check_space() in two parts, for a caller that checks several swappers together (the ranks
  // of a job that share one filesystem) before any of them claims space.
  struct Space {
    std::uint64_t needed = 0;      // bytes still to claim
    std::uint64_t free = 0;        // free bytes of the filesystem
    bool capacity_known = true;    // false: the filesystem reports no size (ramfs); not checked
    std::uint64_t filesystem = 0;  // st_dev of the directory (the same on one host: one filesystem)
    std::string dir;
  };
  Space space() const;
  void preallocate();  // claims the reserved space so later writes cannot run out of it

  // Starts writing `bytes` from src to key's file / reading them back into dst. With O_DIRECT
  // the buffer must be 4096-byte aligned (PinnedPool memory is); its length need not be a
  // multiple of 4096. The buffer must stay untouched until the handle is waited for. One
  // transfer per key at a time; a read must ask for exactly the bytes last written.
  SwapHandle write_async(const std::string& key, const void* src, std::size_t bytes);
  SwapHandle read_async(const std::string& key, void* dst, std::size_t bytes);
  void wait(SwapHandle& handle) { handle.wait(); }

  const std::string& directory() const;
  std::string file_path(const std::string& key) const;
  bool using_io_uring() const;
  bool using_direct_io() const;
  const AioOptions& options() const;

  // Test hook: called on every completed I/O request in the I/O thread. Set it while idle.
  void set_fault_hook(SwapFaultHook hook);

 private:
  std::shared_ptr<detail::SwapCore> core_;
};

}  // namespace zero::offload
