// A warp's tile products on mma.sync fragments (layouts in attention_mma.cuh), for the
// attention kernels. A warp owns 16 rows; a 16 x N fp32 accumulator is N/8 tiles of four floats
// per lane (Acc<N>), a 16 x K bf16 left operand K/16 k-steps of four registers (FragA<K>). The
// right operand is read from shared memory with ldmatrix, two 8-column tiles per load: rows of
// a [N][K] tile (K, dO and V as B^T, for S = Q K^T) or of a [K][N] tile (V, dO, Q, K as B, for
// O = P V and the gradients), the latter transposed on the way in.
//
// The primitives come from attention_mma.cuh under nvcc; the host test includes its emulator
// before this header instead.
#pragma once

#include <cstdint>

#include "gpt/cuda/attention_tiles.cuh"
#if defined(__CUDACC__)
#include "gpt/cuda/attention_mma.cuh"
#endif

namespace zero::gpt::cuda::attn {

template <int N>
using Acc = float[N / 8][4];
template <int K>
using FragA = std::uint32_t[K / 16][4];

// The lane's place in its warp's fragments: rows g and g + 8, columns 2t and 2t + 1 of every
// 8-column tile.
struct LanePos {
  int lane, g, t;
  ZERO_ATTN_HD explicit LanePos(int l) : lane(l), g(l / 4), t(l % 4) {}
  // Accumulator element e (0..3) of tile n: its row (0..15) and column.
  ZERO_ATTN_HD int row(int e) const { return g + 8 * (e / 2); }
  ZERO_ATTN_HD int col(int n, int e) const { return 8 * n + 2 * t + e % 2; }
};

template <int N>
ZERO_ATTN_DEV void zero_acc(Acc<N>& acc) {
  ZERO_ATTN_UNROLL
  for (int n = 0; n < N / 8; ++n)
    for (int e = 0; e < 4; ++e) acc[n][e] = 0.0f;
}

// The 16 rows x K columns at `rows` (bf16, row-major, leading dimension ld, shared) as A.
template <int K>
ZERO_ATTN_DEV void load_a(FragA<K>& a, const bf16* rows, int ld, const LanePos& p) {
  // Lanes 0-15 address rows 0-15 at column 0 of the k-step (matrices 0 and 1), lanes 16-31 the
  // same rows at column 8 (matrices 2 and 3): registers a0..a3 as mma wants them.
  ZERO_ATTN_UNROLL
  for (int k = 0; k < K / 16; ++k) ldsm_x4(a[k], rows + (p.lane % 16) * ld + 16 * k + 8 * (p.lane / 16));
}

// An accumulator of 16 x K as the A operand of the next product (bf16): the accumulator's tiles
// 2k and 2k + 1 are A's k-step k, element for element.
template <int K>
ZERO_ATTN_DEV void acc_to_a(FragA<K>& a, const Acc<K>& acc) {
  ZERO_ATTN_UNROLL
  for (int k = 0; k < K / 16; ++k) {
    a[k][0] = pack_bf16x2(acc[2 * k][0], acc[2 * k][1]);
    a[k][1] = pack_bf16x2(acc[2 * k][2], acc[2 * k][3]);
    a[k][2] = pack_bf16x2(acc[2 * k + 1][0], acc[2 * k + 1][1]);
    a[k][3] = pack_bf16x2(acc[2 * k + 1][2], acc[2 * k + 1][3]);
  }
}

// acc[16 x N] += a[16 x K] . b^T, b being N rows x K columns at `b` (shared, leading dimension ld).
template <int N, int K>
ZERO_ATTN_DEV void mma_abt(Acc<N>& acc, const FragA<K>& a, const bf16* b, int ld, const LanePos& p) {
  // Matrix m = lane / 8 of a load: rows n0 + 8 (m / 2) .., columns 16 k + 8 (m % 2) ..; so
  // registers 0, 1 are tile n0/8's B, registers 2, 3 tile n0/8 + 1's.
  const bf16* lane_row = b + (p.lane % 8 + 8 * (p.lane / 16)) * ld + 8 * ((p.lane / 8) % 2);
  ZERO_ATTN_UNROLL
  for (int n = 0; n < N / 16; ++n) {
    ZERO_ATTN_UNROLL
    for (int k = 0; k < K / 16; ++k) {
      std::uint32_t f[4];
      ldsm_x4(f, lane_row + 16 * n * ld + 16 * k);
      const std::uint32_t b0[2] = {f[0], f[1]}, b1[2] = {f[2], f[3]};
      mma_bf16(acc[2 * n], a[k], b0);
      mma_bf16(acc[2 * n + 1], a[k], b1);
    }
  }
}

// acc[16 x N] += a[16 x K] . b, b being K rows x N columns at `b` (shared, leading dimension ld).
template <int N, int K>
ZERO_ATTN_DEV void mma_ab(Acc<N>& acc, const FragA<K>& a, const bf16* b, int ld, const LanePos& p) {
  // Transposed loads: matrix m = lane / 8 covers rows 16 k + 8 (m % 2) .., columns n0 + 8 (m / 2)
  // ..; registers 0, 1 are tile n0/8's B (k rows 2t.. and 2t+8..), registers 2, 3 the next tile's.
  const bf16* lane_row = b + (p.lane % 8 + 8 * ((p.lane / 8) % 2)) * ld + 8 * (p.lane / 16);
  ZERO_ATTN_UNROLL
  for (int k = 0; k < K / 16; ++k) {
    ZERO_ATTN_UNROLL
    for (int n = 0; n < N / 16; ++n) {
      std::uint32_t f[4];
      ldsm_x4_t(f, lane_row + 16 * k * ld + 16 * n);
      const std::uint32_t b0[2] = {f[0], f[1]}, b1[2] = {f[2], f[3]};
      mma_bf16(acc[2 * n], a[k], b0);
      mma_bf16(acc[2 * n + 1], a[k], b1);
    }
  }
}

// Adds a warp's 16 x HS accumulator into rows row0 .. row0+15 (those < T) of a bf16 matrix with
// row stride `stride`, each element rounded once.
template <int HS>
ZERO_ATTN_DEV void add_acc(bf16* dst, std::size_t stride, int row0, int T, const Acc<HS>& acc, const LanePos& p) {
  ZERO_ATTN_UNROLL
  for (int half = 0; half < 2; ++half) {
    const int r = row0 + p.row(2 * half);
    if (r >= T) continue;
    bf16* row = dst + static_cast<std::size_t>(r) * stride;
    ZERO_ATTN_UNROLL
    for (int n = 0; n < HS / 8; ++n) add_to_bf16x2(row + p.col(n, 0), acc[n][2 * half], acc[n][2 * half + 1]);
  }
}

}  // namespace zero::gpt::cuda::attn
