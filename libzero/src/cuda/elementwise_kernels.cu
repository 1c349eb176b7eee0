// Casts, accumulation and the sum of squares (see kernels.hpp for the contracts).
#include <algorithm>

#include "cuda/cuda_check.hpp"
#include "cuda/device_math.cuh"
#include "cuda/kernels.hpp"
#include "zero/error.hpp"

namespace zero::cuda {

namespace {

using namespace dev;

// The element-wise kernels move four elements per access where every buffer is aligned for it
// (vec), then finish the last n % 4 one at a time; unaligned buffers take the scalar loop.
// Where the tail starts: after the vector part, or at 0 without one.
__device__ __forceinline__ std::size_t tail_start(std::size_t n, bool vec) { return vec ? n / 4 * 4 : 0; }

template <int S, int D>
__global__ void convert_kernel(const void* src, void* dst, std::size_t n, bool vec) {
  if (vec)
    for (std::size_t q = first_index(); q < n / 4; q += grid_stride()) store4<D>(dst, q, load4<S>(src, q));
  for (std::size_t i = tail_start(n, vec) + first_index(); i < n; i += grid_stride()) store<D>(dst, i, load<S>(src, i));
}

// D: the accumulator's dtype, S: the addend's (equal, or D = fp32 for fp32 accumulation).
template <int D, int S>
__global__ void accumulate_kernel(void* dst, const void* src, std::size_t n, bool vec) {
  if (vec)
    for (std::size_t q = first_index(); q < n / 4; q += grid_stride()) {
      F4 a = load4<D>(dst, q);
      const F4 b = load4<S>(src, q);
#pragma unroll
      for (int k = 0; k < 4; ++k) a.v[k] = __fadd_rn(a.v[k], b.v[k]);
      store4<D>(dst, q, a);
    }
  for (std::size_t i = tail_start(n, vec) + first_index(); i < n; i += grid_stride())
    store<D>(dst, i, __fadd_rn(load<D>(dst, i), load<S>(src, i)));
}

template <int T>
__global__ void divide_kernel(void* buf, std::size_t n, float d, bool vec) {
  if (vec)
    for (std::size_t q = first_index(); q < n / 4; q += grid_stride()) {
      F4 a = load4<T>(buf, q);
#pragma unroll
      for (int k = 0; k < 4; ++k) a.v[k] = __fdiv_rn(a.v[k], d);
      store4<T>(buf, q, a);
    }
  for (std::size_t i = tail_start(n, vec) + first_index(); i < n; i += grid_stride())
    store<T>(buf, i, __fdiv_rn(load<T>(buf, i), d));
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

// Block b adds its elements' squares into partials[b]; the grid is always sumsq_blocks() of the
// device, so the assignment of elements to blocks and threads, and so the rounding, never
// changes on a given device.
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

__global__ void sumsq_finish_kernel(const double* partials, int blocks, double* out) {
  double v = 0.0;
  for (int b = static_cast<int>(threadIdx.x); b < blocks; b += kThreads) v = __dadd_rn(v, partials[b]);
  const double total = block_sum(v);
  if (threadIdx.x == 0) *out = total;
}

// aligned4 by the runtime type code.
bool aligned4_as(DType t, const void* p) { return t == DType::f32 ? aligned4<kF32>(p) : aligned4<kBF16>(p); }

template <int S>
void convert_from(const void* src, void* dst, DType dt, std::size_t n, bool vec, cudaStream_t s) {
  const unsigned b = blocks_for(n, vec);
  switch (dt) {
    case DType::f32: convert_kernel<S, kF32><<<b, kThreads, 0, s>>>(src, dst, n, vec); break;
    case DType::bf16: convert_kernel<S, kBF16><<<b, kThreads, 0, s>>>(src, dst, n, vec); break;
    case DType::f16: convert_kernel<S, kF16><<<b, kThreads, 0, s>>>(src, dst, n, vec); break;
  }
}

}  // namespace

void launch_convert(const void* src, DType st, void* dst, DType dt, std::size_t n, cudaStream_t s) {
  if (n == 0) return;
  if (st == dt) {
    if (src != dst) ZERO_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * dtype_size(st), cudaMemcpyDeviceToDevice, s));
    return;
  }
  const bool vec = aligned4_as(st, src) && aligned4_as(dt, dst);
  switch (st) {
    case DType::f32: convert_from<kF32>(src, dst, dt, n, vec, s); break;
    case DType::bf16: convert_from<kBF16>(src, dst, dt, n, vec, s); break;
    case DType::f16: convert_from<kF16>(src, dst, dt, n, vec, s); break;
  }
  ZERO_CUDA_CHECK(cudaGetLastError());
}

void launch_accumulate(void* dst, DType dt, const void* src, DType st, std::size_t n, cudaStream_t s) {
  if (n == 0) return;
  ZERO_CHECK(dt == st || dt == DType::f32, "launch_accumulate: a 16-bit accumulator takes its own dtype only");
  const bool vec = aligned4_as(dt, dst) && aligned4_as(st, src);
  const unsigned b = blocks_for(n, vec);
  switch (st) {
    case DType::f32: accumulate_kernel<kF32, kF32><<<b, kThreads, 0, s>>>(dst, src, n, vec); break;
    case DType::bf16:
      if (dt == DType::f32)
        accumulate_kernel<kF32, kBF16><<<b, kThreads, 0, s>>>(dst, src, n, vec);
      else
        accumulate_kernel<kBF16, kBF16><<<b, kThreads, 0, s>>>(dst, src, n, vec);
      break;
    case DType::f16:
      if (dt == DType::f32)
        accumulate_kernel<kF32, kF16><<<b, kThreads, 0, s>>>(dst, src, n, vec);
      else
        accumulate_kernel<kF16, kF16><<<b, kThreads, 0, s>>>(dst, src, n, vec);
      break;
  }
  ZERO_CUDA_CHECK(cudaGetLastError());
}

void launch_divide(void* buf, DType t, std::size_t n, float d, cudaStream_t s) {
  if (n == 0) return;
  const bool vec = aligned4_as(t, buf);
  const unsigned b = blocks_for(n, vec);
  switch (t) {
    case DType::f32: divide_kernel<kF32><<<b, kThreads, 0, s>>>(buf, n, d, vec); break;
    case DType::bf16: divide_kernel<kBF16><<<b, kThreads, 0, s>>>(buf, n, d, vec); break;
    case DType::f16: divide_kernel<kF16><<<b, kThreads, 0, s>>>(buf, n, d, vec); break;
  }
  ZERO_CUDA_CHECK(cudaGetLastError());
}

int sumsq_blocks() {
  int device = 0, sms = 0, per_sm = 0;
  ZERO_CUDA_CHECK(cudaGetDevice(&device));
  ZERO_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  // The fp32 instance stands for all three: same block size, same shared memory.
  ZERO_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, sumsq_add_kernel<kF32>, kThreads, 0));
  return std::max(1, sms * std::max(1, per_sm));
}

void launch_sumsq_add(const void* g, DType t, std::size_t n, double* partials, int blocks, cudaStream_t s) {
  if (n == 0) return;
  switch (t) {
    case DType::f32: sumsq_add_kernel<kF32><<<blocks, kThreads, 0, s>>>(g, n, partials); break;
    case DType::bf16: sumsq_add_kernel<kBF16><<<blocks, kThreads, 0, s>>>(g, n, partials); break;
    case DType::f16: sumsq_add_kernel<kF16><<<blocks, kThreads, 0, s>>>(g, n, partials); break;
  }
  ZERO_CUDA_CHECK(cudaGetLastError());
}

void launch_sumsq_finish(const double* partials, int blocks, double* out, cudaStream_t s) {
  sumsq_finish_kernel<<<1, kThreads, 0, s>>>(partials, blocks, out);
  ZERO_CUDA_CHECK(cudaGetLastError());
}

}  // namespace zero::cuda
