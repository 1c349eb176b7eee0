// The scalar arithmetic of the flash-style attention kernels (attention.cu), kept apart so the
// host can run exactly the same code: the unit test test_gpt_attention_math replays the kernels'
// tile loops on the CPU with these functions and compares them with a plain softmax attention.
//
// Scores live in the log2 domain (s2 = q.k / sqrt(hs) * log2(e)) so that every exponential is
// one exp2. A row's running state is (max, sum): the largest s2 seen so far and the sum of
// exp2(s2 - max) over the keys seen so far. Folding in a tile with a larger maximum rescales
// what was accumulated (sum and output) by exp2(old max - new max). The row's log-sum-exp (in
// natural log, what the forward stores for the backward) is (max + log2(sum)) * ln 2.
//
// Causal tiles: query tile qt holds rows [qt*q_rows, (qt+1)*q_rows), key tile kt keys
// [kt*k_rows, (kt+1)*k_rows). Query i attends key j iff j <= i < T (so j < T too); a key tile
// entirely to the right of a query tile's last row is skipped, never masked element by element.
#pragma once

#include <math.h>

#if defined(__CUDACC__)
#define ZERO_ATTN_HD __host__ __device__ __forceinline__
#else
#define ZERO_ATTN_HD inline
#endif

namespace zero::gpt::cuda::attn {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// --- causal tile ranges ---

ZERO_ATTN_HD int tile_count(int n, int tile) { return (n + tile - 1) / tile; }

ZERO_ATTN_HD bool attends(int i, int j, int T) { return j <= i && i < T; }

// Key tiles a query tile needs: 0 .. the tile holding its last valid row (the diagonal).
ZERO_ATTN_HD int causal_key_tiles(int q_tile, int q_rows, int k_rows, int T) {
  const int end = (q_tile + 1) * q_rows < T ? (q_tile + 1) * q_rows : T;
  return (end - 1) / k_rows + 1;
}

// First query tile that attends anything in key tile k_tile (the one holding its first key);
// every query tile after it does too, up to tile_count(T, q_rows).
ZERO_ATTN_HD int causal_first_query_tile(int k_tile, int q_rows, int k_rows) { return k_tile * k_rows / q_rows; }

// --- online softmax (log2 domain) ---

struct OnlineSoftmax {
  float max;  // largest s2 so far (-inf before any key)
  float sum;  // sum of exp2(s2 - max) so far
};

ZERO_ATTN_HD OnlineSoftmax online_init() { return {-INFINITY, 0.0f}; }

// The value probabilities are taken relative to. A row with no key yet (max -inf) would give
// exp2(-inf - -inf) = NaN; 0 instead makes every masked p exactly exp2(-inf) = 0.
ZERO_ATTN_HD float online_reference(float max) { return max == -INFINITY ? 0.0f : max; }

// Folds in a tile whose largest s2 in this row is tile_max: raises the maximum and rescales the
// sum. Returns the factor the caller must also apply to the output accumulated so far (0 when
// nothing was accumulated, so a stale accumulator can never leak in).
ZERO_ATTN_HD float online_rescale(OnlineSoftmax& st, float tile_max) {
  const float new_max = fmaxf(st.max, tile_max);
  const float alpha = st.max == -INFINITY ? 0.0f : exp2f(st.max - new_max);
  st.max = new_max;
  st.sum *= alpha;
  return alpha;
}

// Unnormalised probability of a score s2 (-inf for a masked key gives 0), after online_rescale.
ZERO_ATTN_HD float online_prob(const OnlineSoftmax& st, float s2) { return exp2f(s2 - online_reference(st.max)); }

// Two partial states of the same row (disjoint key sets) as one.
ZERO_ATTN_HD OnlineSoftmax online_merge(OnlineSoftmax a, OnlineSoftmax b) {
  const float m = fmaxf(a.max, b.max);
  if (m == -INFINITY) return online_init();
  const float sa = a.max == -INFINITY ? 0.0f : a.sum * exp2f(a.max - m);
  const float sb = b.max == -INFINITY ? 0.0f : b.sum * exp2f(b.max - m);
  return {m, sa + sb};
}

// Natural-log log-sum-exp of the row's scaled scores.
ZERO_ATTN_HD float online_lse(const OnlineSoftmax& st) { return (st.max + log2f(st.sum)) * kLn2; }

// --- backward ---

// The probability rebuilt from the stored log-sum-exp: exp(s - lse) with s2 = s * log2(e).
ZERO_ATTN_HD float prob_from_lse(float s2, float lse) { return exp2f(s2 - lse * kLog2e); }

// Gradient of the unscaled score q.k: p * (dp - D) * scale, D = dot(dout, out) of the row
// (= sum_j p_j dp_j, the softmax Jacobian's rank-one term).
ZERO_ATTN_HD float score_grad(float p, float dp, float drow, float scale) { return p * (dp - drow) * scale; }

}  // namespace zero::gpt::cuda::attn
