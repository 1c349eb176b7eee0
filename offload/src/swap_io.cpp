// The NvmeSwapper's I/O thread: cuts requests into block-sized pieces, keeps up to queue_depth
// of them in flight (io_uring, or pread/pwrite as a fallback), resubmits short and interrupted
// transfers, and checks every block's checksum.
#include <fmt/format.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "swap_core.hpp"

namespace zero::offload::detail {

std::string errno_text(int err) {
  const char* name = nullptr;
  switch (err) {
    case ENOSPC: name = "ENOSPC"; break;
    case EIO: name = "EIO"; break;
    case EINVAL: name = "EINVAL"; break;
    case EDQUOT: name = "EDQUOT"; break;
    case EROFS: name = "EROFS"; break;
    case EACCES: name = "EACCES"; break;
    case ENOENT: name = "ENOENT"; break;
    default: return fmt::format("{} (errno {})", std::strerror(err), err);
  }
  return fmt::format("{} ({})", std::strerror(err), name);
}

std::uint64_t block_checksum(const void* data, std::size_t bytes, std::size_t b) {
  return XXH3_64bits_withSeed(data, bytes, static_cast<XXH64_hash_t>(b));
}

void plan_blocks(SwapRequest& r, std::size_t bytes, std::size_t block_size, bool direct) {
  r.bytes = bytes;
  r.nblocks = (bytes + block_size - 1) / block_size;
  r.blocks_left = r.nblocks;
  const std::size_t last = bytes - (r.nblocks - 1) * block_size;
  r.last_block_segments_left = direct ? (last >= kPage ? 1 : 0) + (last % kPage != 0 ? 1 : 0) : 1;
}

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
      while (!queue.empty() && (queue.front()->failed || queue.front()->next_block >= queue.front()->nblocks)) {
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
    r.ks->sums[b] = block_checksum(r.buf + b * opt.block_size, block_bytes(r, b), b);
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
      fail(r, fmt::format("NVMe swap {} {} kept failing with {} at offset {} after {} retries; the device "
                          "is overloaded or failing (check dmesg)",
                          r.write ? "write to" : "read from", r.ks->path, errno_text(-res), at, kMaxRetries));
    }
  } else if (res < 0) {
    std::string msg = fmt::format("NVMe swap {} {} failed at offset {} (block {}): {}.",
                                  r.write ? "write to" : "read from", r.ks->path, at, c.block, errno_text(-res));
    if (-res == ENOSPC || -res == EDQUOT) {
      msg += " The filesystem holding " + dir +
             " is full. Call check_space() before training "
             "(the engine does), free space there, or point nvme_path at a larger device.";
    } else if (-res == EINVAL && direct) {
      msg +=
          " The filesystem rejected an O_DIRECT transfer; set AioOptions::direct_io = false "
          "or use a local NVMe filesystem (ext4, xfs).";
    } else {
      msg += " Check the device (dmesg) and that nothing else modifies " + dir + ".";
    }
    fail(r, msg);
  } else if (res == 0 && c.done < c.need) {
    if (r.write) {
      fail(r, fmt::format("NVMe swap write to {} made no progress at offset {} (block {}); the filesystem "
                          "may be full (check df {})",
                          r.ks->path, at, c.block, dir));
    } else {
      fail(r, fmt::format("swap file {} is truncated: block {} (file bytes {}..{}) ends early at offset {}. "
                          "The file was cut or replaced while in use; do not clean {} during training",
                          r.ks->path, c.block, c.block * opt.block_size,
                          c.block * opt.block_size + block_bytes(r, c.block), at, dir));
    }
  } else {
    c.done += static_cast<std::size_t>(res);
    if (c.done < c.need) {
      // Short transfer: the kernel may stop early (signals, memory pressure); send the rest.
      // An O_DIRECT read that ends off a page boundary can only have hit the end of the file.
      if (!r.write && direct && c.done % kPage != 0) {
        fail(r, fmt::format("swap file {} is truncated: block {} ends at file offset {}; do not clean {} "
                            "during training",
                            r.ks->path, c.block, c.offset + c.done, dir));
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
      if (block_checksum(r.buf + off, len, b) != r.ks->sums[b]) {
        fail(r, fmt::format("checksum mismatch in swap file {}, block {} (file bytes {}..{}): the data read "
                            "back differs from what was written. Something modified the file or the device "
                            "returned bad data; check dmesg and the drive's health, and resume from the last "
                            "checkpoint",
                            r.ks->path, b, off, off + len));
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

}  // namespace zero::offload::detail
