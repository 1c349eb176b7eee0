// The NvmeSwapper's insides, shared by its two halves: nvme_swapper.cpp (keys, files, space and
// the caller's side of a request) and swap_io.cpp (the I/O thread: the io_uring or pread/pwrite
// queue, short-transfer resubmission and block checksums).
//
// A request's blocks are checksummed with XXH3-64 seeded with the block index, so a block read
// back from the wrong place fails its check as surely as a damaged one.
#pragma once

#include <liburing.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "offload/nvme_swapper.hpp"

namespace zero {
class JobLock;
}  // namespace zero

namespace zero::offload::detail {

constexpr std::size_t kPage = 4096;
constexpr int kMaxRetries = 1000;  // EINTR/EAGAIN resubmissions of one request before giving up

inline std::size_t round_up(std::size_t x, std::size_t a) { return (x + a - 1) / a * a; }

// "No space left on device (ENOSPC)".
std::string errno_text(int err);

// The checksum of block `b` of a request.
std::uint64_t block_checksum(const void* data, std::size_t bytes, std::size_t b);

struct KeyState {
  std::string path;
  std::size_t reserved = 0;
  std::size_t written = 0;          // bytes of the last successful write
  bool valid = false;               // a write completed and nothing has overwritten it since
  bool busy = false;                // a transfer is in progress
  bool created = false;             // this swapper created the file
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
void plan_blocks(SwapRequest& r, std::size_t bytes, std::size_t block_size, bool direct);

// One I/O request in flight: a block, or part of the last block.
struct Chunk {
  std::shared_ptr<SwapRequest> req;
  std::size_t block = 0;
  std::uint64_t offset = 0;      // file offset of the request's first byte
  unsigned char* ptr = nullptr;  // memory of the request's first byte
  std::size_t length = 0;        // bytes asked of the kernel
  std::size_t need = 0;          // bytes that must arrive (a bounced read may stop short)
  std::size_t done = 0;
  unsigned char* tail_dst = nullptr;  // bounced read: where the `need` bytes go
  int retries = 0;
  unsigned char* page = nullptr;  // this slot's bounce page
};

struct SwapCore {
  AioOptions opt;
  std::string dir;
  std::shared_ptr<JobLock> lock;  // of dir, against a second job on the same nvme_path
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

}  // namespace zero::offload::detail
