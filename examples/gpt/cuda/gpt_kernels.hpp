// The GPT model's CUDA kernels, one launcher per operation, as CudaOps (cuda_ops.cu) calls them.
//
// Element type bf16 (__nv_bfloat16) for parameters, gradients and activations; fp32 for
// statistics, losses and every accumulation. Semantics are those of the Ops interface
// (../ops.hpp): backward launchers ADD into their gradients unless said otherwise. Every
// launcher enqueues on `stream` and never synchronizes the host; a launcher that needs scratch
// takes it as an argument (sized by the *_scratch_* functions) so nothing allocates in a step.
// Launchers check their shapes and throw zero::Error naming the operation and the shape that
// is not supported, before anything is enqueued.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "gpt/attention_shape.hpp"

namespace zero::gpt::cuda {

using bf16 = __nv_bfloat16;

// --- encoder (encoder.cu) ---
// rows >= 0: wte holds the vocabulary rows [row0, row0 + rows) only (tensor parallelism, the
// Ops' *_part calls); other ids read zeros and get no gradient. wpe null: no position term
// (a model without learned positions, or a tensor rank that leaves it to another); dwpe null:
// no position gradient.
void encoder_forward(bf16* out, const std::int32_t* tokens, const bf16* wte, const bf16* wpe, int B, int T, int C,
                     cudaStream_t stream, int row0 = 0, int rows = -1);
// Deterministic, no atomics on the hot path: the (b, t) positions are grouped by token id on the
// device (a sort of B*T ids), then each id's rows are summed in position order.
std::size_t encoder_backward_scratch_bytes(int B, int T, int C);
void encoder_backward(bf16* dwte, bf16* dwpe, const bf16* dout, const std::int32_t* tokens, int B, int T, int C,
                      void* scratch, std::size_t scratch_bytes, cudaStream_t stream, int row0 = 0, int rows = -1);

// --- LayerNorm (layernorm.cu), eps 1e-5, statistics in fp32 ---
void layernorm_forward(bf16* out, float* mean, float* rstd, const bf16* inp, const bf16* w, const bf16* b, int N, int C,
                       cudaStream_t stream);
// residual = a + b (rounded to bf16), out = LayerNorm(residual), in one pass.
void residual_layernorm_forward(bf16* residual, bf16* out, float* mean, float* rstd, const bf16* a, const bf16* b,
                                const bf16* w, const bf16* bias, int N, int C, cudaStream_t stream);
// Deterministic: dw and db are reduced in fp32 over row blocks in a fixed order (partial sums
// per block in scratch, then one ordered pass), then added to the bf16 gradients.
std::size_t layernorm_backward_scratch_bytes(int N, int C);
void layernorm_backward(bf16* dinp, bf16* dw, bf16* db, const bf16* dout, const bf16* inp, const bf16* w,
                        const float* mean, const float* rstd, int N, int C, void* scratch, std::size_t scratch_bytes,
                        cudaStream_t stream);

// --- RMSNorm (layernorm.cu), statistics in fp32 ---
// out = inp w rstd, rstd = 1 / sqrt(mean(inp^2) + eps) kept per row for the backward.
void rmsnorm_forward(bf16* out, float* rstd, const bf16* inp, const bf16* w, int N, int C, float eps,
                     cudaStream_t stream);
// dinp += and dw += (dw deterministic, reduced as layernorm_backward's).
std::size_t rmsnorm_backward_scratch_bytes(int N, int C);
void rmsnorm_backward(bf16* dinp, bf16* dw, const bf16* dout, const bf16* inp, const bf16* w, const float* rstd, int N,
                      int C, void* scratch, std::size_t scratch_bytes, cudaStream_t stream);

// --- element-wise (elementwise.cu) ---
void residual_forward(bf16* out, const bf16* a, const bf16* b, std::size_t n, cudaStream_t stream);
// out = in widened to fp32; and out = in rounded to bf16 (to nearest, ties to even).
void widen_to_f32(float* out, const bf16* in, std::size_t n, cudaStream_t stream);
void round_to_bf16(bf16* out, const float* in, std::size_t n, cudaStream_t stream);
// GELU (tanh approximation), for the paths where the matmul epilogue does not apply.
void gelu_forward(bf16* out, const bf16* inp, std::size_t n, cudaStream_t stream);
// dinp = dout * GELU'(inp) (overwrites; dinp may alias dout).
void gelu_backward_inplace(bf16* dinp, const bf16* inp, const bf16* dout, std::size_t n, cudaStream_t stream);
// dbias[OC] += column sums of dout[N, OC], fp32 accumulation, deterministic.
std::size_t bias_backward_scratch_bytes(int N, int OC);
void bias_backward(bf16* dbias, const bf16* dout, int N, int OC, void* scratch, std::size_t scratch_bytes,
                   cudaStream_t stream);

// *total += the mean of values[0, n), summed in double in a fixed order (one block; n is a
// micro-batch's token count, so one block is plenty).
void add_mean(double* total, const float* values, int n, cudaStream_t stream);

// Rotary positions (Llama, rotate-half) in place on the q and k heads of qkv [B,T,qkv_width]:
// dims i and i + hs/2 of each head at position t turn by t theta^(-2i/hs); sign -1 turns back
// (the backward, on dqkv). hs must be even.
void rotary(bf16* qkv, const AttentionShape& s, float theta, int sign, cudaStream_t stream);
// SwiGLU: out [N,F] = silu(gate) up, inp [N,2F] = gate | up; the backward OVERWRITES dinp
// [N,2F] (which may alias inp).
void swiglu_forward(bf16* out, const bf16* inp, int N, int F, cudaStream_t stream);
void swiglu_backward(bf16* dinp, const bf16* dout, const bf16* inp, int N, int F, cudaStream_t stream);

// --- loss (cross_entropy.cu) ---
// Fused softmax cross-entropy over the first V of Vp logits per row (fp32 inside): losses[n]
// and, if dlogits is non-null, dlogits = (softmax - onehot) * dloss for ids < V, 0 for the
// padding; dlogits may alias logits. One read of the logits for the statistics, one for the
// gradient; no probabilities are stored.
void softmax_cross_entropy(float* losses, bf16* dlogits, const bf16* logits, const std::int32_t* targets, int N, int V,
                           int Vp, float dloss, cudaStream_t stream);
// Vocabulary-parallel cross-entropy, the three passes of Ops::cross_entropy_part_* (logits
// [N, Vl] are the ids [v0, v0 + Vl); ids >= V take no part); one block per row.
void cross_entropy_part_max(float* row_max, const bf16* logits, int N, int Vl, int v0, int V, cudaStream_t stream);
void cross_entropy_part_sums(float* sums, const bf16* logits, const float* row_max, const std::int32_t* targets, int N,
                             int Vl, int v0, int V, cudaStream_t stream);
void cross_entropy_part_finish(float* losses, bf16* dlogits, const bf16* logits, const float* row_max,
                               const float* sums, const std::int32_t* targets, int N, int Vl, int v0, int V,
                               float dloss, cudaStream_t stream);

// --- attention (attention.cu): causal, flash-style ---
// The shape is AttentionShape's: qkv [B,T,qkv_width] (q of NH heads | k of NKV | v of NKV, query
// head h reading key/value head h % NKV), out [B,T,NH hs], ALiBi when alibi_heads > 0; lse
// [B,NH,T] fp32 (the log-sum-exp of each row's scaled, biased scores, what the backward needs to
// rebuild the probabilities). No T x T matrix is stored. Supported shapes: attention_supported.
bool attention_supported(const AttentionShape& s);
void attention_forward(bf16* out, float* lse, const bf16* qkv, const AttentionShape& s, cudaStream_t stream);
// dqkv += gradient of q, k and v (deterministic, grouped-query sums included). Scratch:
// attention_backward_scratch_floats fp32 elements (the per-row dot(dout, out)).
std::size_t attention_backward_scratch_floats(const AttentionShape& s);
void attention_backward(bf16* dqkv, float* scratch, const bf16* dout, const bf16* qkv, const bf16* out,
                        const float* lse, const AttentionShape& s, cudaStream_t stream);
// The same for GPT-2's multi-head shape: C = NH hs, qkv [B,T,3C].
bool attention_supported(int T, int C, int NH);
void attention_forward(bf16* out, float* lse, const bf16* qkv, int B, int T, int C, int NH, cudaStream_t stream);
std::size_t attention_backward_scratch_floats(int B, int T, int C, int NH);
void attention_backward(bf16* dqkv, float* scratch, const bf16* dout, const bf16* qkv, const bf16* out,
                        const float* lse, int B, int T, int C, int NH, cudaStream_t stream);

}  // namespace zero::gpt::cuda
