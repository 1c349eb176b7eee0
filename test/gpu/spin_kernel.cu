#include "spin_kernel.hpp"

#include <cstdint>

#include "cuda/cuda_check.hpp"

namespace zero::gputest {

namespace {

__global__ void spin_kernel(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

__global__ void illegal_write_kernel(int* p) { *p = 1; }

}  // namespace

void illegal_write(cudaStream_t stream) {
  // Far from any allocation and not null (a null write is reported the same way, but a
  // sanitizer-aware reader would take it for a forgotten allocation).
  illegal_write_kernel<<<1, 1, 0, stream>>>(reinterpret_cast<int*>(std::uintptr_t{0x10}));
  ZERO_CUDA_CHECK(cudaGetLastError());
}

void spin(cudaStream_t stream, double ms) {
  int device = 0, khz = 0;
  ZERO_CUDA_CHECK(cudaGetDevice(&device));
  ZERO_CUDA_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, device));
  spin_kernel<<<1, 1, 0, stream>>>(static_cast<long long>(ms * khz));
  ZERO_CUDA_CHECK(cudaGetLastError());
}

}  // namespace zero::gputest
