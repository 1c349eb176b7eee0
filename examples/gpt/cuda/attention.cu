// Causal self-attention, flash style: no T x T matrix ever reaches memory.
//
// Tiles of 64 query rows and 64 key rows; a CTA is 4 warps and each warp owns 16 rows of the
// CTA's tile, so after the shared K/V (or Q/dO) tiles are loaded a warp works alone on its rows
// and only __syncwarp orders it. Products go through tensor cores (WMMA, bf16 16x16x16, fp32
// accumulators). The WMMA accumulator's element-to-row mapping is unspecified, so every
// row-wise step (masking, softmax, rescaling) goes through shared memory: the scores are stored
// as fp32, each row is handled by a pair of lanes (32 columns each), and the probabilities go
// back as bf16 for the next product. The scalar math is attention_math.cuh, which the host unit
// test replays.
//
// Forward: one CTA per (query tile, batch*head); key tiles 0 .. diagonal, online softmax, the
// fp32 output accumulator in shared memory (rescaled per row, then reloaded as the accumulator
// of the P.V product); writes out (bf16) and lse (fp32, natural log).
//
// Backward (FlashAttention-2 recomputation, deterministic, no atomics):
//   1. D_i = dot(dout_i, out_i) per row and head, into the scratch.
//   2. One CTA per (key tile, batch*head): loops over the query tiles at or below the diagonal,
//      rebuilds P from lse, accumulates dV = P^T dO and dK = dS^T Q in registers, adds once.
//   3. One CTA per (query tile, batch*head): loops over the key tiles, rebuilds P and dP,
//      accumulates dQ = dS K in registers, adds once.
// Pass 3 recomputes S = Q K^T and dP = dO V^T that pass 2 already had: 7 tile products per
// (query tile, key tile) pair instead of 5 (the backward's matrix work x1.4), the price of
// dQ without atomics (a fixed summation order, so bitwise-reproducible gradients).
//
// Every gradient element is owned by one thread, which reads the bf16 value, adds its fp32
// sum, and writes it back rounded once; the dQ, dK and dV columns are disjoint.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "gpt/cuda/attention_math.cuh"
#include "gpt/cuda/gpt_kernels.hpp"
#include "gpt/cuda/status_check.hpp"
#include "zero/error.hpp"

namespace zero::gpt::cuda {

namespace {

namespace wmma = nvcuda::wmma;

constexpr int kRows = 64;  // query rows per query tile and key rows per key tile
constexpr int kWarps = 4;  // 16 rows of the tile each
constexpr int kThreads = kWarps * 32;
constexpr int kF = 16;  // WMMA fragment edge
constexpr unsigned kFullMask = 0xffffffffu;

// Row-wise loops: lane pair (2r, 2r+1) walks row r of the warp's 16, lane 2r+1 the right half.
// Rows are 68 floats apart (4 banks), so rows r and r+8 and the two halves would hit the same
// bank at the same step; starting each lane at its own column offset (mod the lane's width)
// spreads the 32 lanes over the 32 banks.
__device__ __forceinline__ int lane_rotation(int lane) { return lane % 2 + 2 * (lane / 16); }

static_assert(kRows == kWarps * kF, "each warp owns one fragment row of the tile");

using FragA = wmma::fragment<wmma::matrix_a, kF, kF, kF, bf16, wmma::row_major>;
using FragBRow = wmma::fragment<wmma::matrix_b, kF, kF, kF, bf16, wmma::row_major>;
using FragBCol = wmma::fragment<wmma::matrix_b, kF, kF, kF, bf16, wmma::col_major>;
using FragAcc = wmma::fragment<wmma::accumulator, kF, kF, kF, float>;

// Shared memory, one layout for every kernel of a head size. Leading dimensions are padded
// (bf16 by 8, fp32 by 4: WMMA needs multiples of 16 bytes) so the rows of a fragment do not
// all start in the same bank. Every buffer size is a multiple of 128 bytes, so every buffer,
// and every fragment in it (16-row, 16-column steps), is 32-byte aligned as WMMA requires.
template <int HS>
struct Smem {
  static constexpr int ld_h = HS + 8;     // bf16 [64][HS] tiles: Q, K, V, dO
  static constexpr int ld_s = kRows + 4;  // fp32 [64][64] tiles: scores, dP
  static constexpr int ld_p = kRows + 8;  // bf16 [64][64] tiles: P, dS
  static constexpr int ld_o = HS + 4;     // fp32 [64][HS]: the forward's output accumulator

  static constexpr std::size_t tile_h = std::size_t{kRows} * ld_h * sizeof(bf16);
  static constexpr std::size_t tile_s = std::size_t{kRows} * ld_s * sizeof(float);
  static constexpr std::size_t tile_p = std::size_t{kRows} * ld_p * sizeof(bf16);
  static constexpr std::size_t tile_o = std::size_t{kRows} * ld_o * sizeof(float);
  static constexpr std::size_t row_f = std::size_t{kRows} * sizeof(float);

  // forward: Q K V | S | P | O
  static constexpr std::size_t fwd_bytes = 3 * tile_h + tile_s + tile_p + tile_o;
  // backward: Q dO K V | S dP | P dS | lse D
  static constexpr std::size_t bwd_bytes = 4 * tile_h + 2 * tile_s + 2 * tile_p + 2 * row_f;

  static_assert(tile_h % 128 == 0 && tile_s % 128 == 0 && tile_p % 128 == 0 &&
                tile_o % 128 == 0 && row_f % 128 == 0);
};

// Rows row0 .. row0+63 of a [T, stride] bf16 matrix, HS columns from `src`, into a [64][ld_h]
// shared tile; rows at or past T are zeros (the tail tile), so no product reads garbage.
template <int HS>
__device__ void load_tile(bf16* dst, const bf16* src, std::size_t stride, int row0, int T) {
  constexpr int kChunks = HS / 8;  // 16-byte pieces per row
  for (int c = threadIdx.x; c < kRows * kChunks; c += kThreads) {
    const int r = c / kChunks, k = c % kChunks;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (row0 + r < T) {
      const bf16* from = src + static_cast<std::size_t>(row0 + r) * stride + k * 8;
      v = *reinterpret_cast<const uint4*>(from);
    }
    *reinterpret_cast<uint4*>(dst + r * Smem<HS>::ld_h + k * 8) = v;
  }
}

// s[16][64] = a[16][HS] . b[64][HS]^T (both row-major in shared memory), fp32, into shared.
template <int HS>
__device__ void product_abt(float* s, int lds, const bf16* a, int lda, const bf16* b, int ldb) {
#pragma unroll
  for (int n = 0; n < kRows / kF; ++n) {
    FragAcc acc;
    wmma::fill_fragment(acc, 0.0f);
#pragma unroll
    for (int k = 0; k < HS / kF; ++k) {
      FragA fa;
      FragBCol fb;  // column-major view of b's rows: element (k, n) = b[n][k]
      wmma::load_matrix_sync(fa, a + k * kF, lda);
      wmma::load_matrix_sync(fb, b + n * kF * ldb + k * kF, ldb);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(s + n * kF, acc, lds, wmma::mem_row_major);
  }
}

// acc[16][HS] += a[16][64] . b[64][HS] (both row-major in shared memory).
template <int HS>
__device__ void product_ab_acc(FragAcc (&acc)[HS / kF], const bf16* a, int lda, const bf16* b,
                               int ldb) {
#pragma unroll
  for (int k = 0; k < kRows / kF; ++k) {
    FragA fa;
    wmma::load_matrix_sync(fa, a + k * kF, lda);
#pragma unroll
    for (int n = 0; n < HS / kF; ++n) {
      FragBRow fb;
      wmma::load_matrix_sync(fb, b + k * kF * ldb + n * kF, ldb);
      wmma::mma_sync(acc[n], fa, fb, acc[n]);
    }
  }
}

// dst[0..7] += src[0..7] (bf16 += fp32, rounded once); dst is 16-byte aligned.
__device__ void add_to_bf16x8(bf16* dst, const float* src) {
  uint4 raw = *reinterpret_cast<const uint4*>(dst);
  auto* v = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 f = __bfloat1622float2(v[k]);
    v[k] = __floats2bfloat162_rn(f.x + src[2 * k], f.y + src[2 * k + 1]);
  }
  *reinterpret_cast<uint4*>(dst) = raw;
}

// Adds a warp's 16 x HS accumulator into rows row0 .. row0+15 (those < T) of a bf16 matrix
// with row stride `stride`, through `stage` (16 x 16 fp32 of the warp's own shared memory).
template <int HS>
__device__ void add_fragments(bf16* dst, std::size_t stride, int row0, int T,
                              const FragAcc (&acc)[HS / kF], float* stage, int ld_stage) {
  const int lane = threadIdx.x % 32;
  const int r = lane / 2, c = (lane % 2) * 8;
#pragma unroll
  for (int n = 0; n < HS / kF; ++n) {
    wmma::store_matrix_sync(stage, acc[n], ld_stage, wmma::mem_row_major);
    __syncwarp();
    if (row0 + r < T) {
      add_to_bf16x8(dst + static_cast<std::size_t>(row0 + r) * stride + n * kF + c,
                    stage + r * ld_stage + c);
    }
    __syncwarp();  // the next store overwrites stage
  }
}

// ---------------------------------------------------------------------------------------------
// Forward
// ---------------------------------------------------------------------------------------------

template <int HS>
__global__ void __launch_bounds__(kThreads)
    attention_forward_kernel(bf16* out, float* lse, const bf16* qkv, int T, int C, int NH,
                             float scale_log2) {
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
  const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int q0 = qt * kRows;
  const std::size_t C3 = 3 * static_cast<std::size_t>(C);
  const bf16* q_src = qkv + static_cast<std::size_t>(b) * T * C3 + h * HS;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row = warp * kF + lane / 2;  // the tile row this lane pair handles
  const int half = lane % 2;             // which 32 columns (of S) / HS/2 columns (of O)
  const int rot = lane_rotation(lane);
  const int i = q0 + row;

  load_tile<HS>(sQ, q_src, C3, q0, T);
  for (int e = threadIdx.x; e < kRows * L::ld_o; e += kThreads) sO[e] = 0.0f;

  attn::OnlineSoftmax st = attn::online_init();
  const int n_key_tiles = attn::causal_key_tiles(qt, kRows, kRows, T);
  for (int kt = 0; kt < n_key_tiles; ++kt) {
    const int k0 = kt * kRows;
    __syncthreads();  // every warp is done with the previous K, V
    load_tile<HS>(sK, q_src + C, C3, k0, T);
    load_tile<HS>(sV, q_src + 2 * C, C3, k0, T);
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
      const float s2 = attn::attends(i, j, T) ? s_row[c] * scale_log2 : -INFINITY;
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
    for (int n = 0; n < HS / kF; ++n)
      wmma::load_matrix_sync(acc[n], o_w + n * kF, L::ld_o, wmma::mem_row_major);
    product_ab_acc<HS>(acc, sP + warp * kF * L::ld_p, L::ld_p, sV, L::ld_h);
#pragma unroll
    for (int n = 0; n < HS / kF; ++n)
      wmma::store_matrix_sync(o_w + n * kF, acc[n], L::ld_o, wmma::mem_row_major);
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
      for (int k = 0; k < 4; ++k)
        v[k] = __floats2bfloat162_rn(o_row[c + 2 * k] * inv, o_row[c + 2 * k + 1] * inv);
      *reinterpret_cast<uint4*>(dst + c) = raw;
    }
    if (half == 0) lse[static_cast<std::size_t>(bh) * T + i] = attn::online_lse(st);
  }
}

// ---------------------------------------------------------------------------------------------
// Backward
// ---------------------------------------------------------------------------------------------

// drow[(b*NH + h)*T + t] = dot(dout, out) over head h's columns of row (b, t); one warp each.
template <int HS>
__global__ void attention_drow_kernel(float* drow, const bf16* dout, const bf16* out, int T,
                                      int C, int NH, std::size_t rows) {
  const std::size_t w = (static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (w >= rows) return;  // w is the same for the whole warp
  const int t = static_cast<int>(w % T);
  const std::size_t bh = w / T;
  const std::size_t b = bh / NH, h = bh % NH;
  const std::size_t off = (b * T + t) * C + h * HS;
  float acc = 0.0f;
  for (int d = lane; d < HS; d += 32)
    acc += __bfloat162float(dout[off + d]) * __bfloat162float(out[off + d]);
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
__device__ void load_query_side(const BwdTiles<HS>& sm, const bf16* q_src, const bf16* do_src,
                                const float* lse_bh, const float* drow_bh, std::size_t C3, int C,
                                int q0, int T) {
  load_tile<HS>(sm.q, q_src, C3, q0, T);
  load_tile<HS>(sm.dout, do_src, static_cast<std::size_t>(C), q0, T);
  for (int r = threadIdx.x; r < kRows; r += kThreads) {
    const bool in = q0 + r < T;
    sm.lse[r] = in ? lse_bh[q0 + r] : 0.0f;
    sm.drow[r] = in ? drow_bh[q0 + r] : 0.0f;
  }
}

// One CTA per (key tile, batch*head): dK and dV of the tile's 64 keys.
template <int HS>
__global__ void __launch_bounds__(kThreads)
    attention_dkdv_kernel(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse,
                          const float* drow, int T, int C, int NH, float scale,
                          float scale_log2) {
  using L = Smem<HS>;
  extern __shared__ __align__(128) unsigned char smem[];
  const BwdTiles<HS> sm(smem);

  const int kt = blockIdx.x;  // key tile 0 meets every query tile: first is longest
  const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int k0 = kt * kRows;
  const std::size_t C3 = 3 * static_cast<std::size_t>(C);
  const std::size_t row_base = static_cast<std::size_t>(b) * T;
  const bf16* q_src = qkv + row_base * C3 + h * HS;
  const bf16* do_src = dout + row_base * C + h * HS;
  const float* lse_bh = lse + static_cast<std::size_t>(bh) * T;
  const float* drow_bh = drow + static_cast<std::size_t>(bh) * T;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row = warp * kF + lane / 2;  // a key row of the tile
  const int half = lane % 2;             // which 32 query columns
  const int rot = lane_rotation(lane);
  const int j = k0 + row;

  load_tile<HS>(sm.k, q_src + C, C3, k0, T);
  load_tile<HS>(sm.v, q_src + 2 * C, C3, k0, T);

  FragAcc dk[HS / kF], dv[HS / kF];
#pragma unroll
  for (int n = 0; n < HS / kF; ++n) {
    wmma::fill_fragment(dk[n], 0.0f);
    wmma::fill_fragment(dv[n], 0.0f);
  }

  float* s_w = sm.s + warp * kF * L::ld_s;
  float* dp_w = sm.dp + warp * kF * L::ld_s;
  const int n_query_tiles = attn::tile_count(T, kRows);
  for (int qt = attn::causal_first_query_tile(kt, kRows, kRows); qt < n_query_tiles; ++qt) {
    const int q0 = qt * kRows;
    __syncthreads();  // every warp is done with the previous query tile
    load_query_side<HS>(sm, q_src, do_src, lse_bh, drow_bh, C3, C, q0, T);
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
      const float p =
          attn::attends(i, j, T) ? attn::prob_from_lse(s_row[c] * scale_log2, sm.lse[col]) : 0.0f;
      p_row[c] = __float2bfloat16(p);
      ds_row[c] = __float2bfloat16(attn::score_grad(p, dp_row[c], sm.drow[col], scale));
    }
    __syncwarp();

    product_ab_acc<HS>(dv, sm.p + warp * kF * L::ld_p, L::ld_p, sm.dout, L::ld_h);
    product_ab_acc<HS>(dk, sm.ds + warp * kF * L::ld_p, L::ld_p, sm.q, L::ld_h);
  }

  // The warp's own score rows are free now: they stage the accumulators.
  bf16* dk_dst = dqkv + row_base * C3 + C + h * HS;
  add_fragments<HS>(dk_dst, C3, k0 + warp * kF, T, dk, s_w, L::ld_s);
  add_fragments<HS>(dk_dst + C, C3, k0 + warp * kF, T, dv, s_w, L::ld_s);
}

// One CTA per (query tile, batch*head): dQ of the tile's 64 queries.
template <int HS>
__global__ void __launch_bounds__(kThreads)
    attention_dq_kernel(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse,
                        const float* drow, int T, int C, int NH, float scale, float scale_log2) {
  using L = Smem<HS>;
  extern __shared__ __align__(128) unsigned char smem[];
  const BwdTiles<HS> sm(smem);

  const int qt = static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x);
  const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int q0 = qt * kRows;
  const std::size_t C3 = 3 * static_cast<std::size_t>(C);
  const std::size_t row_base = static_cast<std::size_t>(b) * T;
  const bf16* q_src = qkv + row_base * C3 + h * HS;
  const bf16* do_src = dout + row_base * C + h * HS;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row = warp * kF + lane / 2;  // a query row of the tile
  const int half = lane % 2;             // which 32 key columns
  const int rot = lane_rotation(lane);
  const int i = q0 + row;

  load_query_side<HS>(sm, q_src, do_src, lse + static_cast<std::size_t>(bh) * T,
                      drow + static_cast<std::size_t>(bh) * T, C3, C, q0, T);

  FragAcc dq[HS / kF];
#pragma unroll
  for (int n = 0; n < HS / kF; ++n) wmma::fill_fragment(dq[n], 0.0f);

  float* s_w = sm.s + warp * kF * L::ld_s;
  float* dp_w = sm.dp + warp * kF * L::ld_s;
  const int n_key_tiles = attn::causal_key_tiles(qt, kRows, kRows, T);
  for (int kt = 0; kt < n_key_tiles; ++kt) {
    const int k0 = kt * kRows;
    __syncthreads();  // every warp is done with the previous K, V (and the query side is in)
    load_tile<HS>(sm.k, q_src + C, C3, k0, T);
    load_tile<HS>(sm.v, q_src + 2 * C, C3, k0, T);
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
      const float p =
          attn::attends(i, jj, T) ? attn::prob_from_lse(s_row[c] * scale_log2, row_lse) : 0.0f;
      ds_row[c] = __float2bfloat16(attn::score_grad(p, dp_row[c], row_d, scale));
    }
    __syncwarp();

    product_ab_acc<HS>(dq, sm.ds + warp * kF * L::ld_p, L::ld_p, sm.k, L::ld_h);
  }

  add_fragments<HS>(dqkv + row_base * C3 + h * HS, C3, q0 + warp * kF, T, dq, s_w, L::ld_s);
}

// ---------------------------------------------------------------------------------------------
// Host side
// ---------------------------------------------------------------------------------------------


std::string shape_text(int B, int T, int C, int NH) {
  return "B=" + std::to_string(B) + " T=" + std::to_string(T) + " C=" + std::to_string(C) +
         " NH=" + std::to_string(NH);
}

void check_shape(const char* op, int B, int T, int C, int NH) {
  ZERO_CHECK(B >= 1 && attention_supported(T, C, NH),
             std::string(op) + ": unsupported shape " + shape_text(B, T, C, NH) +
                 "; supported: B >= 1, T >= 1, C divisible by NH with head size C/NH of 32, 64 "
                 "or 128");
  ZERO_CHECK(static_cast<long long>(B) * NH <= 65535,
             std::string(op) + ": B*NH = " + std::to_string(static_cast<long long>(B) * NH) +
                 " exceeds the grid's 65535 (" + shape_text(B, T, C, NH) + ")");
}

void check_aligned(const char* op, const char* name, const void* p) {
  ZERO_CHECK(reinterpret_cast<std::uintptr_t>(p) % 16 == 0,
             std::string(op) + ": " + name + " must be 16-byte aligned (rows are read in 16-byte "
                                             "pieces)");
}

// Opts the kernel in to `bytes` of dynamic shared memory (over the default 48 KiB), after
// checking the device has that much per block.
template <class Kernel>
void use_shared_memory(const char* op, Kernel kernel, std::size_t bytes) {
  int device = 0, optin = 0;
  GPT_CUDA_CHECK(cudaGetDevice(&device));
  GPT_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  ZERO_CHECK(bytes <= static_cast<std::size_t>(optin),
             std::string(op) + ": needs " + std::to_string(bytes) +
                 " bytes of shared memory per block, the device allows " + std::to_string(optin) +
                 " (built for sm_80 / sm_90)");
  GPT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(bytes)));
}

float scale_of(int hs) { return 1.0f / std::sqrt(static_cast<float>(hs)); }

template <int HS>
void forward_hs(bf16* out, float* lse, const bf16* qkv, int B, int T, int C, int NH,
                cudaStream_t stream) {
  constexpr std::size_t bytes = Smem<HS>::fwd_bytes;
  use_shared_memory("attention_forward", attention_forward_kernel<HS>, bytes);
  const dim3 grid(attn::tile_count(T, kRows), B * NH);
  attention_forward_kernel<HS><<<grid, kThreads, bytes, stream>>>(
      out, lse, qkv, T, C, NH, scale_of(HS) * attn::kLog2e);
  GPT_CUDA_CHECK(cudaGetLastError());
}

template <int HS>
void backward_hs(bf16* dqkv, float* drow, const bf16* dout, const bf16* qkv, const bf16* out,
                 const float* lse, int B, int T, int C, int NH, cudaStream_t stream) {
  const std::size_t rows = static_cast<std::size_t>(B) * NH * T;
  constexpr int kDrowThreads = 256;
  const auto drow_blocks =
      static_cast<unsigned>((rows * 32 + kDrowThreads - 1) / kDrowThreads);
  attention_drow_kernel<HS><<<drow_blocks, kDrowThreads, 0, stream>>>(drow, dout, out, T, C, NH,
                                                                      rows);
  GPT_CUDA_CHECK(cudaGetLastError());

  constexpr std::size_t bytes = Smem<HS>::bwd_bytes;
  const float scale = scale_of(HS), scale_log2 = scale * attn::kLog2e;
  const dim3 grid(attn::tile_count(T, kRows), B * NH);
  use_shared_memory("attention_backward", attention_dkdv_kernel<HS>, bytes);
  attention_dkdv_kernel<HS><<<grid, kThreads, bytes, stream>>>(dqkv, dout, qkv, lse, drow, T, C,
                                                               NH, scale, scale_log2);
  GPT_CUDA_CHECK(cudaGetLastError());
  use_shared_memory("attention_backward", attention_dq_kernel<HS>, bytes);
  attention_dq_kernel<HS><<<grid, kThreads, bytes, stream>>>(dqkv, dout, qkv, lse, drow, T, C,
                                                             NH, scale, scale_log2);
  GPT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

bool attention_supported(int T, int C, int NH) {
  if (T < 1 || C < 1 || NH < 1 || C % NH != 0) return false;
  const int hs = C / NH;
  return hs == 32 || hs == 64 || hs == 128;
}

void attention_forward(bf16* out, float* lse, const bf16* qkv, int B, int T, int C, int NH,
                       cudaStream_t stream) {
  check_shape("attention_forward", B, T, C, NH);
  check_aligned("attention_forward", "qkv", qkv);
  check_aligned("attention_forward", "out", out);
  switch (C / NH) {
    case 32: forward_hs<32>(out, lse, qkv, B, T, C, NH, stream); break;
    case 64: forward_hs<64>(out, lse, qkv, B, T, C, NH, stream); break;
    default: forward_hs<128>(out, lse, qkv, B, T, C, NH, stream); break;
  }
}

std::size_t attention_backward_scratch_floats(int B, int T, int C, int NH) {
  (void)C;
  return static_cast<std::size_t>(B) * NH * T;  // D per (b, h, t); the rest lives on chip
}

void attention_backward(bf16* dqkv, float* scratch, const bf16* dout, const bf16* qkv,
                        const bf16* out, const float* lse, int B, int T, int C, int NH,
                        cudaStream_t stream) {
  check_shape("attention_backward", B, T, C, NH);
  check_aligned("attention_backward", "dqkv", dqkv);
  check_aligned("attention_backward", "dout", dout);
  check_aligned("attention_backward", "qkv", qkv);
  check_aligned("attention_backward", "out", out);
  switch (C / NH) {
    case 32: backward_hs<32>(dqkv, scratch, dout, qkv, out, lse, B, T, C, NH, stream); break;
    case 64: backward_hs<64>(dqkv, scratch, dout, qkv, out, lse, B, T, C, NH, stream); break;
    default: backward_hs<128>(dqkv, scratch, dout, qkv, out, lse, B, T, C, NH, stream); break;
  }
}

}  // namespace zero::gpt::cuda
