// The shape of one attention call, shared by the host and CUDA kernels (no other dependency).
#pragma once

#include <cmath>

#if defined(__CUDACC__)
#define ZERO_GPT_HOST_DEVICE __host__ __device__
#else
#define ZERO_GPT_HOST_DEVICE
#endif

namespace zero::gpt {

// B sequences of T tokens, this rank's NH query heads and NKV key/value heads of hs dimensions.
// qkv rows are [q (NH hs) | k (NKV hs) | v (NKV hs)]; query head h reads key/value head h % NKV
// (GPT-2 and BLOOM: NKV = NH, each head its own). out rows are NH hs. With alibi_heads > 0
// (BLOOM) the score of query t and key t2 gets -slope (t - t2), slope = alibi_slope(head0 + h,
// alibi_heads): head0 is this rank's first head in the model.
struct AttentionShape {
  int B = 0, T = 0, NH = 0, NKV = 0, hs = 0;
  int alibi_heads = 0;
  int head0 = 0;
  ZERO_GPT_HOST_DEVICE int width() const { return NH * hs; }
  ZERO_GPT_HOST_DEVICE int qkv_width() const { return (NH + 2 * NKV) * hs; }
};

// ALiBi's slope of head `head` of n (BLOOM's rule, Press et al.): with m the largest power of two
// <= n, heads below m take 2^(-8 (head + 1) / m), the rest the odd powers of 2^(-4/m).
ZERO_GPT_HOST_DEVICE inline double alibi_slope(int head, int n) {
  int m = 1;
  while (2 * m <= n) m *= 2;
  return head < m ? exp2(-8.0 / m * (head + 1)) : exp2(-4.0 / m * (2 * (head - m) + 1));
}

}  // namespace zero::gpt
