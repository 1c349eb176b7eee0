// The GPT model's compute layer: every operation the forward and backward passes need, on raw
// pointers and sizes, behind one interface.
//
// The model (gpt_model.hpp) owns the schedule and the buffers; an Ops owns the arithmetic and
// the memory it runs in. HostOps computes in fp32 on the CPU (matrix products through OpenBLAS,
// the rest OpenMP loops); a CUDA implementation of the same interface would take device
// pointers and launch kernels, and the model would not change.
//
// Conventions shared by every implementation:
//   - Activations are row-major [N, C] with N = B*T rows (one per token).
//   - Weights use HF's Conv1D layout: W is [in, out] and y = x W + b.
//   - Backward functions ADD (+=) into every gradient they produce, activation gradients
//     included: a residual branch's gradient is then simply accumulated into the running
//     residual gradient, and parameter gradients accumulate over micro-batches and over the
//     two uses of the tied embedding, as the engine's contract requires.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace zero::gpt {

class Ops {
 public:
  virtual ~Ops() = default;
  virtual const char* name() const = 0;

  // Memory where this Ops computes (host RAM for HostOps).
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void deallocate(void* p) noexcept = 0;
  virtual void upload(void* dst, const void* host_src, std::size_t bytes) = 0;
  virtual void download(void* host_dst, const void* src, std::size_t bytes) = 0;
  virtual void fill_zero(float* p, std::size_t n) = 0;

  // out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]
  virtual void encoder_forward(float* out, const std::int32_t* tokens, const float* wte,
                               const float* wpe, int B, int T, int C) = 0;
  virtual void encoder_backward(float* dwte, float* dwpe, const float* dout,
                                const std::int32_t* tokens, int B, int T, int C) = 0;

  // LayerNorm over the last dimension (eps 1e-5); mean and rstd [N] are kept for the backward.
  virtual void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                 const float* w, const float* b, int N, int C) = 0;
  virtual void layernorm_backward(float* dinp, float* dw, float* db, const float* dout,
                                  const float* inp, const float* w, const float* mean,
                                  const float* rstd, int N, int C) = 0;

  // out[N,OC] = inp[N,C] W[C,OC] + bias[OC] (bias may be null).
  virtual void matmul_forward(float* out, const float* inp, const float* w, const float* bias,
                              int N, int C, int OC) = 0;
  // dinp may be null (not needed); dbias may be null when there is no bias.
  virtual void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout,
                               const float* inp, const float* w, int N, int C, int OC) = 0;

  // Causal self-attention. qkv [B,T,3C] holds q | k | v, head h in columns h*hs .. (h+1)*hs of
  // each; out [B,T,C]; att [B,NH,T,T] receives the softmax probabilities (zero above the
  // diagonal) for the backward; datt is scratch of the same size.
  virtual void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C,
                                 int NH) = 0;
  virtual void attention_backward(float* dqkv, float* datt, const float* dout, const float* qkv,
                                  const float* att, int B, int T, int C, int NH) = 0;

  // GELU, tanh approximation.
  virtual void gelu_forward(float* out, const float* inp, std::size_t n) = 0;
  virtual void gelu_backward(float* dinp, const float* inp, const float* dout, std::size_t n) = 0;

  virtual void residual_forward(float* out, const float* a, const float* b, std::size_t n) = 0;

  // LM head tied to the token embedding: logits[N,Vp] = x[N,C] wte[Vp,C]^T.
  virtual void logits_forward(float* logits, const float* x, const float* wte, int N, int C,
                              int Vp) = 0;
  virtual void logits_backward(float* dx, float* dwte, const float* dlogits, const float* x,
                               const float* wte, int N, int C, int Vp) = 0;

  // Softmax cross-entropy over the first V of Vp logits per row. losses[n] = -log p(target);
  // if dlogits is non-null it receives (p - onehot) * dloss for ids < V and exactly 0 for the
  // padded ids (it may alias logits: the gradient then overwrites them). Targets are in [0, V).
  virtual void softmax_cross_entropy(float* losses, float* dlogits, const float* logits,
                                     const std::int32_t* targets, int N, int V, int Vp,
                                     float dloss) = 0;
};

// The CPU implementation (fp32, OpenBLAS + OpenMP).
std::unique_ptr<Ops> make_host_ops();

// The peak MFU is measured against on the host: the best rate of square OpenBLAS sgemm calls
// with this process's thread setting, in TFLOPs. The size grows until one call takes ~50 ms
// (so small machines finish in well under a second and large ones are not measured on a
// product that fits in cache), then the best of three calls counts.
double measure_host_sgemm_tflops();

}  // namespace zero::gpt
