// The per-element and per-row arithmetic of the GPT kernels, in fp32, callable from both sides.
//
// Each function is the whole formula one thread applies to one element (GELU and its
// derivative, SwiGLU and its gradients, the LayerNorm input gradient, the softmax cross-entropy gradient) or one step
// of a reduction (merging two online-softmax partial statistics). Kept free of CUDA headers so the host unit tests
// (test/unit/gpt/test_gpt_math.cpp) compile it with the host compiler alone and compare it with the fp64 reference in
// host_kernels.cpp; the kernels in this folder call the very same functions.
#pragma once

#include <math.h>

#ifdef __CUDACC__
#define ZERO_GPT_HD __host__ __device__ __forceinline__
#else
#define ZERO_GPT_HD inline
#endif

namespace zero::gpt::cuda::math {

constexpr float kLayerNormEps = 1e-5f;
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

// GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as host_kernels.cpp.
ZERO_GPT_HD float gelu(float x) {
  const float u = kGeluScale * (x + kGeluCubic * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}

// d GELU / dx of the same approximation (host_kernels.cpp's gelu_backward, term for term).
ZERO_GPT_HD float gelu_grad(float x) {
  const float u = kGeluScale * (x + kGeluCubic * x * x * x);
  const float th = tanhf(u);
  const float du = kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
  return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du;
}

// 1 / sqrt(variance + eps). rsqrtf on the device is within 2 ulp; the host uses the exact form.
ZERO_GPT_HD float layernorm_rstd(float variance) {
#ifdef __CUDA_ARCH__
  return rsqrtf(variance + kLayerNormEps);
#else
  return 1.0f / sqrtf(variance + kLayerNormEps);
#endif
}

// LayerNorm input gradient of one element: with dn = dy w and xhat = (x - mean) rstd,
// dx = rstd (dn - mean(dn) - xhat mean(dn xhat)). mean_dn and mean_dn_xhat are the row means.
ZERO_GPT_HD float layernorm_dinp(float dy, float w, float xhat, float mean_dn, float mean_dn_xhat, float rstd) {
  return (dy * w - mean_dn - xhat * mean_dn_xhat) * rstd;
}

// RMSNorm: 1 / sqrt(mean of squares + eps) (rsqrtf on the device, as layernorm_rstd).
ZERO_GPT_HD float rmsnorm_rstd(float mean_square, float eps) {
#ifdef __CUDA_ARCH__
  return rsqrtf(mean_square + eps);
#else
  return 1.0f / sqrtf(mean_square + eps);
#endif
}

// SwiGLU of one (gate, up) pair: silu(g) u = g sigmoid(g) u, and its two gradients for dy
// (host_kernels.cpp's swiglu_backward, term for term).
ZERO_GPT_HD float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
ZERO_GPT_HD float swiglu(float g, float u) { return g * sigmoid(g) * u; }
ZERO_GPT_HD float swiglu_dgate(float g, float u, float dy) {
  const float sg = sigmoid(g);
  return dy * u * sg * (1.0f + g * (1.0f - sg));
}
ZERO_GPT_HD float swiglu_dup(float g, float dy) { return dy * g * sigmoid(g); }

// Running softmax statistics of a set of logits: max m and sum s of exp(l - m). The empty set is
// (-inf, 0); merging is exact up to rounding whichever way the set is split, so threads may keep
// their own and combine them in a tree.
struct SoftmaxStats {
  float max;
  float sum;
};

ZERO_GPT_HD SoftmaxStats softmax_stats_empty() { return {-INFINITY, 0.0f}; }

ZERO_GPT_HD SoftmaxStats softmax_stats_add(SoftmaxStats a, float logit) {
  // A -inf logit has probability 0; skipping it keeps an empty set from becoming NaN. A NaN
  // logit falls through to the sum and poisons it, as it should.
  if (logit == -INFINITY) return a;
  if (logit > a.max) return {logit, a.sum * expf(a.max - logit) + 1.0f};
  return {a.max, a.sum + expf(logit - a.max)};
}

ZERO_GPT_HD SoftmaxStats softmax_stats_merge(SoftmaxStats a, SoftmaxStats b) {
  // An empty side contributes nothing; testing it avoids exp(-inf - -inf) = NaN.
  if (a.sum == 0.0f) return b;
  if (b.sum == 0.0f) return a;
  const float m = a.max > b.max ? a.max : b.max;
  return {m, a.sum * expf(a.max - m) + b.sum * expf(b.max - m)};
}

// log-sum-exp of the set.
ZERO_GPT_HD float softmax_stats_lse(SoftmaxStats s) { return s.max + logf(s.sum); }

// Cross-entropy gradient of one logit: (softmax - onehot) dloss.
ZERO_GPT_HD float cross_entropy_dlogit(float logit, float lse, bool is_target, float dloss) {
  return (expf(logit - lse) - (is_target ? 1.0f : 0.0f)) * dloss;
}

// Rows per block of a deterministic column reduction over n rows (LayerNorm dw/db, bias
// gradients): a function of n alone, so the summation order, and therefore every rounding, is
// the same on every device and every run. At least 64 rows per block, and at most 1024 blocks,
// which bounds the scratch to 1024 partial rows.
// (Ceilings are written without n + d - 1, which would overflow for n near 2^31.)
ZERO_GPT_HD int column_reduce_rows_per_block(int n) {
  const int by_count = n / 1024 + (n % 1024 != 0 ? 1 : 0);
  return by_count > 64 ? by_count : 64;
}
ZERO_GPT_HD int column_reduce_blocks(int n) {
  const int r = column_reduce_rows_per_block(n);
  return n / r + (n % r != 0 ? 1 : 0);
}

}  // namespace zero::gpt::cuda::math

#undef ZERO_GPT_HD
