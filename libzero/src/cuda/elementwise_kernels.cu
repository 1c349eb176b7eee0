// Casts, accumulation and the sum of squares (see kernels.hpp for the contracts).
#include <algorithm>

#include "cuda_check.hpp"
#include "device_math.cuh"
#include "kernels.hpp"
#include "zero/error.hpp"

namespace zero::cuda {

namespace {

using namespace dev;

template <int S, int D>
__global__ void convert_kernel(const void* src, void* dst, std::size_t n) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) store<D>(dst, i, load<S>(src, i));
}

template <int T>
__global__ void accumulate_kernel(void* dst, const void* src, std::size_t n) {
  for (std::size_t i = first_index(); i < n; i += grid_stride())
    store<T>(dst, i, __fadd_rn(load<T>(dst, i), load<T>(src, i)));
}

template <int T>
__global__ void divide_kernel(void* buf, std::size_t n, float d) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) store<T>(buf, i, __fdiv_rn(load<T>(buf, i), d));
}

// Fixed-order tree over one block's values; blockDim.x == kThreads.
__device__ double block_sum(double v) {
  __shared__ double sh[kThreads];
  sh[threadIdx.x] = v;
  __syncthreads();
  for (int k = kThreads / 2; k > 0; k >>= 1) {
    if (static_cast<int>(threadIdx.x) < k) sh[threadIdx.x] = __dadd_rn(sh[threadIdx.x], sh[threadIdx.x + k]);
    __syncthreads();
  }
  return sh[0];
}

// Block b adds its elements' squares into partials[b]; the grid is always kSumSqBlocks, so the
// assignment of elements to blocks and threads, and so the rounding, never changes.
template <int T>
__global__ void sumsq_add_kernel(const void* g, std::size_t n, double* partials) {
  double s = 0.0;
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    const double v = load<T>(g, i);
    s = __dadd_rn(s, __dmul_rn(v, v));  // the square of a float is exact in double
  }
  const double total = block_sum(s);
  if (threadIdx.x == 0) partials[blockIdx.x] = __dadd_rn(partials[blockIdx.x], total);
}

__global__ void sumsq_finish_kernel(const double* partials, double* out) {
  const double v = static_cast<int>(threadIdx.x) < kSumSqBlocks ? partials[threadIdx.x] : 0.0;
  const double total = block_sum(v);
  if (threadIdx.x == 0) *out = total;
}

template <int S>
void convert_from(const void* src, void* dst, DType dt, std::size_t n, cudaStream_t s) {
  switch (dt) {
    case DType::f32: convert_kernel<S, kF32><<<blocks_for(n), kThreads, 0, s>>>(src, dst, n); break;
    case DType::bf16: convert_kernel<S, kBF16><<<blocks_for(n), kThreads, 0, s>>>(src, dst, n); break;
    case DType::f16: convert_kernel<S, kF16><<<blocks_for(n), kThreads, 0, s>>>(src, dst, n); break;
  }
}

}  // namespace

void launch_convert(const void* src, DType st, void* dst, DType dt, std::size_t n, cudaStream_t s) {
  if (n == 0) return;
  if (st == dt) {
    if (src != dst) ZERO_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * dtype_size(st), cudaMemcpyDeviceToDevice, s));
    return;
  }
  switch (st) {
    case DType::f32: convert_from<kF32>(src, dst, dt, n, s); break;
    case DType::bf16: convert_from<kBF16>(src, dst, dt, n, s); break;
    case DType::f16: convert_from<kF16>(src, dst, dt, n, s); break;
  }
  ZERO_CUDA_CHECK(cudaGetLastError());
}

void launch_accumulate(void* dst, const void* src, DType t, std::size_t n, cudaStream_t s) {
  if (n == 0) return;
  switch (t) {
    case DType::f32: accumulate_kernel<kF32><<<blocks_for(n), kThreads, 0, s>>>(dst, src, n); break;
    case DType::bf16: accumulate_kernel<kBF16><<<blocks_for(n), kThreads, 0, s>>>(dst, src, n); break;
    case DType::f16: accumulate_kernel<kF16><<<blocks_for(n), kThreads, 0, s>>>(dst, src, n); break;
  }
  ZERO_CUDA_CHECK(cudaGetLastError());
}

void launch_divide(void* buf, DType t, std::size_t n, float d, cudaStream_t s) {
  if (n == 0) return;
  switch (t) {
    case DType::f32: divide_kernel<kF32><<<blocks_for(n), kThreads, 0, s>>>(buf, n, d); break;
    case DType::bf16: divide_kernel<kBF16><<<blocks_for(n), kThreads, 0, s>>>(buf, n, d); break;
    case DType::f16: divide_kernel<kF16><<<blocks_for(n), kThreads, 0, s>>>(buf, n, d); break;
  }
  ZERO_CUDA_CHECK(cudaGetLastError());
}

void launch_sumsq_add(const void* g, DType t, std::size_t n, double* partials, cudaStream_t s) {
  if (n == 0) return;
  switch (t) {
    case DType::f32: sumsq_add_kernel<kF32><<<kSumSqBlocks, kThreads, 0, s>>>(g, n, partials); break;
    case DType::bf16: sumsq_add_kernel<kBF16><<<kSumSqBlocks, kThreads, 0, s>>>(g, n, partials); break;
    case DType::f16: sumsq_add_kernel<kF16><<<kSumSqBlocks, kThreads, 0, s>>>(g, n, partials); break;
  }
  ZERO_CUDA_CHECK(cudaGetLastError());
}

void launch_sumsq_finish(const double* partials, double* out, cudaStream_t s) {
  static_assert(kSumSqBlocks <= kThreads, "the final reduction is one block of kThreads");
  sumsq_finish_kernel<<<1, kThreads, 0, s>>>(partials, out);
  ZERO_CUDA_CHECK(cudaGetLastError());
}

}  // namespace zero::cuda
