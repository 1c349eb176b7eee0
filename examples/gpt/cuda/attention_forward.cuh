// Causal self-attention forward, FlashAttention-2 style: no T x T matrix ever reaches memory.
// One CTA per (query tile, batch*head); a warp keeps its 16 query rows as mma fragments, and
// for each key tile 0 .. diagonal computes S = Q K^T into registers, masks and biases it, folds
// it into the rows' online softmax (the maximum reduced over the row's four lanes, the sum kept
// per lane until the end), and accumulates O += P V with P taken straight from the score
// registers. Writes out (bf16) and lse (fp32, natural log). Query head h reads key/value head
// h % NKV (grouped-query attention) and adds its ALiBi bias (if any) to the scores before the
// softmax. The tiling is attention_tiles.cuh's, the products attention_warp.cuh's.
#pragma once

#include <cstddef>
#include <cstdint>

#include "gpt/cuda/attention_math.cuh"
#include "gpt/cuda/attention_tiles.cuh"
#include "gpt/cuda/attention_warp.cuh"

namespace zero::gpt::cuda::attn {

inline Grid forward_grid(int B, const Heads& g) { return {tile_count(g.T, kRows), B * g.NH}; }

template <int HS>
ZERO_ATTN_DEV void forward_cta(const Cta& cta, bf16* out, float* lse, const bf16* qkv, const Heads& g,
                               float scale_log2) {
  constexpr int ld_s = Smem<HS>::ld;
  bf16* sQ = reinterpret_cast<bf16*>(cta.smem);
  bf16* sK = reinterpret_cast<bf16*>(cta.smem + Smem<HS>::tile);
  bf16* sV = reinterpret_cast<bf16*>(cta.smem + 2 * Smem<HS>::tile);

  // The last query tiles see the most keys: start them first.
  const int qt = cta.grid_x - 1 - cta.block_x;
  const int T = g.T;
  const int bh = cta.block_y, b = bh / g.NH, h = bh % g.NH;
  const int q0 = qt * kRows;
  const std::size_t ld = g.qkv_ld(HS);
  const int C = g.out_ld(HS);
  const bf16* q_src = g.q_at(qkv, b, h, HS);
  const bf16* k_src = g.k_at(qkv, b, g.kv_head(h), HS);
  const bf16* v_src = g.v_at(qkv, b, g.kv_head(h), HS);
  const float slope_log2 = g.slope_log2(h);

  const int warp = cta.thread / 32;
  const LanePos p(cta.thread % 32);
  const int w0 = q0 + warp * kWarpRows;  // the warp's first query row
  const int rows[2] = {w0 + p.row(0), w0 + p.row(2)};

  load_tile<HS>(cta, sQ, q_src, ld, q0, T);
  cta_sync();
  FragA<HS> qa;
  load_a<HS>(qa, sQ + warp * kWarpRows * ld_s, ld_s, p);

  Acc<HS> o;
  zero_acc<HS>(o);
  OnlineSoftmax st[2] = {online_init(), online_init()};  // rows[0], rows[1]; sums per lane
  const int n_key_tiles = causal_key_tiles(qt, kRows, kRows, T);
  for (int kt = 0; kt < n_key_tiles; ++kt) {
    const int k0 = kt * kRows;
    cta_sync();  // every warp is done with the previous K, V
    load_tile<HS>(cta, sK, k_src, ld, k0, T);
    load_tile<HS>(cta, sV, v_src, ld, k0, T);
    cta_sync();

    Acc<kRows> s;
    zero_acc<kRows>(s);
    mma_abt<kRows, HS>(s, qa, sK, ld_s, p);

    float tile_max[2] = {-INFINITY, -INFINITY};
    ZERO_ATTN_UNROLL
    for (int n = 0; n < kRows / 8; ++n)
      for (int e = 0; e < 4; ++e) {
        const int i = rows[e / 2], j = k0 + p.col(n, e);
        const float s2 = attends(i, j, T) ? biased_score(s[n][e], scale_log2, slope_log2, i, j) : -INFINITY;
        s[n][e] = s2;
        tile_max[e / 2] = fmaxf(tile_max[e / 2], s2);
      }
    float alpha[2];
    ZERO_ATTN_UNROLL
    for (int r = 0; r < 2; ++r) {
      tile_max[r] = fmaxf(tile_max[r], shfl_xor(tile_max[r], 1));
      tile_max[r] = fmaxf(tile_max[r], shfl_xor(tile_max[r], 2));
      alpha[r] = online_rescale(st[r], tile_max[r]);
    }
    ZERO_ATTN_UNROLL
    for (int n = 0; n < kRows / 8; ++n)
      for (int e = 0; e < 4; ++e) {
        const float pr = online_prob(st[e / 2], s[n][e]);
        s[n][e] = pr;
        st[e / 2].sum += pr;
      }
    ZERO_ATTN_UNROLL
    for (int n = 0; n < HS / 8; ++n)
      for (int e = 0; e < 4; ++e) o[n][e] *= alpha[e / 2];

    FragA<kRows> pa;
    acc_to_a<kRows>(pa, s);
    mma_ab<HS, kRows>(o, pa, sV, ld_s, p);
  }

  ZERO_ATTN_UNROLL
  for (int r = 0; r < 2; ++r) {
    // The quad's partial sums, added in an order every lane of the quad shares (a + b == b + a).
    st[r].sum += shfl_xor(st[r].sum, 1);
    st[r].sum += shfl_xor(st[r].sum, 2);
    const int i = rows[r];
    if (i >= T) continue;
    const float inv = 1.0f / st[r].sum;  // sum >= 1: the row's maximum contributes exp2(0)
    bf16* dst = g.out_at(out, b, h, HS) + static_cast<std::size_t>(i) * C;
    ZERO_ATTN_UNROLL
    for (int n = 0; n < HS / 8; ++n) {
      *reinterpret_cast<std::uint32_t*>(dst + p.col(n, 0)) = pack_bf16x2(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
    }
    if (p.t == 0) lse[static_cast<std::size_t>(bh) * T + i] = online_lse(st[r]);
  }
}

}  // namespace zero::gpt::cuda::attn
