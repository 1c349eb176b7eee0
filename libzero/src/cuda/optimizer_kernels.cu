// Fused Adam / AdamW and SGD over a flat shard (fp32 master and moments, any compute dtype for
// gradients and the parameter copy). Each line below is the host reference's line in
// offload/src/host_adam.cpp (adam_scalar, sgd_range) with its operations spelled as
// round-to-nearest intrinsics; see kernels.hpp for why that makes the results bitwise equal.
#include <algorithm>

#include "cuda_check.hpp"
#include "device_math.cuh"
#include "kernels.hpp"

namespace zero::cuda {

namespace {

using namespace dev;

template <int G, int O>
__global__ void adam_kernel(float* __restrict__ master, float* __restrict__ m, float* __restrict__ v,
                            const void* __restrict__ grad, void* __restrict__ out, std::size_t n,
                            AdamConstants c) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    float p = master[i];
    float g = __fmul_rn(load<G>(grad, i), c.grad_scale);
    if (c.l2) g = __fmaf_rn(c.weight_decay, p, g);
    if (c.decoupled) p = __fmul_rn(p, c.decay);
    const float mi = __fmaf_rn(c.beta1, m[i], __fmul_rn(c.one_minus_beta1, g));
    const float vi = __fmaf_rn(c.beta2, v[i], __fmul_rn(__fmul_rn(c.one_minus_beta2, g), g));
    const float denom = __fmaf_rn(__fsqrt_rn(vi), c.inv_sqrt_bias_c2, c.eps);
    p = __fmaf_rn(c.neg_step_size, __fdiv_rn(mi, denom), p);
    m[i] = mi;
    v[i] = vi;
    master[i] = p;
    store<O>(out, i, p);
  }
}

struct SgdConstants {
  float lr, momentum, weight_decay, grad_scale;
  bool first_step;
};

template <int G, int O>
__global__ void sgd_kernel(float* __restrict__ master, float* __restrict__ buf, const void* __restrict__ grad,
                           void* __restrict__ out, std::size_t n, SgdConstants c) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    float p = master[i];
    float g = __fmul_rn(load<G>(grad, i), c.grad_scale);
    if (c.weight_decay != 0.0f) g = __fadd_rn(g, __fmul_rn(c.weight_decay, p));
    if (c.momentum != 0.0f) {
      const float b = c.first_step ? g : __fadd_rn(__fmul_rn(c.momentum, buf[i]), g);
      buf[i] = b;
      g = b;
    }
    p = __fsub_rn(p, __fmul_rn(c.lr, g));
    master[i] = p;
    store<O>(out, i, p);
  }
}

int out_code(const void* out, DType t) { return out ? static_cast<int>(t) : kNone; }

template <int G>
void adam_out(float* master, float* m, float* v, const void* grad, void* out, int oc, std::size_t n,
              const AdamConstants& c, cudaStream_t s) {
  const unsigned b = blocks_for(n);
  switch (oc) {
    case kF32: adam_kernel<G, kF32><<<b, kThreads, 0, s>>>(master, m, v, grad, out, n, c); break;
    case kBF16: adam_kernel<G, kBF16><<<b, kThreads, 0, s>>>(master, m, v, grad, out, n, c); break;
    case kF16: adam_kernel<G, kF16><<<b, kThreads, 0, s>>>(master, m, v, grad, out, n, c); break;
    default: adam_kernel<G, kNone><<<b, kThreads, 0, s>>>(master, m, v, grad, out, n, c); break;
  }
}

template <int G>
void sgd_out(float* master, float* buf, const void* grad, void* out, int oc, std::size_t n, const SgdConstants& c,
             cudaStream_t s) {
  const unsigned b = blocks_for(n);
  switch (oc) {
    case kF32: sgd_kernel<G, kF32><<<b, kThreads, 0, s>>>(master, buf, grad, out, n, c); break;
    case kBF16: sgd_kernel<G, kBF16><<<b, kThreads, 0, s>>>(master, buf, grad, out, n, c); break;
    case kF16: sgd_kernel<G, kF16><<<b, kThreads, 0, s>>>(master, buf, grad, out, n, c); break;
    default: sgd_kernel<G, kNone><<<b, kThreads, 0, s>>>(master, buf, grad, out, n, c); break;
  }
}

}  // namespace

void launch_adam(float* master, float* m, float* v, const void* grad, DType gt, void* out, DType pt, std::size_t n,
                 const AdamConstants& c, cudaStream_t s) {
  if (n == 0) return;
  const int oc = out_code(out, pt);
  switch (gt) {
    case DType::f32: adam_out<kF32>(master, m, v, grad, out, oc, n, c, s); break;
    case DType::bf16: adam_out<kBF16>(master, m, v, grad, out, oc, n, c, s); break;
    case DType::f16: adam_out<kF16>(master, m, v, grad, out, oc, n, c, s); break;
  }
  ZERO_CUDA_CHECK(cudaGetLastError());
}

void launch_sgd(float* master, float* buf, const void* grad, DType gt, void* out, DType pt, std::size_t n,
                const SgdHyper& h, cudaStream_t s) {
  if (n == 0) return;
  const SgdConstants c{h.lr, h.momentum, h.weight_decay, h.grad_scale, h.first_step};
  const int oc = out_code(out, pt);
  switch (gt) {
    case DType::f32: sgd_out<kF32>(master, buf, grad, out, oc, n, c, s); break;
    case DType::bf16: sgd_out<kBF16>(master, buf, grad, out, oc, n, c, s); break;
    case DType::f16: sgd_out<kF16>(master, buf, grad, out, oc, n, c, s); break;
  }
  ZERO_CUDA_CHECK(cudaGetLastError());
}

}  // namespace zero::cuda
