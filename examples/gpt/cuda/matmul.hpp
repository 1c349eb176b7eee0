// The GPT model's matrix products: bf16 row-major operands, fp32 accumulation, cuBLASLt.
//
// cuBLASLt is column-major, and a row-major [R, K] matrix read column-major is its transpose,
// so every product is handed over transposed: row-major C = A B is computed as the
// column-major C^T = B^T A^T, which only swaps the operands. The bias add and the MLP's GELU
// run in the product's epilogue (BIAS, GELU_AUX_BIAS forward, DGELU backward); where cuBLASLt
// has no algorithm for a GELU epilogue (or it is switched off), the plain product runs and the
// GELU kernels of gpt_kernels.hpp finish the job.
//
// Each distinct product (operation, shape, epilogue) gets a plan on its first call: the
// descriptors and the algorithm the heuristic chose, kept for the object's life, so a training
// step after the first makes no heuristic query and allocates nothing. Algorithms are chosen
// for 16-byte aligned operands whatever the first call's pointers were, so one shape always
// runs the same algorithm (bitwise the same results for every layer and every step, a
// recomputed forward included), and split-K partial sums are only ever kept in fp32.
//
// Requirements, checked before anything is enqueued (zero::Error otherwise): every pointer
// 16-byte aligned and every row length (C, OC, Vp) a multiple of 8 elements.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>

namespace zero::gpt::cuda {

using bf16 = __nv_bfloat16;

class Matmul {
 public:
  struct Options {
    // The GELU epilogues of cuBLASLt; off: product, then gelu_forward / gelu_backward_inplace.
    bool gelu_epilogues = true;
  };
  // What the plans cost so far (tests check that repeated calls add nothing).
  struct Stats {
    std::size_t plans = 0;              // distinct products seen
    std::size_t heuristic_queries = 0;  // one per plan
    std::size_t gelu_fallbacks = 0;     // calls that ran a separate GELU kernel
  };

  // Every product is enqueued on `stream`, which must outlive this object. Creates the
  // cuBLASLt handle and allocates the workspace on the current device.
  Matmul(cudaStream_t stream, Options options);
  explicit Matmul(cudaStream_t stream) : Matmul(stream, Options{}) {}
  ~Matmul();
  Matmul(const Matmul&) = delete;
  Matmul& operator=(const Matmul&) = delete;

  // out[N,OC] = inp[N,C] w[C,OC] + bias[OC] (bias may be null). With pre_gelu non-null, the
  // product plus bias goes to pre_gelu and out = GELU(pre_gelu) (pre_gelu must not be out).
  void forward(bf16* out, const bf16* inp, const bf16* w, const bf16* bias, int N, int C, int OC, bf16* pre_gelu);
  // dw[C,OC] += inp^T dout, then, if dinp is non-null, dinp[N,C] += dout w^T; with pre_gelu
  // non-null, dinp = (dout w^T) * GELU'(pre_gelu) instead (overwritten; dinp must not be
  // pre_gelu). dw is computed first, so dinp may alias inp. The bias gradient is not here
  // (bias_backward in gpt_kernels.hpp).
  void backward(bf16* dinp, bf16* dw, const bf16* dout, const bf16* inp, const bf16* w, int N, int C, int OC,
                const bf16* pre_gelu);
  // logits[N,Vp] = x[N,C] wte[Vp,C]^T.
  void logits_forward(bf16* logits, const bf16* x, const bf16* wte, int N, int C, int Vp);
  // dwte[Vp,C] += dlogits^T x, then, if dx is non-null, dx[N,C] += dlogits wte.
  void logits_backward(bf16* dx, bf16* dwte, const bf16* dlogits, const bf16* x, const bf16* wte, int N, int C, int Vp);

  Stats stats() const;
  // Workspace handed to cuBLASLt: NVIDIA's recommendation for Hopper, enough for Ampere.
  static constexpr std::size_t kWorkspaceBytes = std::size_t{32} << 20;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zero::gpt::cuda
