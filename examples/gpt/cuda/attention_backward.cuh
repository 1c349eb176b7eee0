// Causal self-attention backward (FlashAttention-2 recomputation, deterministic, no atomics):
//   1. D_i = dot(dout_i, out_i) per row and head, into the scratch (drow_cta).
//   2. One CTA per (key tile, batch*kv head) (dkdv_cta): loops over the query tiles at or below
//      the diagonal, rebuilds P^T = exp(K Q^T - lse) and dP^T = V dO^T in registers, and
//      accumulates dV += P^T dO and dK += dS^T Q in registers, added to dqkv once at the end.
//   3. One CTA per (query tile, batch*head) (dq_cta): loops over the key tiles, rebuilds P and
//      dP, accumulates dQ += dS K in registers.
// Pass 3 recomputes S and dP that pass 2 already had: 7 tile products per (query tile, key
// tile) pair instead of 5, the price of dQ without atomics (a fixed summation order, so
// bitwise-reproducible gradients). The dQ, dK and dV columns are disjoint. A warp takes the
// other side's 64 rows in chunks of kChunk<HS> rows and skips a chunk the causal mask hides from
// all its 16 rows.
//
// Grouped-query attention: the NH / NKV query heads h = g, g + NKV, ... share key/value head g,
// so dK and dV of g are sums over all of them. Pass 2 runs one CTA per (key tile, batch*g) that
// loops over those query heads in increasing order inside the CTA, so each dK/dV element is
// still owned by one lane and summed in a fixed order. The ALiBi bias, a constant of
// (head, i, j), only enters the rebuilt probabilities: dS is the gradient of the biased score,
// which is that of q.k.
#pragma once

#include <cstddef>
#include <cstdint>

#include "gpt/cuda/attention_math.cuh"
#include "gpt/cuda/attention_tiles.cuh"
#include "gpt/cuda/attention_warp.cuh"

namespace zero::gpt::cuda::attn {

// Rows of the other side a warp takes at a time in passes 2 and 3. No register spills for sm_80
// and sm_90 (-Xptxas -v); at head size 64, 32 rows keep a CTA under 170 registers a thread (3
// CTAs an SM) where 64 would take 190 (2 CTAs). A knob to settle on a GPU.
template <int HS>
inline constexpr int kChunk = HS >= 128  ? 16
                              : HS >= 64 ? 32
                                         : 64;

// --- pass 1: one warp per (b, h, t) row ---

inline Grid drow_grid(int B, const Heads& g) {
  const long long rows = static_cast<long long>(B) * g.NH * g.T;
  return {static_cast<int>((rows + kWarps - 1) / kWarps), 1};
}

// drow[(b*NH + h)*T + t] = dot(dout, out) over head h's columns of row (b, t).
template <int HS>
ZERO_ATTN_DEV void drow_cta(const Cta& cta, float* drow, const bf16* dout, const bf16* out, const Heads& g, int B) {
  const std::size_t rows = static_cast<std::size_t>(B) * g.NH * g.T;
  const std::size_t w = static_cast<std::size_t>(cta.block_x) * kWarps + cta.thread / 32;
  const int lane = cta.thread % 32;
  if (w >= rows) return;  // w is the same for the whole warp
  const int t = static_cast<int>(w % g.T);
  const std::size_t bh = w / g.T;
  const int b = static_cast<int>(bh / g.NH), h = static_cast<int>(bh % g.NH);
  const std::size_t row = static_cast<std::size_t>(t) * g.out_ld(HS);
  const bf16* dy = g.out_at(dout, b, h, HS) + row;
  const bf16* y = g.out_at(out, b, h, HS) + row;
  float acc = 0.0f;
  for (int d = lane; d < HS; d += 32) acc += __bfloat162float(dy[d]) * __bfloat162float(y[d]);
  for (int m = 16; m > 0; m /= 2) acc += shfl_xor(acc, m);
  if (lane == 0) drow[w] = acc;
}

// --- the shared memory of passes 2 and 3 ---

template <int HS>
struct BwdTiles {
  bf16 *q, *dout, *k, *v;
  float *lse, *drow;

  ZERO_ATTN_DEV explicit BwdTiles(unsigned char* smem) {
    constexpr std::size_t t = Smem<HS>::tile;
    q = reinterpret_cast<bf16*>(smem);
    dout = reinterpret_cast<bf16*>(smem + t);
    k = reinterpret_cast<bf16*>(smem + 2 * t);
    v = reinterpret_cast<bf16*>(smem + 3 * t);
    lse = reinterpret_cast<float*>(smem + 4 * t);
    drow = reinterpret_cast<float*>(smem + 4 * t + Smem<HS>::row_f);
  }
};

// The query tile's rows of q and dout, and their lse and D (zeros past T).
template <int HS>
ZERO_ATTN_DEV void load_query_side(const Cta& cta, const BwdTiles<HS>& sm, const bf16* q_src, const bf16* do_src,
                                   const float* lse_bh, const float* drow_bh, std::size_t ld, int C, int q0, int T) {
  load_tile<HS>(cta, sm.q, q_src, ld, q0, T);
  load_tile<HS>(cta, sm.dout, do_src, static_cast<std::size_t>(C), q0, T);
  for (int r = cta.thread; r < kRows; r += kThreads) {
    const bool in = q0 + r < T;
    sm.lse[r] = in ? lse_bh[q0 + r] : 0.0f;
    sm.drow[r] = in ? drow_bh[q0 + r] : 0.0f;
  }
}

// --- pass 2: dK and dV ---

inline Grid dkdv_grid(int B, const Heads& g) { return {tile_count(g.T, kRows), B * g.NKV}; }

// dK and dV of the tile's 64 keys, summed over the query heads of the group in increasing order.
template <int HS>
ZERO_ATTN_DEV void dkdv_cta(const Cta& cta, bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse,
                            const float* drow, const Heads& g, float scale, float scale_log2) {
  constexpr int ld_s = Smem<HS>::ld;
  constexpr int QC = kChunk<HS>;
  const BwdTiles<HS> sm(cta.smem);

  const int T = g.T;
  const int kt = cta.block_x;  // key tile 0 meets every query tile: first is longest
  const int bg = cta.block_y, b = bg / g.NKV, kvh = bg % g.NKV;
  const int k0 = kt * kRows;
  const std::size_t ld = g.qkv_ld(HS);
  const int C = g.out_ld(HS);

  const int warp = cta.thread / 32;
  const LanePos p(cta.thread % 32);
  const int w0 = k0 + warp * kWarpRows;  // the warp's first key row
  const int keys[2] = {w0 + p.row(0), w0 + p.row(2)};
  const bf16* k_w = sm.k + warp * kWarpRows * ld_s;
  const bf16* v_w = sm.v + warp * kWarpRows * ld_s;

  load_tile<HS>(cta, sm.k, g.k_at(qkv, b, kvh, HS), ld, k0, T);
  load_tile<HS>(cta, sm.v, g.v_at(qkv, b, kvh, HS), ld, k0, T);

  Acc<HS> dk, dv;
  zero_acc<HS>(dk);
  zero_acc<HS>(dv);

  const int n_query_tiles = tile_count(T, kRows);
  for (int h = kvh; h < g.NH; h += g.NKV) {
    const std::size_t bh = static_cast<std::size_t>(b) * g.NH + h;
    const bf16* q_src = g.q_at(qkv, b, h, HS);
    const bf16* do_src = g.out_at(dout, b, h, HS);
    const float slope_log2 = g.slope_log2(h);
    for (int qt = causal_first_query_tile(kt, kRows, kRows); qt < n_query_tiles; ++qt) {
      const int q0 = qt * kRows;
      cta_sync();  // every warp is done with the previous query tile
      load_query_side<HS>(cta, sm, q_src, do_src, lse + bh * T, drow + bh * T, ld, C, q0, T);
      cta_sync();

      for (int c0 = 0; c0 < kRows; c0 += QC) {
        // Queries q0 + c0 .. : none attends the warp's keys if the last is before its first key.
        if (q0 + c0 + QC - 1 < w0 || q0 + c0 >= T) continue;
        Acc<QC> s, dp;  // S^T and dP^T: the warp's 16 keys x QC queries
        zero_acc<QC>(s);
        zero_acc<QC>(dp);
        {
          FragA<HS> a;
          load_a<HS>(a, k_w, ld_s, p);
          mma_abt<QC, HS>(s, a, sm.q + c0 * ld_s, ld_s, p);
          load_a<HS>(a, v_w, ld_s, p);
          mma_abt<QC, HS>(dp, a, sm.dout + c0 * ld_s, ld_s, p);
        }
        ZERO_ATTN_UNROLL
        for (int n = 0; n < QC / 8; ++n)
          for (int e = 0; e < 4; ++e) {
            const int col = c0 + p.col(n, e), i = q0 + col, j = keys[e / 2];
            const float pr = attends(i, j, T)
                                 ? prob_from_lse(biased_score(s[n][e], scale_log2, slope_log2, i, j), sm.lse[col])
                                 : 0.0f;
            s[n][e] = pr;
            dp[n][e] = score_grad(pr, dp[n][e], sm.drow[col], scale);
          }
        FragA<QC> pa, dsa;
        acc_to_a<QC>(pa, s);
        acc_to_a<QC>(dsa, dp);
        mma_ab<HS, QC>(dv, pa, sm.dout + c0 * ld_s, ld_s, p);
        mma_ab<HS, QC>(dk, dsa, sm.q + c0 * ld_s, ld_s, p);
      }
    }
  }

  add_acc<HS>(g.k_at(dqkv, b, kvh, HS), ld, w0, T, dk, p);
  add_acc<HS>(g.v_at(dqkv, b, kvh, HS), ld, w0, T, dv, p);
}

// --- pass 3: dQ ---

inline Grid dq_grid(int B, const Heads& g) { return {tile_count(g.T, kRows), B * g.NH}; }

// dQ of the tile's 64 queries.
template <int HS>
ZERO_ATTN_DEV void dq_cta(const Cta& cta, bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse,
                          const float* drow, const Heads& g, float scale, float scale_log2) {
  constexpr int ld_s = Smem<HS>::ld;
  constexpr int KC = kChunk<HS>;
  const BwdTiles<HS> sm(cta.smem);

  const int T = g.T;
  const int qt = cta.grid_x - 1 - cta.block_x;
  const int bh = cta.block_y, b = bh / g.NH, h = bh % g.NH;
  const int q0 = qt * kRows;
  const std::size_t ld = g.qkv_ld(HS);
  const int C = g.out_ld(HS);
  const bf16* q_src = g.q_at(qkv, b, h, HS);
  const bf16* k_src = g.k_at(qkv, b, g.kv_head(h), HS);
  const bf16* v_src = g.v_at(qkv, b, g.kv_head(h), HS);
  const bf16* do_src = g.out_at(dout, b, h, HS);
  const float slope_log2 = g.slope_log2(h);

  const int warp = cta.thread / 32;
  const LanePos p(cta.thread % 32);
  const int w0 = q0 + warp * kWarpRows;  // the warp's first query row
  const int rows[2] = {w0 + p.row(0), w0 + p.row(2)};

  load_query_side<HS>(cta, sm, q_src, do_src, lse + static_cast<std::size_t>(bh) * T,
                      drow + static_cast<std::size_t>(bh) * T, ld, C, q0, T);
  cta_sync();
  FragA<HS> qa, doa;
  load_a<HS>(qa, sm.q + warp * kWarpRows * ld_s, ld_s, p);
  load_a<HS>(doa, sm.dout + warp * kWarpRows * ld_s, ld_s, p);
  float row_lse[2], row_d[2];
  ZERO_ATTN_UNROLL
  for (int r = 0; r < 2; ++r) {
    row_lse[r] = sm.lse[rows[r] - q0];
    row_d[r] = sm.drow[rows[r] - q0];
  }

  Acc<HS> dq;
  zero_acc<HS>(dq);
  const int n_key_tiles = causal_key_tiles(qt, kRows, kRows, T);
  for (int kt = 0; kt < n_key_tiles; ++kt) {
    const int k0 = kt * kRows;
    cta_sync();  // every warp is done with the previous K, V
    load_tile<HS>(cta, sm.k, k_src, ld, k0, T);
    load_tile<HS>(cta, sm.v, v_src, ld, k0, T);
    cta_sync();

    for (int c0 = 0; c0 < kRows; c0 += KC) {
      // Keys k0 + c0 .. : hidden from all the warp's rows if the first is past its last row.
      if (k0 + c0 > w0 + kWarpRows - 1 || k0 + c0 >= T) continue;
      Acc<KC> s, dp;  // the warp's 16 queries x KC keys
      zero_acc<KC>(s);
      zero_acc<KC>(dp);
      mma_abt<KC, HS>(s, qa, sm.k + c0 * ld_s, ld_s, p);
      mma_abt<KC, HS>(dp, doa, sm.v + c0 * ld_s, ld_s, p);
      ZERO_ATTN_UNROLL
      for (int n = 0; n < KC / 8; ++n)
        for (int e = 0; e < 4; ++e) {
          const int i = rows[e / 2], j = k0 + c0 + p.col(n, e);
          const float pr = attends(i, j, T)
                               ? prob_from_lse(biased_score(s[n][e], scale_log2, slope_log2, i, j), row_lse[e / 2])
                               : 0.0f;
          dp[n][e] = score_grad(pr, dp[n][e], row_d[e / 2], scale);
        }
      FragA<KC> dsa;
      acc_to_a<KC>(dsa, dp);
      mma_ab<HS, KC>(dq, dsa, sm.k + c0 * ld_s, ld_s, p);
    }
  }

  add_acc<HS>(g.q_at(dqkv, b, h, HS), ld, w0, T, dq, p);
}

}  // namespace zero::gpt::cuda::attn
