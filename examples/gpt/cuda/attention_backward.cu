// The backward kernels of attention_backward.cuh and their launches, per head size.
#include <cuda_runtime.h>

#include "gpt/cuda/attention_backward.cuh"
#include "gpt/cuda/attention_math.cuh"
#include "gpt/cuda/attention_tiles.cuh"
#include "gpt/cuda/status_check.hpp"

namespace zero::gpt::cuda::attn {

namespace {

__device__ __forceinline__ Cta this_thread(unsigned char* smem) {
  return {static_cast<int>(threadIdx.x), static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y),
          static_cast<int>(gridDim.x), smem};
}

template <int HS>
__global__ void __launch_bounds__(kThreads)
    attention_drow_kernel(float* drow, const bf16* dout, const bf16* out, Heads g, int B) {
  drow_cta<HS>(this_thread(nullptr), drow, dout, out, g, B);
}

template <int HS>
__global__ void __launch_bounds__(kThreads)
    attention_dkdv_kernel(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* drow, Heads g,
                          float scale, float scale_log2) {
  extern __shared__ __align__(128) unsigned char smem[];
  dkdv_cta<HS>(this_thread(smem), dqkv, dout, qkv, lse, drow, g, scale, scale_log2);
}

template <int HS>
__global__ void __launch_bounds__(kThreads)
    attention_dq_kernel(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* drow, Heads g,
                        float scale, float scale_log2) {
  extern __shared__ __align__(128) unsigned char smem[];
  dq_cta<HS>(this_thread(smem), dqkv, dout, qkv, lse, drow, g, scale, scale_log2);
}

}  // namespace

template <int HS>
void launch_backward(bf16* dqkv, float* drow, const bf16* dout, const bf16* qkv, const bf16* out, const float* lse,
                     int B, const Heads& g, cudaStream_t stream) {
  const Grid rows = drow_grid(B, g);
  attention_drow_kernel<HS><<<dim3(rows.x, rows.y), kThreads, 0, stream>>>(drow, dout, out, g, B);
  GPT_CUDA_CHECK(cudaGetLastError());

  constexpr std::size_t bytes = Smem<HS>::bwd_bytes;
  const float scale = scale_of(HS), scale_log2 = scale * kLog2e;
  const Grid kv = dkdv_grid(B, g);
  use_shared_memory("attention_backward", reinterpret_cast<const void*>(attention_dkdv_kernel<HS>), bytes);
  attention_dkdv_kernel<HS>
      <<<dim3(kv.x, kv.y), kThreads, bytes, stream>>>(dqkv, dout, qkv, lse, drow, g, scale, scale_log2);
  GPT_CUDA_CHECK(cudaGetLastError());
  const Grid q = dq_grid(B, g);
  use_shared_memory("attention_backward", reinterpret_cast<const void*>(attention_dq_kernel<HS>), bytes);
  attention_dq_kernel<HS>
      <<<dim3(q.x, q.y), kThreads, bytes, stream>>>(dqkv, dout, qkv, lse, drow, g, scale, scale_log2);
  GPT_CUDA_CHECK(cudaGetLastError());
}

template void launch_backward<32>(bf16*, float*, const bf16*, const bf16*, const bf16*, const float*, int, const Heads&,
                                  cudaStream_t);
template void launch_backward<64>(bf16*, float*, const bf16*, const bf16*, const bf16*, const float*, int, const Heads&,
                                  cudaStream_t);
template void launch_backward<128>(bf16*, float*, const bf16*, const bf16*, const bf16*, const float*, int,
                                   const Heads&, cudaStream_t);

}  // namespace zero::gpt::cuda::attn
