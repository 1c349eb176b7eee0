// Causal self-attention backward (FlashAttention-2 recomputation, deterministic, no atomics):
//   1. D_i = dot(dout_i, out_i) per row and head, into the scratch.
//   2. One CTA per (key tile, batch*kv head): loops over the query tiles at or below the diagonal,
//      rebuilds P from lse, accumulates dV = P^T dO and dK = dS^T Q in registers, adds once.
//   3. One CTA per (query tile, batch*head): loops over the key tiles, rebuilds P and dP,
//      accumulates dQ = dS K in registers, adds once.
// Pass 3 recomputes S = Q K^T and dP = dO V^T that pass 2 already had: 7 tile products per
// (query tile, key tile) pair instead of 5 (the backward's matrix work x1.4), the price of
// dQ without atomics (a fixed summation order, so bitwise-reproducible gradients). The dQ, dK
// and dV columns are disjoint. The tiling is attention_tiles.cuh's.
//
// Grouped-query attention: the NH / NKV query heads h = g, g + NKV, ... share key/value head g,
// so dK and dV of g are sums over all of them. Pass 2 runs one CTA per (key tile, batch*g) that
// loops over those query heads in increasing order inside the CTA, so each dK/dV element is
// still owned by one thread and summed in a fixed order (no atomics, no second reduction). The
// ALiBi bias, a constant of (head, i, j), only enters the rebuilt probabilities: dS is the
// gradient of the biased score, which is that of q.k.
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

// drow[(b*NH + h)*T + t] = dot(dout, out) over head h's columns of row (b, t); one warp each.
template <int HS>
__global__ void attention_drow_kernel(float* drow, const bf16* dout, const bf16* out, int T, int C, int NH,
                                      std::size_t rows) {
  const std::size_t w = (static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (w >= rows) return;  // w is the same for the whole warp
  const int t = static_cast<int>(w % T);
  const std::size_t bh = w / T;
  const std::size_t b = bh / NH, h = bh % NH;
  const std::size_t off = (b * T + t) * C + h * HS;
  float acc = 0.0f;
  for (int d = lane; d < HS; d += 32) acc += __bfloat162float(dout[off + d]) * __bfloat162float(out[off + d]);
  for (int m = 16; m > 0; m /= 2) acc += __shfl_xor_sync(kFullMask, acc, m);
  if (lane == 0) drow[w] = acc;
}

template <int HS>
struct BwdTiles {
  bf16 *q, *dout, *k, *v;
  float *s, *dp;
  bf16 *p, *ds;
  float *lse, *drow;

  __device__ explicit BwdTiles(unsigned char* smem) {
    using L = Smem<HS>;
    q = reinterpret_cast<bf16*>(smem);
    dout = reinterpret_cast<bf16*>(smem + L::tile_h);
    k = reinterpret_cast<bf16*>(smem + 2 * L::tile_h);
    v = reinterpret_cast<bf16*>(smem + 3 * L::tile_h);
    unsigned char* rest = smem + 4 * L::tile_h;
    s = reinterpret_cast<float*>(rest);
    dp = reinterpret_cast<float*>(rest + L::tile_s);
    p = reinterpret_cast<bf16*>(rest + 2 * L::tile_s);
    ds = reinterpret_cast<bf16*>(rest + 2 * L::tile_s + L::tile_p);
    lse = reinterpret_cast<float*>(rest + 2 * L::tile_s + 2 * L::tile_p);
    drow = reinterpret_cast<float*>(rest + 2 * L::tile_s + 2 * L::tile_p + L::row_f);
  }
};

// The query tile's rows of q and dout, and their lse and D (zeros past T).
template <int HS>
__device__ void load_query_side(const BwdTiles<HS>& sm, const bf16* q_src, const bf16* do_src, const float* lse_bh,
                                const float* drow_bh, std::size_t ld, int C, int q0, int T) {
  load_tile<HS>(sm.q, q_src, ld, q0, T);
  load_tile<HS>(sm.dout, do_src, static_cast<std::size_t>(C), q0, T);
  for (int r = threadIdx.x; r < kRows; r += kThreads) {
    const bool in = q0 + r < T;
    sm.lse[r] = in ? lse_bh[q0 + r] : 0.0f;
    sm.drow[r] = in ? drow_bh[q0 + r] : 0.0f;
  }
}

// One CTA per (key tile, batch*key/value head): dK and dV of the tile's 64 keys, summed over the
// query heads of the group in increasing order.
template <int HS>
__global__ void __launch_bounds__(kThreads)
    attention_dkdv_kernel(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* drow, Heads g,
                          float scale, float scale_log2) {
  using L = Smem<HS>;
  extern __shared__ __align__(128) unsigned char smem[];
  const BwdTiles<HS> sm(smem);

  const int T = g.T;
  const int kt = blockIdx.x;  // key tile 0 meets every query tile: first is longest
  const int bg = blockIdx.y, b = bg / g.NKV, kvh = bg % g.NKV;
  const int k0 = kt * kRows;
  const std::size_t ld = g.qkv_ld(HS);
  const int C = g.out_ld(HS);
  const std::size_t row_base = static_cast<std::size_t>(b) * T;
  const bf16* k_src = qkv + row_base * ld + g.k_col(HS) + kvh * HS;
  const bf16* v_src = qkv + row_base * ld + g.v_col(HS) + kvh * HS;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row = warp * kF + lane / 2;  // a key row of the tile
  const int half = lane % 2;             // which 32 query columns
  const int rot = lane_rotation(lane);
  const int j = k0 + row;

  load_tile<HS>(sm.k, k_src, ld, k0, T);
  load_tile<HS>(sm.v, v_src, ld, k0, T);

  FragAcc dk[HS / kF], dv[HS / kF];
#pragma unroll
  for (int n = 0; n < HS / kF; ++n) {
    wmma::fill_fragment(dk[n], 0.0f);
    wmma::fill_fragment(dv[n], 0.0f);
  }

  float* s_w = sm.s + warp * kF * L::ld_s;
  float* dp_w = sm.dp + warp * kF * L::ld_s;
  const int n_query_tiles = attn::tile_count(T, kRows);
  for (int h = kvh; h < g.NH; h += g.NKV) {
    const std::size_t bh = static_cast<std::size_t>(b) * g.NH + h;
    const bf16* q_src = qkv + row_base * ld + h * HS;
    const bf16* do_src = dout + row_base * C + h * HS;
    const float* lse_bh = lse + bh * T;
    const float* drow_bh = drow + bh * T;
    const float slope_log2 = g.slope_log2(h);
    for (int qt = attn::causal_first_query_tile(kt, kRows, kRows); qt < n_query_tiles; ++qt) {
      const int q0 = qt * kRows;
      __syncthreads();  // every warp is done with the previous query tile
      load_query_side<HS>(sm, q_src, do_src, lse_bh, drow_bh, ld, C, q0, T);
      __syncthreads();

      // S^T = K Q^T and dP^T = V dO^T for this warp's 16 keys x the tile's 64 queries.
      product_abt<HS>(s_w, L::ld_s, sm.k + warp * kF * L::ld_h, L::ld_h, sm.q, L::ld_h);
      product_abt<HS>(dp_w, L::ld_s, sm.v + warp * kF * L::ld_h, L::ld_h, sm.dout, L::ld_h);
      __syncwarp();

      const float* s_row = sm.s + row * L::ld_s + half * 32;
      const float* dp_row = sm.dp + row * L::ld_s + half * 32;
      bf16* p_row = sm.p + row * L::ld_p + half * 32;
      bf16* ds_row = sm.ds + row * L::ld_p + half * 32;
      for (int cc = 0; cc < 32; ++cc) {
        const int c = (cc + rot) % 32;
        const int col = half * 32 + c;
        const int i = q0 + col;
        const float p = attn::attends(i, j, T)
                            ? attn::prob_from_lse(biased_score(s_row[c], scale_log2, slope_log2, i, j), sm.lse[col])
                            : 0.0f;
        p_row[c] = __float2bfloat16(p);
        ds_row[c] = __float2bfloat16(attn::score_grad(p, dp_row[c], sm.drow[col], scale));
      }
      __syncwarp();

      product_ab_acc<HS>(dv, sm.p + warp * kF * L::ld_p, L::ld_p, sm.dout, L::ld_h);
      product_ab_acc<HS>(dk, sm.ds + warp * kF * L::ld_p, L::ld_p, sm.q, L::ld_h);
    }
  }

  // The warp's own score rows are free now: they stage the accumulators.
  bf16* dk_dst = dqkv + row_base * ld + g.k_col(HS) + kvh * HS;
  bf16* dv_dst = dqkv + row_base * ld + g.v_col(HS) + kvh * HS;
  add_fragments<HS>(dk_dst, ld, k0 + warp * kF, T, dk, s_w, L::ld_s);
  add_fragments<HS>(dv_dst, ld, k0 + warp * kF, T, dv, s_w, L::ld_s);
}

// One CTA per (query tile, batch*head): dQ of the tile's 64 queries.
template <int HS>
__global__ void __launch_bounds__(kThreads)
    attention_dq_kernel(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* drow, Heads g,
                        float scale, float scale_log2) {
  using L = Smem<HS>;
  extern __shared__ __align__(128) unsigned char smem[];
  const BwdTiles<HS> sm(smem);

  const int T = g.T;
  const int qt = static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x);
  const int bh = blockIdx.y, b = bh / g.NH, h = bh % g.NH;
  const int q0 = qt * kRows;
  const std::size_t ld = g.qkv_ld(HS);
  const int C = g.out_ld(HS);
  const std::size_t row_base = static_cast<std::size_t>(b) * T;
  const bf16* q_src = qkv + row_base * ld + h * HS;
  const bf16* k_src = qkv + row_base * ld + g.k_col(HS) + g.kv_head(h) * HS;
  const bf16* v_src = qkv + row_base * ld + g.v_col(HS) + g.kv_head(h) * HS;
  const bf16* do_src = dout + row_base * C + h * HS;
  const float slope_log2 = g.slope_log2(h);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row = warp * kF + lane / 2;  // a query row of the tile
  const int half = lane % 2;             // which 32 key columns
  const int rot = lane_rotation(lane);
  const int i = q0 + row;

  load_query_side<HS>(sm, q_src, do_src, lse + static_cast<std::size_t>(bh) * T,
                      drow + static_cast<std::size_t>(bh) * T, ld, C, q0, T);

  FragAcc dq[HS / kF];
#pragma unroll
  for (int n = 0; n < HS / kF; ++n) wmma::fill_fragment(dq[n], 0.0f);

  float* s_w = sm.s + warp * kF * L::ld_s;
  float* dp_w = sm.dp + warp * kF * L::ld_s;
  const int n_key_tiles = attn::causal_key_tiles(qt, kRows, kRows, T);
  for (int kt = 0; kt < n_key_tiles; ++kt) {
    const int k0 = kt * kRows;
    __syncthreads();  // every warp is done with the previous K, V (and the query side is in)
    load_tile<HS>(sm.k, k_src, ld, k0, T);
    load_tile<HS>(sm.v, v_src, ld, k0, T);
    __syncthreads();

    // S = Q K^T and dP = dO V^T for this warp's 16 queries x the tile's 64 keys.
    product_abt<HS>(s_w, L::ld_s, sm.q + warp * kF * L::ld_h, L::ld_h, sm.k, L::ld_h);
    product_abt<HS>(dp_w, L::ld_s, sm.dout + warp * kF * L::ld_h, L::ld_h, sm.v, L::ld_h);
    __syncwarp();

    const float* s_row = sm.s + row * L::ld_s + half * 32;
    const float* dp_row = sm.dp + row * L::ld_s + half * 32;
    bf16* ds_row = sm.ds + row * L::ld_p + half * 32;
    const float row_lse = sm.lse[row], row_d = sm.drow[row];
    for (int cc = 0; cc < 32; ++cc) {
      const int c = (cc + rot) % 32;
      const int jj = k0 + half * 32 + c;
      const float p = attn::attends(i, jj, T)
                          ? attn::prob_from_lse(biased_score(s_row[c], scale_log2, slope_log2, i, jj), row_lse)
                          : 0.0f;
      ds_row[c] = __float2bfloat16(attn::score_grad(p, dp_row[c], row_d, scale));
    }
    __syncwarp();

    product_ab_acc<HS>(dq, sm.ds + warp * kF * L::ld_p, L::ld_p, sm.k, L::ld_h);
  }

  add_fragments<HS>(dqkv + row_base * ld + h * HS, ld, q0 + warp * kF, T, dq, s_w, L::ld_s);
}

}  // namespace

template <int HS>
void launch_backward(bf16* dqkv, float* drow, const bf16* dout, const bf16* qkv, const bf16* out, const float* lse,
                     int B, const Heads& g, cudaStream_t stream) {
  const int T = g.T, C = g.out_ld(HS), NH = g.NH;
  const std::size_t rows = static_cast<std::size_t>(B) * NH * T;
  constexpr int kDrowThreads = 256;
  const auto drow_blocks = static_cast<unsigned>((rows * 32 + kDrowThreads - 1) / kDrowThreads);
  attention_drow_kernel<HS><<<drow_blocks, kDrowThreads, 0, stream>>>(drow, dout, out, T, C, NH, rows);
  GPT_CUDA_CHECK(cudaGetLastError());

  constexpr std::size_t bytes = Smem<HS>::bwd_bytes;
  const float scale = scale_of(HS), scale_log2 = scale * kLog2e;
  const dim3 kv_grid(tile_count(T, kRows), B * g.NKV);
  use_shared_memory("attention_backward", reinterpret_cast<const void*>(attention_dkdv_kernel<HS>), bytes);
  attention_dkdv_kernel<HS><<<kv_grid, kThreads, bytes, stream>>>(dqkv, dout, qkv, lse, drow, g, scale, scale_log2);
  GPT_CUDA_CHECK(cudaGetLastError());
  const dim3 q_grid(tile_count(T, kRows), B * NH);
  use_shared_memory("attention_backward", reinterpret_cast<const void*>(attention_dq_kernel<HS>), bytes);
  attention_dq_kernel<HS><<<q_grid, kThreads, bytes, stream>>>(dqkv, dout, qkv, lse, drow, g, scale, scale_log2);
  GPT_CUDA_CHECK(cudaGetLastError());
}

template void launch_backward<32>(bf16*, float*, const bf16*, const bf16*, const bf16*, const float*, int, const Heads&,
                                  cudaStream_t);
template void launch_backward<64>(bf16*, float*, const bf16*, const bf16*, const bf16*, const float*, int, const Heads&,
                                  cudaStream_t);
template void launch_backward<128>(bf16*, float*, const bf16*, const bf16*, const bf16*, const float*, int,
                                   const Heads&, cudaStream_t);

}  // namespace zero::gpt::cuda::attn
