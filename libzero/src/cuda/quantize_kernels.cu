// Block quantization on the device (see kernels.hpp): the host quantizer's layout and rounding,
// element by element through comm/quantize_math.hpp.
#include "comm/quantize_math.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/device_math.cuh"
#include "cuda/kernels.hpp"
#include "zero/error.hpp"

namespace zero::cuda {

namespace {

using namespace dev;
namespace qm = zero::quant::math;

// One thread block per quantization block (grid-stride over the blocks): the largest magnitude
// and whether every value was finite, reduced in shared memory, then the block's scale. A
// maximum has no rounding, so the reduction's order cannot change the scale.
template <int T>
__global__ void scales_kernel(const void* src, std::size_t n, std::size_t block, float top, float* scales) {
  __shared__ float sh_max[kThreads];
  __shared__ int sh_finite[kThreads];
  const std::size_t nb = qm::blocks(n, block);
  for (std::size_t b = blockIdx.x; b < nb; b += gridDim.x) {
    const std::size_t first = b * block, last = first + block < n ? first + block : n;
    float amax = 0.0f;
    int finite = 1;
    for (std::size_t i = first + threadIdx.x; i < last; i += blockDim.x) {
      const float x = load<T>(src, i);
      finite &= qm::finite(x) ? 1 : 0;
      amax = fmaxf(amax, fabsf(x));
    }
    sh_max[threadIdx.x] = amax;
    sh_finite[threadIdx.x] = finite;
    __syncthreads();
    for (int k = kThreads / 2; k > 0; k >>= 1) {
      if (static_cast<int>(threadIdx.x) < k) {
        sh_max[threadIdx.x] = fmaxf(sh_max[threadIdx.x], sh_max[threadIdx.x + k]);
        sh_finite[threadIdx.x] &= sh_finite[threadIdx.x + k];
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) scales[b] = qm::block_scale(sh_max[0], sh_finite[0] != 0, top);
    __syncthreads();  // the next block's values overwrite the shared arrays
  }
}

template <int T>
__global__ void quantize_int8_kernel(const void* src, std::size_t n, std::size_t block, const float* scales,
                                     unsigned char* q) {
  for (std::size_t i = first_index(); i < n; i += grid_stride())
    q[i] = static_cast<unsigned char>(
        static_cast<signed char>(qm::quantize_value(load<T>(src, i), scales[i / block], 127.0f)));
}

template <int T>
__global__ void dequantize_int8_kernel(const float* scales, const unsigned char* q, std::size_t n, std::size_t block,
                                       void* dst) {
  for (std::size_t i = first_index(); i < n; i += grid_stride())
    store<T>(dst, i, qm::dequantize_value(static_cast<signed char>(q[i]), scales[i / block]));
}

// One thread per value byte: an int4 byte holds two elements, which may belong to different
// quantization blocks (an odd block size), so each reads its own element's scale.
template <bool Int8>
__global__ void quantize_keep_error_kernel(float* v, std::size_t n, std::size_t block, const float* scales,
                                           unsigned char* q) {
  const float top = qm::levels(Int8);
  const std::size_t bytes = qm::value_bytes(n, Int8);
  for (std::size_t j = first_index(); j < bytes; j += grid_stride()) {
    if constexpr (Int8) {
      const float scale = scales[j / block];
      const int k = qm::quantize_value(v[j], scale, top);
      q[j] = static_cast<unsigned char>(static_cast<signed char>(k));
      v[j] = v[j] - qm::dequantize_value(k, scale);  // what the receiver misses
    } else {
      unsigned char byte = 0;
      for (std::size_t i = 2 * j; i < 2 * j + 2 && i < n; ++i) {
        const float scale = scales[i / block];
        const int k = qm::quantize_value(v[i], scale, top);
        byte |= qm::int4_nibble(k, i);
        v[i] = v[i] - qm::dequantize_value(k, scale);
      }
      q[j] = byte;
    }
  }
}

template <bool Int8>
__global__ void dequantize_add_kernel(const float* scales, const unsigned char* q, std::size_t n, std::size_t block,
                                      float* acc) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    const int k = Int8 ? static_cast<int>(static_cast<signed char>(q[i])) : qm::int4_value(q[i / 2], i);
    acc[i] = acc[i] + qm::dequantize_value(k, scales[i / block]);
  }
}

unsigned scale_blocks(std::size_t n, std::size_t block) {
  const std::size_t nb = qm::blocks(n, block);
  return static_cast<unsigned>(nb < kMaxBlocks ? nb : kMaxBlocks);
}

// The scales at the front of `out`, then the values' bytes zeroed through the padding (int4
// bytes are written whole, the padding must read zero as the host's does).
template <int T>
float* write_scales(const void* src, std::size_t n, std::size_t block, bool int8, void* out, cudaStream_t s) {
  auto* scales = static_cast<float*>(out);
  const std::size_t start = qm::blocks(n, block) * sizeof(float);
  ZERO_CUDA_CHECK(cudaMemsetAsync(static_cast<char*>(out) + start, 0, qm::packed_bytes(n, block, int8) - start, s));
  scales_kernel<T><<<scale_blocks(n, block), kThreads, 0, s>>>(src, n, block, qm::levels(int8), scales);
  return scales;
}

void check_block(std::size_t block, const char* who) {
  ZERO_CHECK(block >= 1, std::string(who) + ": the quantization block size must be at least 1");
}

}  // namespace

void launch_quantize_int8(const void* src, DType t, std::size_t n, std::size_t block, void* out, cudaStream_t s) {
  check_block(block, "launch_quantize_int8");
  if (n == 0) return;
  auto* q = static_cast<unsigned char*>(out) + qm::blocks(n, block) * sizeof(float);
  const unsigned b = blocks_for(n);
  // The scales are launched first, each in its own statement: a launch written inside another
  // launch's arguments would run between that launch's configuration and its call.
  switch (t) {
    case DType::f32: {
      const float* scales = write_scales<kF32>(src, n, block, true, out, s);
      quantize_int8_kernel<kF32><<<b, kThreads, 0, s>>>(src, n, block, scales, q);
      break;
    }
    case DType::bf16: {
      const float* scales = write_scales<kBF16>(src, n, block, true, out, s);
      quantize_int8_kernel<kBF16><<<b, kThreads, 0, s>>>(src, n, block, scales, q);
      break;
    }
    case DType::f16: {
      const float* scales = write_scales<kF16>(src, n, block, true, out, s);
      quantize_int8_kernel<kF16><<<b, kThreads, 0, s>>>(src, n, block, scales, q);
      break;
    }
  }
  ZERO_CUDA_CHECK(cudaGetLastError());
}

void launch_dequantize_int8(const void* in, std::size_t n, std::size_t block, void* dst, DType t, cudaStream_t s) {
  check_block(block, "launch_dequantize_int8");
  if (n == 0) return;
  const auto* scales = static_cast<const float*>(in);
  const auto* q = static_cast<const unsigned char*>(in) + qm::blocks(n, block) * sizeof(float);
  const unsigned b = blocks_for(n);
  switch (t) {
    case DType::f32: dequantize_int8_kernel<kF32><<<b, kThreads, 0, s>>>(scales, q, n, block, dst); break;
    case DType::bf16: dequantize_int8_kernel<kBF16><<<b, kThreads, 0, s>>>(scales, q, n, block, dst); break;
    case DType::f16: dequantize_int8_kernel<kF16><<<b, kThreads, 0, s>>>(scales, q, n, block, dst); break;
  }
  ZERO_CUDA_CHECK(cudaGetLastError());
}

void launch_quantize_keep_error(float* v, std::size_t n, std::size_t block, bool int8, void* out, cudaStream_t s) {
  check_block(block, "launch_quantize_keep_error");
  if (n == 0) return;
  const float* scales = write_scales<kF32>(v, n, block, int8, out, s);
  auto* q = static_cast<unsigned char*>(out) + qm::blocks(n, block) * sizeof(float);
  const unsigned b = blocks_for(qm::value_bytes(n, int8));
  if (int8)
    quantize_keep_error_kernel<true><<<b, kThreads, 0, s>>>(v, n, block, scales, q);
  else
    quantize_keep_error_kernel<false><<<b, kThreads, 0, s>>>(v, n, block, scales, q);
  ZERO_CUDA_CHECK(cudaGetLastError());
}

void launch_dequantize_add(const void* in, std::size_t n, std::size_t block, bool int8, float* acc, cudaStream_t s) {
  check_block(block, "launch_dequantize_add");
  if (n == 0) return;
  const auto* scales = static_cast<const float*>(in);
  const auto* q = static_cast<const unsigned char*>(in) + qm::blocks(n, block) * sizeof(float);
  const unsigned b = blocks_for(n);
  if (int8)
    dequantize_add_kernel<true><<<b, kThreads, 0, s>>>(scales, q, n, block, acc);
  else
    dequantize_add_kernel<false><<<b, kThreads, 0, s>>>(scales, q, n, block, acc);
  ZERO_CUDA_CHECK(cudaGetLastError());
}

}  // namespace zero::cuda
