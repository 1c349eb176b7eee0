// The common ground of the flash-style attention kernels (attention_forward.cu,
// attention_backward.cu): tiles of 64 query rows and 64 key rows; a CTA is 4 warps and each
// warp owns 16 rows of the CTA's tile, so after the shared K/V (or Q/dO) tiles are loaded a warp
// works alone on its rows and only __syncwarp orders it. Products go through tensor cores (WMMA,
// bf16 16x16x16, fp32 accumulators). The WMMA accumulator's element-to-row mapping is
// unspecified, so every row-wise step (masking, softmax, rescaling) goes through shared memory:
// the scores are stored as fp32, each row is handled by a pair of lanes (32 columns each), and
// the probabilities go back as bf16 for the next product. The scalar math is
// attention_math.cuh, which the host unit test replays.
//
// Every gradient element is owned by one thread, which reads the bf16 value, adds its fp32
// sum, and writes it back rounded once (add_fragments).
//
// Heads (below) carries what differs between the architectures: where a query head finds its
// key/value head (grouped-query attention, llama) and the ALiBi slope (bloom) added to its
// scores. For GPT-2 (NKV == NH, no ALiBi) the bias is an exact 0 and the kernels compute what
// they computed before the two were added.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "gpt/attention_shape.hpp"
#include "gpt/cuda/attention_math.cuh"
#include "gpt/cuda/gpt_kernels.hpp"

namespace zero::gpt::cuda::attn {

namespace wmma = nvcuda::wmma;

inline constexpr int kRows = 64;  // query rows per query tile and key rows per key tile
inline constexpr int kWarps = 4;  // 16 rows of the tile each
inline constexpr int kThreads = kWarps * 32;
inline constexpr int kF = 16;  // WMMA fragment edge
inline constexpr unsigned kFullMask = 0xffffffffu;

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

  static_assert(tile_h % 128 == 0 && tile_s % 128 == 0 && tile_p % 128 == 0 && tile_o % 128 == 0 && row_f % 128 == 0);
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
__device__ void product_ab_acc(FragAcc (&acc)[HS / kF], const bf16* a, int lda, const bf16* b, int ldb) {
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
inline __device__ void add_to_bf16x8(bf16* dst, const float* src) {
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
__device__ void add_fragments(bf16* dst, std::size_t stride, int row0, int T, const FragAcc (&acc)[HS / kF],
                              float* stage, int ld_stage) {
  const int lane = threadIdx.x % 32;
  const int r = lane / 2, c = (lane % 2) * 8;
#pragma unroll
  for (int n = 0; n < HS / kF; ++n) {
    wmma::store_matrix_sync(stage, acc[n], ld_stage, wmma::mem_row_major);
    __syncwarp();
    if (row0 + r < T) {
      add_to_bf16x8(dst + static_cast<std::size_t>(row0 + r) * stride + n * kF + c, stage + r * ld_stage + c);
    }
    __syncwarp();  // the next store overwrites stage
  }
}

// The head geometry of one call (AttentionShape without B and hs, which the grid and the
// template carry). qkv rows are [q (NH HS) | k (NKV HS) | v (NKV HS)], out rows NH HS.
struct Heads {
  int T, NH, NKV;
  int alibi_heads, head0;
  __host__ __device__ std::size_t qkv_ld(int hs) const { return static_cast<std::size_t>(NH + 2 * NKV) * hs; }
  __host__ __device__ int out_ld(int hs) const { return NH * hs; }
  __host__ __device__ int k_col(int hs) const { return NH * hs; }
  __host__ __device__ int v_col(int hs) const { return (NH + NKV) * hs; }
  // The key/value head query head h reads.
  __host__ __device__ int kv_head(int h) const { return h % NKV; }
  // Query head h's ALiBi slope in the log2 domain of the scores (0 without ALiBi): the score
  // of query i and key j, s2 = q.k scale log2(e), gets - slope_log2 (i - j).
  __device__ float slope_log2(int h) const {
    return alibi_heads > 0 ? static_cast<float>(alibi_slope(head0 + h, alibi_heads)) * kLog2e : 0.0f;
  }
};

// The biased log2-domain score of query i and key j (j <= i), from the raw product q.k; with
// slope_log2 == 0 it is exactly raw * scale_log2.
__device__ __forceinline__ float biased_score(float raw, float scale_log2, float slope_log2, int i, int j) {
  return fmaf(-slope_log2, static_cast<float>(i - j), raw * scale_log2);
}

// --- the host side of a launch (attention.cu) ---

// The softmax scale 1 / sqrt(head size).
inline float scale_of(int hs) { return 1.0f / std::sqrt(static_cast<float>(hs)); }

// Opts `kernel` in to `bytes` of dynamic shared memory (over the default 48 KiB), after checking
// that the device has that much per block; `op` names the caller in the error. Once per kernel
// and device (thread-safe); later calls with no more bytes only look the pair up.
void use_shared_memory(const char* op, const void* kernel, std::size_t bytes);

// The launches for one head size, beside their kernels; instantiated for 32, 64 and 128.
template <int HS>
void launch_forward(bf16* out, float* lse, const bf16* qkv, int B, const Heads& g, cudaStream_t stream);
template <int HS>
void launch_backward(bf16* dqkv, float* drow, const bf16* dout, const bf16* qkv, const bf16* out, const float* lse,
                     int B, const Heads& g, cudaStream_t stream);

}  // namespace zero::gpt::cuda::attn
