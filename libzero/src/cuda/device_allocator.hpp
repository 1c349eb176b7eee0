// DeviceAllocator: every byte of device memory the CUDA backend uses, through one cache.
//
// cudaMalloc and cudaFree are slow and cudaFree synchronizes the device, so freed blocks are
// kept on a free list per size class and handed to the next request of the same class. The
// classes (512 B steps up to 1 MiB, then eight per power of two) waste at most 12.5% and let the
// equal-sized buffers of a transformer's layers reuse each other.
//
// Reuse is safe without per-stream bookkeeping because of one invariant the engine keeps: a
// block is released only after its last use has been ordered on the compute stream (collectives
// complete into it through Work::wait, copies through events), and every later user is either
// the compute stream or a collective / copy that first waits for the compute stream.
//
// Counters: bytes in use (size classes of live blocks), bytes reserved (all blocks held from
// the device, in use or cached). When cudaMalloc fails, the cache is returned to the device and
// the request retried once before the out-of-memory error. Not thread-safe: one per backend.
//
// Returning the cache calls cudaFree, which synchronizes the whole device: with a collective in
// flight whose peers are themselves blocked (in their own cudaFree, or waiting for this rank's
// next launch) that wait never ends. So the cache is returned only after the drain callback has
// waited, with a deadline, for the backend's own streams (compute, comm, copy): once they are
// idle no collective of ours is in flight and cudaFree's device synchronization has nothing to
// wait for. If they do not drain in time, the allocation fails with the out-of-memory report
// (saying why the cache was kept) rather than risking the hang.
#pragma once

#include <cstddef>
#include <functional>
#include <unordered_map>
#include <vector>

namespace zero::cuda {

class DeviceAllocator {
 public:
  explicit DeviceAllocator(int device) : device_(device) {}
  ~DeviceAllocator();
  DeviceAllocator(const DeviceAllocator&) = delete;
  DeviceAllocator& operator=(const DeviceAllocator&) = delete;

  // A block of at least `bytes` (not zeroed); bytes > 0.
  void* allocate(std::size_t bytes);
  // Returns a block from allocate(`bytes`) (the same byte count) to the cache.
  void release(void* p, std::size_t bytes);
  // Frees the cached blocks, after the drain callback (if set) succeeded; false when it did not
  // (nothing freed).
  bool trim();
  // Waits for every stream that may still use this allocator's blocks; false on timeout.
  void set_drain(std::function<bool()> drain) { drain_ = std::move(drain); }
  // Forgets every block without freeing it (shutdown after a stuck stream: cudaFree would wait
  // for the device forever; the process exit returns the memory).
  void abandon();

  std::size_t bytes_in_use() const { return in_use_; }
  std::size_t bytes_reserved() const { return reserved_; }
  std::size_t bytes_cached() const { return reserved_ - in_use_; }
  std::size_t max_bytes_reserved() const { return max_reserved_; }

  static std::size_t size_class(std::size_t bytes);

 private:
  int device_;
  std::function<bool()> drain_;
  std::unordered_map<std::size_t, std::vector<void*>> free_;  // size class -> cached blocks
  std::size_t in_use_ = 0, reserved_ = 0, max_reserved_ = 0;
};

}  // namespace zero::cuda
