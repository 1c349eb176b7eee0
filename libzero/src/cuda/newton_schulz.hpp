// Muon's Newton-Schulz orthogonalisation on the device (offload::newton_schulz's iteration):
// X = x / ||x||_F in bf16, laid out [min(rows, cols), max(rows, cols)], then `steps` times
// A = X X^T, B = b A + c A A, X = a X + B X with (a, b, c) = (3.4445, -4.7750, 2.0315), each
// product one cuBLASLt matmul with bf16 operands and results and fp32 accumulation (as the
// reference implementations run it), then X back into x in fp32. The products' descriptors and
// algorithms are chosen once per shape and kept; the bf16 buffers and cuBLASLt's workspace grow
// to the largest batch seen. Work is enqueued on the given stream; nothing waits.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>

namespace zero::cuda {

class DeviceAllocator;

class NewtonSchulz {
 public:
  explicit NewtonSchulz(DeviceAllocator& alloc);
  ~NewtonSchulz();
  NewtonSchulz(const NewtonSchulz&) = delete;
  NewtonSchulz& operator=(const NewtonSchulz&) = delete;

  // In place on the [rows, cols] row-major fp32 matrix x (device memory). scratch: the
  // fixed-order sum's, 2 x kSumBlocks + 1 doubles (kernels.hpp).
  void run(float* x, std::int64_t rows, std::int64_t cols, int steps, double* scratch, cudaStream_t stream);
  // `count` matrices of one shape at once, each as run does it: the norms and conversions one by
  // one, each product one strided-batched matmul for all of them.
  void run_batch(float* const* xs, std::size_t count, std::int64_t rows, std::int64_t cols, int steps, double* scratch,
                 cudaStream_t stream);
  // Returns the buffers to the allocator (the backend's shutdown, after its streams drained).
  void release();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zero::cuda
