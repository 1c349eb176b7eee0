// PinnedPool: the device driver's pinning (cudaHostAlloc) once a CUDA backend runs,
// posix_memalign + mlock otherwise, with a free list per size class.
#include "offload/pinned_pool.hpp"

#include <sys/mman.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <unordered_set>
#include <utility>

#include <fmt/format.h>

#include "runtime/log.hpp"
#include "zero/error.hpp"

namespace zero::offload {
namespace detail {

struct PinnedPoolState {
  std::mutex mutex;
  bool require_pinned = false;
  bool pool_alive = true;  // false once the PinnedPool is gone: returned blocks are freed
  bool warned = false;
  std::multimap<std::size_t, std::pair<void*, bool>> cached;  // capacity -> (block, pinned)
  std::size_t reserved = 0, pinned = 0, in_use = 0;

  ~PinnedPoolState();
};

}  // namespace detail

namespace {

using detail::PinnedPoolState;

std::string memlock_limit() {
  rlimit rl{};
  if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0) return "unknown";
  if (rl.rlim_cur == RLIM_INFINITY) return "unlimited";
  return format_bytes(rl.rlim_cur);
}

// Whether page-locking goes through the CUDA driver: only once a CUDA backend runs in this
// process (enable_cuda_pinning). cudaHostAlloc creates a GPU context, and a host-backend job in a
// CUDA build (or a machine without a GPU) must not create one on every rank; it pins with mlock
// like a host-only build. Each block remembers how it was pinned, so it is freed the same way.
// The functions are written once, before the flag is released.
std::atomic<bool> g_cuda_pinning{false};
DevicePinning g_device_pinning;

std::mutex g_cuda_blocks_mu;
std::unordered_set<void*>& cuda_blocks() {
  static std::unordered_set<void*> blocks;  // from the device driver
  return blocks;
}

bool use_cuda_host_alloc() { return g_cuda_pinning.load(std::memory_order_acquire); }

void free_block(void* p, bool pinned, std::size_t capacity) {
  if (pinned && use_cuda_host_alloc()) {
    bool from_cuda = false;
    {
      std::lock_guard<std::mutex> lock(g_cuda_blocks_mu);
      from_cuda = cuda_blocks().erase(p) > 0;
    }
    if (from_cuda) {
      g_device_pinning.free(p);
      return;
    }
  }
  if (pinned) munlock(p, capacity);
  std::free(p);
}

// O_DIRECT and the vectorized copies rely on it: a block that is not aligned is a bug here, not
// a condition to run with.
void check_aligned(void* p) {
  ZERO_CHECK(reinterpret_cast<std::uintptr_t>(p) % PinnedPool::kAlignment == 0,
             fmt::format("PinnedPool: a block came back from the allocator not aligned to {} bytes; this is a "
                         "bug, please report it",
                         PinnedPool::kAlignment));
}

void* aligned_block(std::size_t capacity) {
  void* p = nullptr;
  const int rc = posix_memalign(&p, PinnedPool::kAlignment, capacity);
  ZERO_CHECK(rc == 0, fmt::format("PinnedPool: out of host memory allocating {}; reduce offloaded state "
                                  "(offload_param.max_in_cpu, sub_group_size) or use more ranks",
                                  format_bytes(capacity)));
  return p;
}

// Allocates one block; returns (pointer, pinned). Throws when pinning is required and fails.
std::pair<void*, bool> allocate(std::size_t capacity, PinnedPoolState& s) {
  std::string why;
  if (use_cuda_host_alloc()) {
    if (void* p = g_device_pinning.alloc(capacity, &why)) {
      {
        std::lock_guard<std::mutex> lock(g_cuda_blocks_mu);
        cuda_blocks().insert(p);
      }
      check_aligned(p);
      return {p, true};
    }
  } else {
    void* p = aligned_block(capacity);
    check_aligned(p);
    if (mlock(p, capacity) == 0) return {p, true};
    const int err = errno;
    std::free(p);
    why = std::string("mlock failed: ") + std::strerror(err);
  }
  if (s.require_pinned) {
    ZERO_THROW(
        fmt::format("PinnedPool: could not pin {} of host memory ({}; already pinned by this pool: {}, "
                    "RLIMIT_MEMLOCK: {}). Raise the limit (ulimit -l unlimited, docker --ulimit memlock=-1, "
                    "or LimitMEMLOCK=infinity for systemd/Slurm) or set pin_memory: false.",
                    format_bytes(capacity), why, format_bytes(s.pinned), memlock_limit()));
  }
  if (!s.warned) {
    s.warned = true;
    log_info(
        "PinnedPool could not pin {} ({}, RLIMIT_MEMLOCK {}); using pageable memory, which is slower to "
        "copy. Raise ulimit -l to pin.",
        format_bytes(capacity), why, memlock_limit());
  }
  return {aligned_block(capacity), false};
}

// Takes a block back from a buffer: cached while the pool lives, freed after.
void give_back(const std::shared_ptr<PinnedPoolState>& state, void* p, std::size_t capacity, bool pinned) noexcept {
  std::unique_lock lock(state->mutex);
  state->in_use -= capacity;
  if (state->pool_alive) {
    try {
      state->cached.emplace(capacity, std::make_pair(p, pinned));
      return;
    } catch (...) {
      // The map could not grow; free the block instead of leaking it.
    }
  }
  state->reserved -= capacity;
  if (pinned) state->pinned -= capacity;
  lock.unlock();
  free_block(p, pinned, capacity);
}

}  // namespace

detail::PinnedPoolState::~PinnedPoolState() {
  for (const auto& [capacity, block] : cached) free_block(block.first, block.second, capacity);
}

PinnedBuffer::PinnedBuffer(PinnedBuffer&& other) noexcept
    : pool_(std::move(other.pool_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      capacity_(std::exchange(other.capacity_, 0)),
      pinned_(std::exchange(other.pinned_, false)) {}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    pool_ = std::move(other.pool_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    capacity_ = std::exchange(other.capacity_, 0);
    pinned_ = std::exchange(other.pinned_, false);
  }
  return *this;
}

PinnedBuffer::~PinnedBuffer() { reset(); }

void PinnedBuffer::reset() noexcept {
  if (data_ != nullptr && pool_) give_back(pool_, data_, capacity_, pinned_);
  pool_.reset();
  data_ = nullptr;
  size_ = capacity_ = 0;
  pinned_ = false;
}

PinnedPool::PinnedPool(bool require_pinned) : state_(std::make_shared<PinnedPoolState>()) {
  state_->require_pinned = require_pinned;
}

PinnedPool::~PinnedPool() {
  if (!state_) return;
  trim();
  std::lock_guard lock(state_->mutex);
  state_->pool_alive = false;
}

std::size_t PinnedPool::size_class(std::size_t bytes) {
  if (bytes <= kAlignment) return kAlignment;
  // Four classes per power of two: the granule is a quarter of the largest power of two <= bytes.
  const std::size_t granule = std::max(kAlignment, std::bit_floor(bytes) / 4);
  return (bytes + granule - 1) / granule * granule;
}

PinnedBuffer PinnedPool::acquire(std::size_t bytes) {
  ZERO_CHECK(state_ != nullptr, "PinnedPool::acquire on a moved-from pool");
  PinnedBuffer buf;
  if (bytes == 0) return buf;
  const std::size_t capacity = size_class(bytes);
  PinnedPoolState& s = *state_;
  std::unique_lock lock(s.mutex);
  void* p = nullptr;
  bool pinned = false;
  if (auto it = s.cached.find(capacity); it != s.cached.end()) {
    p = it->second.first;
    pinned = it->second.second;
    s.cached.erase(it);
  } else {
    // Pinning can take a while for large blocks; the lock keeps the counters consistent and
    // the warning single, and acquire is not on a hot path.
    std::tie(p, pinned) = allocate(capacity, s);
    s.reserved += capacity;
    if (pinned) s.pinned += capacity;
  }
  s.in_use += capacity;
  buf.pool_ = state_;
  buf.data_ = p;
  buf.size_ = bytes;
  buf.capacity_ = capacity;
  buf.pinned_ = pinned;
  return buf;
}

void PinnedPool::trim() {
  if (!state_) return;
  std::multimap<std::size_t, std::pair<void*, bool>> blocks;
  {
    std::lock_guard lock(state_->mutex);
    blocks.swap(state_->cached);
    for (const auto& [capacity, block] : blocks) {
      state_->reserved -= capacity;
      if (block.second) state_->pinned -= capacity;
    }
  }
  for (const auto& [capacity, block] : blocks) free_block(block.first, block.second, capacity);
}

std::size_t PinnedPool::bytes_reserved() const {
  if (!state_) return 0;
  std::lock_guard lock(state_->mutex);
  return state_->reserved;
}

std::size_t PinnedPool::bytes_pinned() const {
  if (!state_) return 0;
  std::lock_guard lock(state_->mutex);
  return state_->pinned;
}

std::size_t PinnedPool::bytes_in_use() const {
  if (!state_) return 0;
  std::lock_guard lock(state_->mutex);
  return state_->in_use;
}

bool PinnedPool::require_pinned() const { return state_ && state_->require_pinned; }

void enable_cuda_pinning(const DevicePinning& pinning) {
  ZERO_CHECK(pinning.alloc != nullptr && pinning.free != nullptr,
             "enable_cuda_pinning: both the alloc and the free function are needed");
  if (g_cuda_pinning.load(std::memory_order_acquire)) return;  // the same driver's functions, set once
  g_device_pinning = pinning;
  g_cuda_pinning.store(true, std::memory_order_release);
}

}  // namespace zero::offload
