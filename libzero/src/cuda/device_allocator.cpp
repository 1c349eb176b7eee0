#include "cuda/device_allocator.hpp"

#include <cuda_runtime_api.h>

#include <fmt/format.h>

#include <bit>
#include <string>

#include "cuda/cuda_check.hpp"
#include "zero/error.hpp"
#include "zero/util/log.hpp"

namespace zero::cuda {

DeviceAllocator::~DeviceAllocator() {
  // Blocks still in use belong to Buffers that outlived their backend, which the engine's member
  // order rules out; they cannot be found here, and the process's exit returns them anyway.
  try {
    trim();
  } catch (...) {
  }
}

std::size_t DeviceAllocator::size_class(std::size_t bytes) {
  constexpr std::size_t kSmallStep = 512, kSmall = std::size_t{1} << 20;
  if (bytes <= kSmall) return (bytes + kSmallStep - 1) / kSmallStep * kSmallStep;
  const std::size_t granule = std::bit_floor(bytes) / 8;
  return (bytes + granule - 1) / granule * granule;
}

void* DeviceAllocator::allocate(std::size_t bytes) {
  ZERO_CHECK(bytes > 0, "DeviceAllocator::allocate: zero bytes requested");
  const std::size_t cls = size_class(bytes);
  if (auto it = free_.find(cls); it != free_.end() && !it->second.empty()) {
    void* p = it->second.back();
    it->second.pop_back();
    in_use_ += cls;
    return p;
  }
  void* p = nullptr;
  cudaError_t rc = cudaMalloc(&p, cls);
  bool kept = false;  // the cache could not be returned: the streams did not drain
  if (rc == cudaErrorMemoryAllocation && bytes_cached() > 0) {
    cudaGetLastError();  // not sticky, but clear it so the retry starts clean
    if (trim())
      rc = cudaMalloc(&p, cls);
    else
      kept = true;
  }
  if (rc != cudaSuccess) {
    cudaGetLastError();
    std::size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    cudaGetLastError();
    const std::string unreturned =
        kept ? fmt::format(
                   " ({} of cached blocks were not returned to the device: the backend's streams did not "
                   "finish within ZERO_NCCL_TIMEOUT_S, and freeing would have waited on them)",
                   format_bytes(bytes_cached()))
             : std::string();
    ZERO_THROW(
        fmt::format("CUDA out of memory on device {}: cudaMalloc of {} failed ({}); libzero holds {} in use, the "
                    "device has {} free of {}{}. Lower the micro batch or the bucket sizes (reduce_bucket_size, "
                    "allgather_bucket_size, stage3_prefetch_bucket_size, stage3_max_live_parameters), use a "
                    "higher ZeRO stage, or offload the optimizer (zero_optimization.offload_optimizer.device: "
                    "cpu)",
                    device_, format_bytes(cls), cudaGetErrorName(rc), format_bytes(in_use_), format_bytes(free_b),
                    format_bytes(total_b), unreturned));
  }
  reserved_ += cls;
  if (reserved_ > max_reserved_) max_reserved_ = reserved_;
  in_use_ += cls;
  return p;
}

void DeviceAllocator::release(void* p, std::size_t bytes) {
  if (!p) return;
  const std::size_t cls = size_class(bytes);
  in_use_ -= cls;
  free_[cls].push_back(p);
}

bool DeviceAllocator::trim() {
  if (bytes_cached() == 0) return true;
  if (drain_ && !drain_()) return false;
  for (auto& [cls, blocks] : free_) {
    for (void* p : blocks) {
      cudaFree(p);  // errors here would only repeat an earlier sticky error; nothing to add
      reserved_ -= cls;
    }
    blocks.clear();
  }
  free_.clear();
  return true;
}

void DeviceAllocator::abandon() {
  free_.clear();
  in_use_ = reserved_ = 0;
}

}  // namespace zero::cuda
