#include "spin_kernel.hpp"

#include "cuda/cuda_check.hpp"

namespace zero::gputest {

namespace {

__global__ void spin_kernel(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

}  // namespace

void spin(cudaStream_t stream, double ms) {
  int device = 0, khz = 0;
  ZERO_CUDA_CHECK(cudaGetDevice(&device));
  ZERO_CUDA_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, device));
  spin_kernel<<<1, 1, 0, stream>>>(static_cast<long long>(ms * khz));
  ZERO_CUDA_CHECK(cudaGetLastError());
}

}  // namespace zero::gputest
