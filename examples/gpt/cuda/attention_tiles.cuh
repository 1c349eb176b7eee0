// The common ground of the flash-style attention kernels: tiles of 64 query rows and 64 key rows;
// a CTA is 4 warps and each warp owns 16 rows of the CTA's tile, so once the shared K/V (or
// Q/dO) tiles are loaded a warp works alone on its rows. Products go through the tensor cores'
// mma.sync m16n8k16 (bf16 in, fp32 accumulators) on fragments of documented layout
// (attention_warp.cuh), so the scores, the probabilities and the output accumulator stay in
// registers, as in FlashAttention-2: a lane holds two rows of a warp's 16 (g and g + 8, g =
// lane / 4) and two adjacent columns of every 8-column tile (2t, 2t + 1, t = lane % 4), and a
// row's maximum and sum are reduced over the four lanes that share it. Shared memory holds only
// the bf16 input tiles.
//
// The kernels are written as functions of one thread (Cta below) over a few warp primitives
// (attention_mma.cuh on the device), so that the host test test_gpt_attention_kernels can run
// the very same code on an emulator of those primitives. The scalar math is attention_math.cuh.
//
// Every gradient element is owned by one lane, which reads the bf16 value, adds its fp32 sum, and
// writes it back rounded once.
//
// Heads (below) carries what differs between the architectures: where a query head finds its
// key/value head (grouped-query attention, llama) and the ALiBi slope (bloom) added to its
// scores. For GPT-2 (NKV == NH, no ALiBi) the bias is an exact 0.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "gpt/attention_shape.hpp"
#include "gpt/cuda/attention_math.cuh"
#include "gpt/cuda/gpt_kernels.hpp"

// A function of one thread of a kernel: device code under nvcc, plain inline code on the host
// (the emulator test).
#if defined(__CUDACC__)
#define ZERO_ATTN_DEV __device__ __forceinline__
#else
#define ZERO_ATTN_DEV inline
#endif

// #pragma unroll where the compiler knows it (nvcc), nothing on the host.
#if defined(__CUDACC__)
#define ZERO_ATTN_UNROLL _Pragma("unroll")
#else
#define ZERO_ATTN_UNROLL
#endif

namespace zero::gpt::cuda::attn {

inline constexpr int kRows = 64;  // query rows per query tile and key rows per key tile
inline constexpr int kWarps = 4;  // 16 rows of the tile each
inline constexpr int kThreads = kWarps * 32;
inline constexpr int kWarpRows = kRows / kWarps;
inline constexpr unsigned kFullMask = 0xffffffffu;

static_assert(kWarpRows == 16, "a warp's rows are one m16 fragment");

// One thread's view of its launch: what threadIdx.x, blockIdx and gridDim.x give on the device.
struct Cta {
  int thread;  // 0 .. kThreads - 1
  int block_x, block_y;
  int grid_x;
  unsigned char* smem;  // the block's dynamic shared memory
};

// A launch grid (blocks in x and y).
struct Grid {
  int x, y;
};

// Shared memory, one layout for every kernel of a head size: bf16 [64][HS] tiles with rows
// padded by 8 elements (16 bytes), so the 8 rows an ldmatrix reads fall in 8 different 16-byte
// bank groups. Every buffer size is a multiple of 128 bytes, so every row is 16-byte aligned as
// ldmatrix requires.
template <int HS>
struct Smem {
  static constexpr int ld = HS + 8;  // Q, K, V, dO
  static constexpr std::size_t tile = std::size_t{kRows} * ld * sizeof(bf16);
  static constexpr std::size_t row_f = std::size_t{kRows} * sizeof(float);

  static constexpr std::size_t fwd_bytes = 3 * tile;              // Q K V
  static constexpr std::size_t bwd_bytes = 4 * tile + 2 * row_f;  // Q dO K V | lse D

  static_assert(tile % 128 == 0 && row_f % 128 == 0);
};

// Rows row0 .. row0+63 of a [T, stride] bf16 matrix, HS columns from `src`, into a [64][ld]
// shared tile; rows at or past T are zeros (the tail tile), so no product reads garbage.
template <int HS>
ZERO_ATTN_DEV void load_tile(const Cta& cta, bf16* dst, const bf16* src, std::size_t stride, int row0, int T) {
  constexpr int kChunks = HS / 8;  // 16-byte pieces per row
  for (int c = cta.thread; c < kRows * kChunks; c += kThreads) {
    const int r = c / kChunks, k = c % kChunks;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (row0 + r < T) {
      const bf16* from = src + static_cast<std::size_t>(row0 + r) * stride + k * 8;
      v = *reinterpret_cast<const uint4*>(from);
    }
    *reinterpret_cast<uint4*>(dst + r * Smem<HS>::ld + k * 8) = v;
  }
}

// Two floats as a bf16 pair in one register, each rounded to nearest; `lo` in the low half (the
// lower column of a fragment).
ZERO_ATTN_HD std::uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  std::uint32_t u;
  std::memcpy(&u, &v, sizeof u);
  return u;
}

// dst[0], dst[1] += lo, hi (bf16 += fp32, rounded once); dst is 4-byte aligned.
ZERO_ATTN_HD void add_to_bf16x2(bf16* dst, float lo, float hi) {
  auto* pair = reinterpret_cast<__nv_bfloat162*>(dst);
  const float2 f = __bfloat1622float2(*pair);
  *pair = __floats2bfloat162_rn(f.x + lo, f.y + hi);
}

// The head geometry of one call (AttentionShape without B and hs, which the grid and the
// template carry). qkv rows are [q (NH HS) | k (NKV HS) | v (NKV HS)], out rows NH HS.
struct Heads {
  int T, NH, NKV;
  int alibi_heads, head0;
  ZERO_ATTN_HD std::size_t qkv_ld(int hs) const { return static_cast<std::size_t>(NH + 2 * NKV) * hs; }
  ZERO_ATTN_HD int out_ld(int hs) const { return NH * hs; }
  // Row 0 of batch b's columns of one head, rows qkv_ld apart in a qkv-shaped matrix (qkv, dqkv:
  // query head h, key or value head kvh) and out_ld apart in an out-shaped one (out, dout).
  template <class E>
  ZERO_ATTN_HD E* q_at(E* m, int b, int h, int hs) const {
    return m + static_cast<std::size_t>(b) * T * qkv_ld(hs) + static_cast<std::size_t>(h) * hs;
  }
  template <class E>
  ZERO_ATTN_HD E* k_at(E* m, int b, int kvh, int hs) const {
    return q_at(m, b, NH + kvh, hs);
  }
  template <class E>
  ZERO_ATTN_HD E* v_at(E* m, int b, int kvh, int hs) const {
    return q_at(m, b, NH + NKV + kvh, hs);
  }
  template <class E>
  ZERO_ATTN_HD E* out_at(E* m, int b, int h, int hs) const {
    return m + static_cast<std::size_t>(b) * T * out_ld(hs) + static_cast<std::size_t>(h) * hs;
  }
  // The key/value head query head h reads.
  ZERO_ATTN_HD int kv_head(int h) const { return h % NKV; }
  // Query head h's ALiBi slope in the log2 domain of the scores (0 without ALiBi): the score
  // of query i and key j, s2 = q.k scale log2(e), gets - slope_log2 (i - j).
  ZERO_ATTN_HD float slope_log2(int h) const {
    return alibi_heads > 0 ? static_cast<float>(alibi_slope(head0 + h, alibi_heads)) * kLog2e : 0.0f;
  }
};

// The biased log2-domain score of query i and key j (j <= i), from the raw product q.k; with
// slope_log2 == 0 it is exactly raw * scale_log2.
ZERO_ATTN_HD float biased_score(float raw, float scale_log2, float slope_log2, int i, int j) {
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
