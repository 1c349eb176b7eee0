// The CPU arithmetic behind HostOps, written once for any floating type.
//
// HostOps runs these in fp32. The tests also run them in fp64, where centred finite
// differences are accurate to ~1e-8, so each backward is checked against the very code the
// trainer runs rather than against a second implementation. Semantics are those of ops.hpp
// (backward functions add into their outputs). Instantiated for float and double.
#pragma once

#include <cstddef>
#include <cstdint>

#include "gpt/attention_shape.hpp"

namespace zero::gpt::host {

// With a vocabulary part (tensor parallelism): wte holds the rows [row0, row0 + rows) only, ids
// outside them contribute nothing (forward: zeros; backward: no gradient), and wpe may be null in
// the forward (no position term). rows < 0: the whole vocabulary.
template <class T>
void encoder_forward(T* out, const std::int32_t* tokens, const T* wte, const T* wpe, int B, int T_, int C, int row0 = 0,
                     int rows = -1);
template <class T>
void encoder_backward(T* dwte, T* dwpe, const T* dout, const std::int32_t* tokens, int B, int T_, int C, int row0 = 0,
                      int rows = -1);

template <class T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* w, const T* b, int N, int C);
template <class T>
void layernorm_backward(T* dinp, T* dw, T* db, const T* dout, const T* inp, const T* w, const T* mean, const T* rstd,
                        int N, int C);

template <class T>
void matmul_forward(T* out, const T* inp, const T* w, const T* bias, int N, int C, int OC);
template <class T>
void matmul_backward(T* dinp, T* dw, T* dbias, const T* dout, const T* inp, const T* w, int N, int C, int OC);

template <class T>
void attention_forward(T* out, T* att, const T* qkv, const AttentionShape& s);
template <class T>
void attention_backward(T* dqkv, T* datt, const T* dout, const T* qkv, const T* att, const AttentionShape& s);

template <class T>
void rmsnorm_forward(T* out, T* rstd, const T* inp, const T* w, int N, int C, double eps);
template <class T>
void rmsnorm_backward(T* dinp, T* dw, const T* dout, const T* inp, const T* w, const T* rstd, int N, int C);
// In place on qkv (sign 1) or on its gradient (sign -1, the transpose).
template <class T>
void rotary(T* qkv, const AttentionShape& s, double theta, int sign);
// out [N, F] = silu(gate) * up, inp [N, 2F] = gate | up; the backward overwrites dinp.
template <class T>
void swiglu_forward(T* out, const T* inp, int N, int F);
template <class T>
void swiglu_backward(T* dinp, const T* dout, const T* inp, int N, int F);

template <class T>
void gelu_forward(T* out, const T* inp, std::size_t n);
template <class T>
void gelu_backward(T* dinp, const T* inp, const T* dout, std::size_t n);
// d = GELU'(inp) * d (overwrites: the gradient of the GELU's input from that of its output).
template <class T>
void gelu_backward_inplace(T* d, const T* inp, std::size_t n);

template <class T>
void residual_forward(T* out, const T* a, const T* b, std::size_t n);

template <class T>
void logits_forward(T* logits, const T* x, const T* wte, int N, int C, int Vp);
template <class T>
void logits_backward(T* dx, T* dwte, const T* dlogits, const T* x, const T* wte, int N, int C, int Vp);

template <class T>
void softmax_cross_entropy(T* losses, T* dlogits, const T* logits, const std::int32_t* targets, int N, int V, int Vp,
                           T dloss);

// Vocabulary-parallel cross-entropy (Ops::cross_entropy_part_*): logits [N, Vl] are the ids
// [v0, v0 + Vl); ids >= V are padding and take no part.
template <class T>
void cross_entropy_part_max(float* row_max, const T* logits, int N, int Vl, int v0, int V);
template <class T>
void cross_entropy_part_sums(float* sums, const T* logits, const float* row_max, const std::int32_t* targets, int N,
                             int Vl, int v0, int V);
template <class T>
void cross_entropy_part_finish(float* losses, T* dlogits, const T* logits, const float* row_max, const float* sums,
                               const std::int32_t* targets, int N, int Vl, int v0, int V, T dloss);

}  // namespace zero::gpt::host
