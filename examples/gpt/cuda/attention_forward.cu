// Causal self-attention forward, flash style: no T x T matrix ever reaches memory. One CTA per
// (query tile, batch*head); key tiles 0 .. diagonal, online softmax, the fp32 output accumulator
// in shared memory (rescaled per row, then reloaded as the accumulator of the P.V product);
// writes out (bf16) and lse (fp32, natural log). The tiling is attention_tiles.cuh's. Query head
// h reads key/value head h % NKV (grouped-query attention) and adds its ALiBi bias (if any) to
// the scores before the softmax.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cmath>
#include <cstdint>

#include "gpt/cuda/attention_math.cuh"
#include "gpt/cuda/attention_tiles.cuh"
#include "gpt/cuda/status_check.hpp"

namespace zero::gpt::cuda::attn {

namespace {

template <int HS>
__global__ void __launch_bounds__(kThreads)
    attention_forward_kernel(bf16* out, float* lse, const bf16* qkv, Heads g, float scale_log2) {
  using L = Smem<HS>;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* sQ = reinterpret_cast<bf16*>(smem);
  bf16* sK = reinterpret_cast<bf16*>(smem + L::tile_h);
  bf16* sV = reinterpret_cast<bf16*>(smem + 2 * L::tile_h);
  float* sS = reinterpret_cast<float*>(smem + 3 * L::tile_h);
  bf16* sP = reinterpret_cast<bf16*>(smem + 3 * L::tile_h + L::tile_s);
  float* sO = reinterpret_cast<float*>(smem + 3 * L::tile_h + L::tile_s + L::tile_p);

  // The last query tiles see the most keys: start them first.
  const int qt = static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x);
  const int T = g.T;
  const int bh = blockIdx.y, b = bh / g.NH, h = bh % g.NH;
  const int q0 = qt * kRows;
  const std::size_t ld = g.qkv_ld(HS);
  const int C = g.out_ld(HS);
  const bf16* row_src = qkv + static_cast<std::size_t>(b) * T * ld;
  const bf16* q_src = row_src + h * HS;
  const bf16* k_src = row_src + g.k_col(HS) + g.kv_head(h) * HS;
  const bf16* v_src = row_src + g.v_col(HS) + g.kv_head(h) * HS;
  const float slope_log2 = g.slope_log2(h);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row = warp * kF + lane / 2;  // the tile row this lane pair handles
  const int half = lane % 2;             // which 32 columns (of S) / HS/2 columns (of O)
  const int rot = lane_rotation(lane);
  const int i = q0 + row;

  load_tile<HS>(sQ, q_src, ld, q0, T);
  for (int e = threadIdx.x; e < kRows * L::ld_o; e += kThreads) sO[e] = 0.0f;

  attn::OnlineSoftmax st = attn::online_init();
  const int n_key_tiles = attn::causal_key_tiles(qt, kRows, kRows, T);
  for (int kt = 0; kt < n_key_tiles; ++kt) {
    const int k0 = kt * kRows;
    __syncthreads();  // every warp is done with the previous K, V
    load_tile<HS>(sK, k_src, ld, k0, T);
    load_tile<HS>(sV, v_src, ld, k0, T);
    __syncthreads();

    float* s_w = sS + warp * kF * L::ld_s;
    product_abt<HS>(s_w, L::ld_s, sQ + warp * kF * L::ld_h, L::ld_h, sK, L::ld_h);
    __syncwarp();

    // Row-wise online softmax on this lane's 32 scores.
    float* s_row = sS + row * L::ld_s + half * 32;
    bf16* p_row = sP + row * L::ld_p + half * 32;
    float tile_max = -INFINITY;
    for (int cc = 0; cc < 32; ++cc) {
      const int c = (cc + rot) % 32;
      const int j = k0 + half * 32 + c;
      const float s2 = attn::attends(i, j, T) ? biased_score(s_row[c], scale_log2, slope_log2, i, j) : -INFINITY;
      s_row[c] = s2;
      tile_max = fmaxf(tile_max, s2);
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullMask, tile_max, 1));
    const float alpha = attn::online_rescale(st, tile_max);
    float tile_sum = 0.0f;
    for (int cc = 0; cc < 32; ++cc) {
      const int c = (cc + rot) % 32;
      const float p = attn::online_prob(st, s_row[c]);
      p_row[c] = __float2bfloat16(p);
      tile_sum += p;
    }
    // Both lanes of the pair get the same sum (a + b == b + a), so their states stay equal.
    st.sum += tile_sum + __shfl_xor_sync(kFullMask, tile_sum, 1);
    float* o_row = sO + row * L::ld_o + half * (HS / 2);
    for (int cc = 0; cc < HS / 2; ++cc) o_row[(cc + rot) % (HS / 2)] *= alpha;
    __syncwarp();

    // O += P V, the accumulator round-tripping through shared memory.
    FragAcc acc[HS / kF];
    float* o_w = sO + warp * kF * L::ld_o;
#pragma unroll
    for (int n = 0; n < HS / kF; ++n) wmma::load_matrix_sync(acc[n], o_w + n * kF, L::ld_o, wmma::mem_row_major);
    product_ab_acc<HS>(acc, sP + warp * kF * L::ld_p, L::ld_p, sV, L::ld_h);
#pragma unroll
    for (int n = 0; n < HS / kF; ++n) wmma::store_matrix_sync(o_w + n * kF, acc[n], L::ld_o, wmma::mem_row_major);
    __syncwarp();
  }

  if (i < T) {
    const float inv = 1.0f / st.sum;  // sum >= 1: the row's maximum contributes exp2(0)
    const float* o_row = sO + row * L::ld_o + half * (HS / 2);
    bf16* dst = out + (static_cast<std::size_t>(b) * T + i) * C + h * HS + half * (HS / 2);
    for (int c = 0; c < HS / 2; c += 8) {
      uint4 raw;
      auto* v = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
      for (int k = 0; k < 4; ++k) v[k] = __floats2bfloat162_rn(o_row[c + 2 * k] * inv, o_row[c + 2 * k + 1] * inv);
      *reinterpret_cast<uint4*>(dst + c) = raw;
    }
    if (half == 0) lse[static_cast<std::size_t>(bh) * T + i] = attn::online_lse(st);
  }
}

}  // namespace

template <int HS>
void launch_forward(bf16* out, float* lse, const bf16* qkv, int B, const Heads& g, cudaStream_t stream) {
  constexpr std::size_t bytes = Smem<HS>::fwd_bytes;
  use_shared_memory("attention_forward", reinterpret_cast<const void*>(attention_forward_kernel<HS>), bytes);
  const dim3 grid(tile_count(g.T, kRows), B * g.NH);
  attention_forward_kernel<HS><<<grid, kThreads, bytes, stream>>>(out, lse, qkv, g, scale_of(HS) * kLog2e);
  GPT_CUDA_CHECK(cudaGetLastError());
}

template void launch_forward<32>(bf16*, float*, const bf16*, int, const Heads&, cudaStream_t);
template void launch_forward<64>(bf16*, float*, const bf16*, int, const Heads&, cudaStream_t);
template void launch_forward<128>(bf16*, float*, const bf16*, int, const Heads&, cudaStream_t);

}  // namespace zero::gpt::cuda::attn
