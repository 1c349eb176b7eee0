// The forward kernel of attention_forward.cuh and its launch, per head size.
#include <cuda_runtime.h>

#include "gpt/cuda/attention_forward.cuh"
#include "gpt/cuda/attention_math.cuh"
#include "gpt/cuda/attention_tiles.cuh"
#include "gpt/cuda/status_check.hpp"

namespace zero::gpt::cuda::attn {

namespace {

template <int HS>
__global__ void __launch_bounds__(kThreads)
    attention_forward_kernel(bf16* out, float* lse, const bf16* qkv, Heads g, float scale_log2) {
  extern __shared__ __align__(128) unsigned char smem[];
  const Cta cta{static_cast<int>(threadIdx.x), static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y),
                static_cast<int>(gridDim.x), smem};
  forward_cta<HS>(cta, out, lse, qkv, g, scale_log2);
}

}  // namespace

template <int HS>
void launch_forward(bf16* out, float* lse, const bf16* qkv, int B, const Heads& g, cudaStream_t stream) {
  constexpr std::size_t bytes = Smem<HS>::fwd_bytes;
  use_shared_memory("attention_forward", reinterpret_cast<const void*>(attention_forward_kernel<HS>), bytes);
  const Grid grid = forward_grid(B, g);
  attention_forward_kernel<HS>
      <<<dim3(grid.x, grid.y), kThreads, bytes, stream>>>(out, lse, qkv, g, scale_of(HS) * kLog2e);
  GPT_CUDA_CHECK(cudaGetLastError());
}

template void launch_forward<32>(bf16*, float*, const bf16*, int, const Heads&, cudaStream_t);
template void launch_forward<64>(bf16*, float*, const bf16*, int, const Heads&, cudaStream_t);
template void launch_forward<128>(bf16*, float*, const bf16*, int, const Heads&, cudaStream_t);

}  // namespace zero::gpt::cuda::attn
