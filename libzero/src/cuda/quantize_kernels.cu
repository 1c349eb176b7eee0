// Block quantization on the device (see kernels.hpp): the host quantizer's layout and rounding,
// element by element through comm/quantize_math.hpp.
//
// Every kernel works by quantization block: a thread block takes one quantization block at a
// time (grid-stride over the blocks of all messages), reads its scale once and spreads its
// threads over the block's elements, so no thread divides an element index by the block size.
// A launch covers all the messages of one exchange (`count` of them, n values each, their
// packed forms quant::packed_bytes(n, block, bits) apart): one launch per exchange, not per rank.
#include "comm/quantize_math.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/device_math.cuh"
#include "cuda/kernels.hpp"
#include "zero/error.hpp"

namespace zero::cuda {

namespace {

using namespace dev;
namespace qm = zero::quant::math;

// Where quantization block g of `count` messages of nb blocks lies: message k, block b of it.
struct BlockAt {
  std::size_t k, b;
};
__device__ __forceinline__ BlockAt block_at(std::size_t g, std::size_t nb) {
  const std::size_t k = g / nb;  // once per quantization block, not per element
  return {k, g - k * nb};
}

// The packed slot message k goes to: k, or k + 1 from the skipped slot on (the one left zero).
__device__ __forceinline__ std::size_t slot_of(std::size_t k, std::size_t skip) { return k < skip ? k : k + 1; }

// One thread block per quantization block: the largest magnitude and whether every value was
// finite, reduced in shared memory, then the block's scale. A maximum has no rounding, so the
// reduction's order cannot change the scale. Message k's values start n elements after k-1's.
template <int T>
__global__ void scales_kernel(const void* src, std::size_t count, std::size_t n, std::size_t block, float top,
                              char* out, std::size_t packed, std::size_t skip) {
  __shared__ float sh_max[kThreads];
  __shared__ int sh_finite[kThreads];
  const std::size_t nb = qm::blocks(n, block);
  for (std::size_t g = blockIdx.x; g < count * nb; g += gridDim.x) {
    const BlockAt at = block_at(g, nb);
    const std::size_t base = at.k * n, first = at.b * block, last = first + block < n ? first + block : n;
    float amax = 0.0f;
    int finite = 1;
    for (std::size_t i = first + threadIdx.x; i < last; i += blockDim.x) {
      const float x = load<T>(src, base + i);
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
    if (threadIdx.x == 0) {
      auto* scales = reinterpret_cast<float*>(out + slot_of(at.k, skip) * packed);
      scales[at.b] = qm::block_scale(sh_max[0], sh_finite[0] != 0, top);
    }
    __syncthreads();  // the next block's values overwrite the shared arrays
  }
}

template <int T>
__global__ void quantize_int8_kernel(const void* src, std::size_t n, std::size_t block, const float* scales,
                                     unsigned char* q) {
  const std::size_t nb = qm::blocks(n, block);
  for (std::size_t b = blockIdx.x; b < nb; b += gridDim.x) {
    const float scale = scales[b];
    const std::size_t first = b * block, last = first + block < n ? first + block : n;
    for (std::size_t i = first + threadIdx.x; i < last; i += blockDim.x)
      q[i] = static_cast<unsigned char>(static_cast<signed char>(qm::quantize_value(load<T>(src, i), scale, 127.0f)));
  }
}

// Message k of `in` (packed apart) into dst's elements [k n, (k + 1) n).
template <int T>
__global__ void dequantize_int8_kernel(const char* in, std::size_t count, std::size_t n, std::size_t block,
                                       std::size_t packed, void* dst) {
  const std::size_t nb = qm::blocks(n, block);
  for (std::size_t g = blockIdx.x; g < count * nb; g += gridDim.x) {
    const BlockAt at = block_at(g, nb);
    const auto* scales = reinterpret_cast<const float*>(in + at.k * packed);
    const auto* q = reinterpret_cast<const unsigned char*>(scales + nb);
    const float scale = scales[at.b];
    const std::size_t base = at.k * n, first = at.b * block, last = first + block < n ? first + block : n;
    for (std::size_t i = first + threadIdx.x; i < last; i += blockDim.x)
      store<T>(dst, base + i, qm::dequantize_value(static_cast<signed char>(q[i]), scale));
  }
}

// Error feedback, message k of v into slot_of(k) of out. int8: one thread per element of the
// block. int4: one thread per byte whose first (even) element lies in the block; with an odd
// block size its second element may be the next block's first, whose scale it then reads. Every
// byte and every residual has exactly one writer.
template <bool Int8>
__global__ void quantize_keep_error_kernel(float* v, std::size_t count, std::size_t n, std::size_t block, char* out,
                                           std::size_t packed, std::size_t skip) {
  const float top = qm::levels(Int8);
  const std::size_t nb = qm::blocks(n, block);
  for (std::size_t g = blockIdx.x; g < count * nb; g += gridDim.x) {
    const BlockAt at = block_at(g, nb);
    float* x = v + at.k * n;
    const auto* scales = reinterpret_cast<const float*>(out + slot_of(at.k, skip) * packed);
    auto* q = reinterpret_cast<unsigned char*>(out + slot_of(at.k, skip) * packed) + nb * sizeof(float);
    const float scale = scales[at.b];
    const std::size_t first = at.b * block, last = first + block < n ? first + block : n;
    if constexpr (Int8) {
      for (std::size_t i = first + threadIdx.x; i < last; i += blockDim.x) {
        const int k = qm::quantize_value(x[i], scale, top);
        q[i] = static_cast<unsigned char>(static_cast<signed char>(k));
        x[i] = x[i] - qm::dequantize_value(k, scale);  // what the receiver misses
      }
    } else {
      for (std::size_t j = (first + 1) / 2 + threadIdx.x; 2 * j < last; j += blockDim.x) {
        unsigned char byte = 0;
        for (std::size_t i = 2 * j; i < 2 * j + 2 && i < n; ++i) {
          const float s = i < last ? scale : scales[at.b + 1];
          const int k = qm::quantize_value(x[i], s, top);
          byte |= qm::int4_nibble(k, i);
          x[i] = x[i] - qm::dequantize_value(k, s);
        }
        q[j] = byte;
      }
    }
  }
}

// acc[i] += the dequantized value i of each message in slots [first_slot, last_slot), in slot
// order: the fp32 sums are those of one dequantize-add per message, one after the other.
template <bool Int8>
__global__ void dequantize_add_kernel(const char* in, std::size_t first_slot, std::size_t last_slot, std::size_t n,
                                      std::size_t block, std::size_t packed, float* acc) {
  const std::size_t nb = qm::blocks(n, block);
  for (std::size_t b = blockIdx.x; b < nb; b += gridDim.x) {
    const std::size_t first = b * block, last = first + block < n ? first + block : n;
    for (std::size_t i = first + threadIdx.x; i < last; i += blockDim.x) {
      float sum = acc[i];
      for (std::size_t s = first_slot; s < last_slot; ++s) {
        const auto* scales = reinterpret_cast<const float*>(in + s * packed);
        const auto* q = reinterpret_cast<const unsigned char*>(scales + nb);
        const int k = Int8 ? static_cast<int>(static_cast<signed char>(q[i])) : qm::int4_value(q[i / 2], i);
        sum = sum + qm::dequantize_value(k, scales[b]);
      }
      acc[i] = sum;
    }
  }
}

// dst row r (row elements) = or += src row rows[r], in fp32; rows in device memory.
template <int T>
__global__ void gather_rows_kernel(float* dst, const void* src, std::size_t row, const std::int32_t* rows,
                                   std::size_t count, bool add) {
  for (std::size_t r = blockIdx.y; r < count; r += gridDim.y) {
    const std::size_t from = static_cast<std::size_t>(rows[r]) * row;
    float* to = dst + r * row;
    for (std::size_t i = first_index(); i < row; i += grid_stride()) {
      const float x = load<T>(src, from + i);
      to[i] = add ? to[i] + x : x;
    }
  }
}

unsigned quant_blocks(std::size_t blocks) { return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks); }

// Threads per quantization block: the block's elements (int4: its bytes) in whole warps, at most
// kThreads.
unsigned quant_threads(std::size_t per_block) {
  const std::size_t warps = (per_block + 31) / 32 * 32;
  return static_cast<unsigned>(warps < static_cast<std::size_t>(kThreads) ? warps : kThreads);
}

void check_block(std::size_t block, const char* who) {
  ZERO_CHECK(block >= 1, std::string(who) + ": the quantization block size must be at least 1");
}

// The scales of `count` messages of src (dtype T) into their slots of out, after zeroing the
// slots from the first value byte on (int4 bytes are written whole, and the padding and the
// skipped slot must read zero, as the host's do). The scales kernel runs with kThreads: its
// shared-memory reduction is sized for it.
template <int T>
void write_scales(const void* src, std::size_t count, std::size_t n, std::size_t block, bool int8, char* out,
                  std::size_t skip, cudaStream_t s) {
  const std::size_t packed = qm::packed_bytes(n, block, int8);
  const std::size_t slots = skip <= count ? count + 1 : count;
  // From the first slot's values on (its scales are written next), or from its start when it is
  // the skipped one.
  const std::size_t start = skip == 0 ? 0 : qm::blocks(n, block) * sizeof(float);
  ZERO_CUDA_CHECK(cudaMemsetAsync(out + start, 0, slots * packed - start, s));
  scales_kernel<T><<<quant_blocks(count * qm::blocks(n, block)), kThreads, 0, s>>>(src, count, n, block,
                                                                                   qm::levels(int8), out, packed, skip);
}

}  // namespace

void launch_quantize_int8(const void* src, DType t, std::size_t n, std::size_t block, void* out, cudaStream_t s) {
  check_block(block, "launch_quantize_int8");
  if (n == 0) return;
  auto* packed = static_cast<char*>(out);
  const auto* scales = reinterpret_cast<const float*>(packed);
  auto* q = reinterpret_cast<unsigned char*>(packed) + qm::blocks(n, block) * sizeof(float);
  const unsigned b = quant_blocks(qm::blocks(n, block)), th = quant_threads(block);
  constexpr std::size_t kNoSkip = ~std::size_t{0};
  // The scales are launched first, each in its own statement: a launch written inside another
  // launch's arguments would run between that launch's configuration and its call.
  switch (t) {
    case DType::f32:
      write_scales<kF32>(src, 1, n, block, true, packed, kNoSkip, s);
      quantize_int8_kernel<kF32><<<b, th, 0, s>>>(src, n, block, scales, q);
      break;
    case DType::bf16:
      write_scales<kBF16>(src, 1, n, block, true, packed, kNoSkip, s);
      quantize_int8_kernel<kBF16><<<b, th, 0, s>>>(src, n, block, scales, q);
      break;
    case DType::f16:
      write_scales<kF16>(src, 1, n, block, true, packed, kNoSkip, s);
      quantize_int8_kernel<kF16><<<b, th, 0, s>>>(src, n, block, scales, q);
      break;
  }
  ZERO_CUDA_CHECK(cudaGetLastError());
}

void launch_dequantize_int8(const void* in, std::size_t count, std::size_t n, std::size_t block, void* dst, DType t,
                            cudaStream_t s) {
  check_block(block, "launch_dequantize_int8");
  if (n == 0 || count == 0) return;
  const auto* p = static_cast<const char*>(in);
  const std::size_t packed = qm::packed_bytes(n, block, true);
  const unsigned b = quant_blocks(count * qm::blocks(n, block)), th = quant_threads(block);
  switch (t) {
    case DType::f32: dequantize_int8_kernel<kF32><<<b, th, 0, s>>>(p, count, n, block, packed, dst); break;
    case DType::bf16: dequantize_int8_kernel<kBF16><<<b, th, 0, s>>>(p, count, n, block, packed, dst); break;
    case DType::f16: dequantize_int8_kernel<kF16><<<b, th, 0, s>>>(p, count, n, block, packed, dst); break;
  }
  ZERO_CUDA_CHECK(cudaGetLastError());
}

void launch_quantize_keep_error(float* v, std::size_t count, std::size_t n, std::size_t block, bool int8, void* out,
                                std::size_t skip, cudaStream_t s) {
  check_block(block, "launch_quantize_keep_error");
  if (n == 0 || count == 0) {
    if (n > 0 && skip == 0) ZERO_CUDA_CHECK(cudaMemsetAsync(out, 0, qm::packed_bytes(n, block, int8), s));
    return;
  }
  auto* p = static_cast<char*>(out);
  write_scales<kF32>(v, count, n, block, int8, p, skip, s);
  const std::size_t packed = qm::packed_bytes(n, block, int8);
  const unsigned b = quant_blocks(count * qm::blocks(n, block));
  if (int8)
    quantize_keep_error_kernel<true><<<b, quant_threads(block), 0, s>>>(v, count, n, block, p, packed, skip);
  else
    quantize_keep_error_kernel<false><<<b, quant_threads((block + 1) / 2), 0, s>>>(v, count, n, block, p, packed, skip);
  ZERO_CUDA_CHECK(cudaGetLastError());
}

void launch_dequantize_add(const void* in, std::size_t first_slot, std::size_t last_slot, std::size_t n,
                           std::size_t block, bool int8, float* acc, cudaStream_t s) {
  check_block(block, "launch_dequantize_add");
  if (n == 0 || first_slot >= last_slot) return;
  const auto* p = static_cast<const char*>(in);
  const std::size_t packed = qm::packed_bytes(n, block, int8);
  const unsigned b = quant_blocks(qm::blocks(n, block)), th = quant_threads(block);
  if (int8)
    dequantize_add_kernel<true><<<b, th, 0, s>>>(p, first_slot, last_slot, n, block, packed, acc);
  else
    dequantize_add_kernel<false><<<b, th, 0, s>>>(p, first_slot, last_slot, n, block, packed, acc);
  ZERO_CUDA_CHECK(cudaGetLastError());
}

void launch_gather_rows(float* dst, const void* src, DType t, std::size_t row, const std::int32_t* rows,
                        std::size_t count, bool add, cudaStream_t s) {
  if (row == 0 || count == 0) return;
  const dim3 grid(blocks_for(row), static_cast<unsigned>(count < 65535 ? count : 65535));
  switch (t) {
    case DType::f32: gather_rows_kernel<kF32><<<grid, kThreads, 0, s>>>(dst, src, row, rows, count, add); break;
    case DType::bf16: gather_rows_kernel<kBF16><<<grid, kThreads, 0, s>>>(dst, src, row, rows, count, add); break;
    case DType::f16: gather_rows_kernel<kF16><<<grid, kThreads, 0, s>>>(dst, src, row, rows, count, add); break;
  }
  ZERO_CUDA_CHECK(cudaGetLastError());
}

}  // namespace zero::cuda
