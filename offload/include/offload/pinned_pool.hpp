// Page-locked host memory, cached for reuse.
//
// Offloaded optimizer state and parameter staging buffers live in host memory that must not be
// paged out: the GPU copies from it without a bounce buffer (cudaHostAlloc once a CUDA backend
// runs) and the NVMe swapper reads and writes it with O_DIRECT (page-aligned, so mlock'ed memory
// otherwise). Pinning is slow and limited (RLIMIT_MEMLOCK), so a PinnedPool keeps freed blocks
// and hands them out again to requests of the same size class instead of unpinning them.
//
// A PinnedBuffer is a move-only handle; destroying it returns its block to the pool. Buffers
// may outlive their pool: the pool's bookkeeping is shared and the last owner frees the memory.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace zero::offload {

namespace detail {
struct PinnedPoolState;
}

class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer();

  void* data() const noexcept { return data_; }
  template <class T>
  T* as() const noexcept {
    return static_cast<T*>(data_);
  }
  std::size_t size() const noexcept { return size_; }          // bytes asked for
  std::size_t capacity() const noexcept { return capacity_; }  // usable bytes (size class)
  bool pinned() const noexcept { return pinned_; }
  explicit operator bool() const noexcept { return data_ != nullptr; }

  // Returns the block to the pool now (the handle becomes empty).
  void reset() noexcept;

 private:
  friend class PinnedPool;
  std::shared_ptr<detail::PinnedPoolState> pool_;
  void* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t capacity_ = 0;
  bool pinned_ = false;
};

class PinnedPool {
 public:
  // Every block is aligned to this (the page size O_DIRECT needs) and a multiple of it long.
  static constexpr std::size_t kAlignment = 4096;

  // require_pinned: failing to pin a block is an error (zero::Error naming the size and the
  // memlock limit). Otherwise the pool falls back to ordinary page-aligned memory and prints a
  // one-time note.
  explicit PinnedPool(bool require_pinned);
  ~PinnedPool();
  PinnedPool(PinnedPool&&) noexcept = default;
  PinnedPool& operator=(PinnedPool&&) noexcept = default;
  PinnedPool(const PinnedPool&) = delete;
  PinnedPool& operator=(const PinnedPool&) = delete;

  // A block of at least `bytes` (capacity = size_class(bytes)); reuses a cached block of the
  // same class when there is one. acquire(0) gives an empty buffer. Thread-safe.
  PinnedBuffer acquire(std::size_t bytes);

  // Frees the cached blocks no buffer holds.
  void trim();

  std::size_t bytes_reserved() const;  // all blocks the pool owns, in use or cached
  std::size_t bytes_pinned() const;    // the part of bytes_reserved() that is page-locked
  std::size_t bytes_in_use() const;    // capacity of the blocks held by live buffers
  bool require_pinned() const;

  // Capacity for a request: a multiple of 4096 at most 25% larger than `bytes`, from a small
  // set of classes so freed blocks fit later requests of similar size.
  static std::size_t size_class(std::size_t bytes);

 private:
  std::shared_ptr<detail::PinnedPoolState> state_;
};

// Page-locking through a device driver (cudaHostAlloc / cudaFreeHost: fast asynchronous copies).
// alloc returns null and sets *why when it cannot pin. Passed in by the CUDA backend, which lives
// in its own library (libzero_cuda): libzero itself calls no CUDA function.
struct DevicePinning {
  void* (*alloc)(std::size_t bytes, std::string* why) = nullptr;
  void (*free)(void* p) = nullptr;
};

// From now on, blocks are pinned by the device driver rather than mlock. The CUDA backend calls
// it once its device is current: until then no CUDA call is made, so host-backend jobs in a CUDA
// build never create a GPU context.
void enable_cuda_pinning(const DevicePinning& pinning);

}  // namespace zero::offload
