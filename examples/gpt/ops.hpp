// The GPT model's compute layer: every operation the forward and backward passes need, on raw
// pointers and sizes, behind one interface.
//
// The model (gpt_model.hpp) owns the schedule and the buffers; an Ops owns the arithmetic and
// the memory it runs in. HostOps computes in fp32 on the CPU (matrix products through OpenBLAS,
// the rest OpenMP loops); CudaOps (cuda/cuda_ops.hpp) computes in bf16 with fp32 accumulation
// on the GPU (cuBLASLt products, fused kernels, flash-style attention). The model is the same
// for both.
//
// Conventions shared by every implementation:
//   - Parameters, gradients and activations hold elements of the Ops' dtype() (fp32 for
//     HostOps, bf16 for CudaOps). The model never reads an element: it carves buffers and hands
//     out pointers, so they are typed `Act*`, an incomplete type that the implementation casts
//     to its own element type. Statistics (LayerNorm mean/rstd, attention statistics, losses)
//     are always fp32 (`float*`).
//   - Activations are row-major [N, C] with N = B*T rows (one per token).
//   - Weights use HF's Conv1D layout: W is [in, out] and y = x W + b.
//   - Backward functions ADD (+=) into every gradient they produce, activation gradients
//     included: a residual branch's gradient is then simply accumulated into the running
//     residual gradient, and parameter gradients accumulate over micro-batches and over the
//     two uses of the tied embedding, as the engine's contract requires. The one exception is
//     said where it applies (the GELU-fused matmul_backward).
//   - Every call is enqueued in order on the Ops' stream (CudaOps) or runs at once (HostOps);
//     only download() waits for the results.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "gpt/attention_shape.hpp"
#include "zero/dtype.hpp"

namespace zero::gpt {

// One element of an Ops' dtype(); never defined (see above).
struct Act;

inline Act* act_offset(Act* p, std::size_t elements, std::size_t elem_bytes) {
  return reinterpret_cast<Act*>(reinterpret_cast<std::byte*>(p) + elements * elem_bytes);
}
inline const Act* act_offset(const Act* p, std::size_t elements, std::size_t elem_bytes) {
  return reinterpret_cast<const Act*>(reinterpret_cast<const std::byte*>(p) + elements * elem_bytes);
}

class Ops {
 public:
  virtual ~Ops() = default;
  virtual const char* name() const = 0;
  // The element type of parameters, gradients and activations.
  virtual DType dtype() const = 0;
  std::size_t elem_bytes() const { return dtype_size(dtype()); }
  // True when pointers are host memory (HostOps); false for device memory.
  virtual bool host_memory() const = 0;

  // Memory where this Ops computes. Allocation happens while the model is built, never in the
  // forward or backward.
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void deallocate(void* p) noexcept = 0;
  // Host -> Ops memory. `host_src` may be reused as soon as the call returns (CudaOps copies it
  // into pinned staging memory first, so the transfer itself stays asynchronous).
  virtual void upload(void* dst, const void* host_src, std::size_t bytes) = 0;
  // Ops memory -> host; returns when the bytes are there.
  virtual void download(void* host_dst, const void* src, std::size_t bytes) = 0;
  virtual void fill_zero(void* p, std::size_t bytes) = 0;
  // n elements of the dtype widened to fp32, and n fp32 values rounded to it once (to nearest,
  // ties to even), in this Ops' memory: the tensor group's sums on a device communicator are
  // kept in fp32 through them. The default converts in host memory (HostOps).
  virtual void to_f32(float* dst, const Act* src, std::size_t n) { zero::convert(src, dtype(), dst, DType::f32, n); }
  virtual void from_f32(Act* dst, const float* src, std::size_t n) { zero::convert(src, DType::f32, dst, dtype(), n); }
  // Waits for every call enqueued so far.
  virtual void synchronize() = 0;
  // Called once by the model when it is built, with its largest shapes: an Ops that needs
  // scratch for its backward passes allocates it here, so no step allocates (or frees, which
  // on a GPU waits for the whole device).
  virtual void reserve(int /*max_rows*/, int /*T*/, int /*C*/, int /*NH*/) {}
  // The stream the calls are enqueued on (a cudaStream_t for CudaOps; null for HostOps), for
  // the engine: Engine::set_stream(ops.stream()) orders its collectives after the model's work.
  virtual void* stream() const { return nullptr; }

  // out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]; wpe and dwpe are null for a model without
  // learned positions (bloom, llama).
  virtual void encoder_forward(Act* out, const std::int32_t* tokens, const Act* wte, const Act* wpe, int B, int T,
                               int C) = 0;
  // dwte[tokens[b,t],:] += dout[b,t,:]; dwpe[t,:] += sum_b dout[b,t,:]. Deterministic: the
  // order of the additions does not depend on scheduling.
  virtual void encoder_backward(Act* dwte, Act* dwpe, const Act* dout, const std::int32_t* tokens, int B, int T,
                                int C) = 0;
  // The same on one part of the vocabulary (tensor parallelism): wte holds the rows
  // [vocab_begin, vocab_begin + vocab_rows) of the whole embedding; an id outside them
  // contributes zeros in the forward and no gradient in the backward. wpe may be null in the
  // forward (no position term: one rank adds it, the tensor group's all-reduce sums the parts).
  virtual void encoder_forward_part(Act* out, const std::int32_t* tokens, const Act* wte, const Act* wpe, int B, int T,
                                    int C, int vocab_begin, int vocab_rows) = 0;
  virtual void encoder_backward_part(Act* dwte, Act* dwpe, const Act* dout, const std::int32_t* tokens, int B, int T,
                                     int C, int vocab_begin, int vocab_rows) = 0;

  // LayerNorm over the last dimension (eps 1e-5); mean and rstd [N] are kept for the backward.
  virtual void layernorm_forward(Act* out, float* mean, float* rstd, const Act* inp, const Act* w, const Act* b, int N,
                                 int C) = 0;
  // residual = a + b, then out = LayerNorm(residual): the residual add fused with the norm
  // that reads it (residual may alias a or b).
  virtual void residual_layernorm_forward(Act* residual, Act* out, float* mean, float* rstd, const Act* a, const Act* b,
                                          const Act* w, const Act* bias, int N, int C) = 0;
  // Deterministic (dw and db are summed over rows in a fixed order).
  virtual void layernorm_backward(Act* dinp, Act* dw, Act* db, const Act* dout, const Act* inp, const Act* w,
                                  const float* mean, const float* rstd, int N, int C) = 0;

  // out[N,OC] = inp[N,C] W[C,OC] + bias[OC] (bias may be null). With pre_gelu non-null, the
  // product plus bias goes to pre_gelu [N,OC] and out receives GELU (tanh approximation) of it.
  virtual void matmul_forward(Act* out, const Act* inp, const Act* w, const Act* bias, int N, int C, int OC,
                              Act* pre_gelu = nullptr) = 0;
  // dinp += dout W^T, dw += inp^T dout, dbias += column sums of dout. dinp may be null (not
  // needed); dbias may be null when there is no bias. With pre_gelu non-null (the output of a
  // GELU-fused forward whose input gradient is wanted), dinp is OVERWRITTEN with
  // (dout W^T) * GELU'(pre_gelu): the gradient of the GELU's input, which the model uses once.
  virtual void matmul_backward(Act* dinp, Act* dw, Act* dbias, const Act* dout, const Act* inp, const Act* w, int N,
                               int C, int OC, const Act* pre_gelu = nullptr) = 0;

  // RMSNorm over the last dimension: out = inp w / sqrt(mean(inp^2) + eps); rstd [N] (the
  // reciprocal root) is kept for the backward, which is deterministic as layernorm_backward's.
  virtual void rmsnorm_forward(Act* out, float* rstd, const Act* inp, const Act* w, int N, int C, float eps) = 0;
  virtual void rmsnorm_backward(Act* dinp, Act* dw, const Act* dout, const Act* inp, const Act* w, const float* rstd,
                                int N, int C) = 0;

  // Causal self-attention of `s` (AttentionShape above); out [B,T,NH hs]. `stats`
  // (attention_stats_floats) keeps what the backward needs besides qkv and out: the T x T
  // probabilities for HostOps, one log-sum-exp per row for CudaOps.
  virtual std::size_t attention_stats_floats(int B, int T, int NH) const = 0;
  // Scratch the backward may overwrite (attention_scratch_floats fp32 elements).
  virtual std::size_t attention_scratch_floats(int B, int T, int NH) const = 0;
  virtual void attention_forward(Act* out, float* stats, const Act* qkv, const AttentionShape& s) = 0;
  virtual void attention_backward(Act* dqkv, float* scratch, const Act* dout, const Act* qkv, const Act* out,
                                  const float* stats, const AttentionShape& s) = 0;
  // Rotary positions (Llama), in place on the q and k heads of qkv [B,T,qkv_width]: dimensions i
  // and i + hs/2 of every q and k head at position t turn by the angle t theta^(-2i/hs) (Hugging
  // Face's rotate-half). The backward turns dqkv's q and k parts back (the transpose), in place.
  virtual void rotary_forward(Act* qkv, const AttentionShape& s, float theta) = 0;
  virtual void rotary_backward(Act* dqkv, const AttentionShape& s, float theta) = 0;

  // SwiGLU (Llama's MLP): out [N,F] = silu(gate) * up from inp [N,2F] = gate | up. The backward
  // OVERWRITES dinp [N,2F] with the gradients of gate and up.
  virtual void swiglu_forward(Act* out, const Act* inp, int N, int F) = 0;
  virtual void swiglu_backward(Act* dinp, const Act* dout, const Act* inp, int N, int F) = 0;

  virtual void residual_forward(Act* out, const Act* a, const Act* b, std::size_t n) = 0;

  // The LM head, tied to the token embedding or not: logits[N,Vp] = x[N,C] wte[Vp,C]^T.
  virtual void logits_forward(Act* logits, const Act* x, const Act* wte, int N, int C, int Vp) = 0;
  virtual void logits_backward(Act* dx, Act* dwte, const Act* dlogits, const Act* x, const Act* wte, int N, int C,
                               int Vp) = 0;

  // Softmax cross-entropy over the first V of Vp logits per row, computed in fp32.
  // losses[n] = -log p(target); if dlogits is non-null it receives (p - onehot) * dloss for ids
  // < V and exactly 0 for the padded ids (it may alias logits: the gradient then overwrites
  // them, and no probabilities are stored anywhere). Targets are in [0, V); a row whose target
  // is not gets a NaN loss (the trainer stops on it), never an out-of-bounds read.
  virtual void softmax_cross_entropy(float* losses, Act* dlogits, const Act* logits, const std::int32_t* targets, int N,
                                     int V, int Vp, float dloss) = 0;
  // Vocabulary-parallel cross-entropy (tensor parallelism), in three passes with the tensor
  // group's all-reduces between them, so no rank holds a whole row of logits. logits [N, Vl] are
  // the ids [v0, v0 + Vl) of the padded vocabulary; ids >= V take no part. Every output is fp32
  // in the Ops' memory:
  //   part_max:    row_max[n] = the largest of the row's real logits here (-inf if none);
  //                the caller then takes the maximum over the group;
  //   part_sums:   sums[n] = sum of exp(l - row_max[n]) over the real logits here, and
  //                sums[N + n] = the target's logit if this part holds it, else 0; the caller
  //                then sums both over the group;
  //   part_finish: losses[n] = log(sums[n]) + row_max[n] - sums[N + n] (NaN where targets[n]
  //                is outside [0, V), as softmax_cross_entropy), and with dlogits non-null (may
  //                alias logits) softmax_cross_entropy's gradient for this part.
  virtual void cross_entropy_part_max(float* row_max, const Act* logits, int N, int Vl, int v0, int V) = 0;
  virtual void cross_entropy_part_sums(float* sums, const Act* logits, const float* row_max,
                                       const std::int32_t* targets, int N, int Vl, int v0, int V) = 0;
  virtual void cross_entropy_part_finish(float* losses, Act* dlogits, const Act* logits, const float* row_max,
                                         const float* sums, const std::int32_t* targets, int N, int Vl, int v0, int V,
                                         float dloss) = 0;
  // total[0] += (values[0] + ... + values[n-1]) / n, summed in double in a fixed order; total
  // is in the Ops' memory. The training loss adds up here, so reading it costs one wait per
  // step instead of one per micro-step.
  virtual void add_mean(double* total, const float* values, int n) = 0;
};

// The CPU implementation (fp32, OpenBLAS + OpenMP).
std::unique_ptr<Ops> make_host_ops();

// The peak MFU is measured against on the host: the best rate of square OpenBLAS sgemm calls
// with this process's thread setting, in TFLOPs. The size grows until one call takes ~50 ms
// (so small machines finish in well under a second and large ones are not measured on a
// product that fits in cache), then the best of three calls counts.
double measure_host_sgemm_tflops();

}  // namespace zero::gpt
