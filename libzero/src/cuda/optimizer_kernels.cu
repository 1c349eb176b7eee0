// Fused Adam / AdamW and SGD over a flat shard (fp32 master and moments, any compute dtype for
// gradients and the parameter copy). Each line below is the host reference's line in
// offload/src/host_optimizer.cpp (adam_scalar, sgd_range) with its operations spelled as
// round-to-nearest intrinsics; see kernels.hpp for why that makes the results bitwise equal.
#include <algorithm>

#include "cuda/cuda_check.hpp"
#include "cuda/device_math.cuh"
#include "cuda/kernels.hpp"

namespace zero::cuda {

namespace {

using namespace dev;

// One element of Adam / AdamW: master p, moments m and v, the raw gradient g.
__device__ __forceinline__ void adam_one(float& p, float& m, float& v, float g, const AdamConstants& c) {
  g = __fmul_rn(g, c.grad_scale);
  if (c.l2) g = __fmaf_rn(c.weight_decay, p, g);
  if (c.decoupled) p = __fmul_rn(p, c.decay);
  const float mi = __fmaf_rn(c.beta1, m, __fmul_rn(c.one_minus_beta1, g));
  const float vi = __fmaf_rn(c.beta2, v, __fmul_rn(__fmul_rn(c.one_minus_beta2, g), g));
  const float denom = __fmaf_rn(__fsqrt_rn(vi), c.inv_sqrt_bias_c2, c.eps);
  p = __fmaf_rn(c.neg_step_size, __fdiv_rn(mi, denom), p);
  m = mi;
  v = vi;
}

// vec: four elements per access (every buffer aligned for it), then the scalar tail.
template <int G, int O>
__global__ void adam_kernel(float* __restrict__ master, float* __restrict__ m, float* __restrict__ v,
                            const void* __restrict__ grad, void* __restrict__ out, std::size_t n, AdamConstants c,
                            bool vec) {
  if (vec)
    for (std::size_t q = first_index(); q < n / 4; q += grid_stride()) {
      F4 p = load4<kF32>(master, q), mq = load4<kF32>(m, q), vq = load4<kF32>(v, q);
      const F4 g = load4<G>(grad, q);
#pragma unroll
      for (int k = 0; k < 4; ++k) adam_one(p.v[k], mq.v[k], vq.v[k], g.v[k], c);
      store4<kF32>(m, q, mq);
      store4<kF32>(v, q, vq);
      store4<kF32>(master, q, p);
      store4<O>(out, q, p);
    }
  for (std::size_t i = (vec ? n / 4 * 4 : 0) + first_index(); i < n; i += grid_stride()) {
    float p = master[i], mi = m[i], vi = v[i];
    adam_one(p, mi, vi, load<G>(grad, i), c);
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

// One element of SGD: master p, momentum buffer b (untouched without momentum), raw gradient g.
__device__ __forceinline__ void sgd_one(float& p, float& b, float g, const SgdConstants& c) {
  g = __fmul_rn(g, c.grad_scale);
  if (c.weight_decay != 0.0f) g = __fadd_rn(g, __fmul_rn(c.weight_decay, p));
  if (c.momentum != 0.0f) {
    b = c.first_step ? g : __fadd_rn(__fmul_rn(c.momentum, b), g);
    g = b;
  }
  p = __fsub_rn(p, __fmul_rn(c.lr, g));
}

template <int G, int O>
__global__ void sgd_kernel(float* __restrict__ master, float* __restrict__ buf, const void* __restrict__ grad,
                           void* __restrict__ out, std::size_t n, SgdConstants c, bool vec) {
  const bool momentum = c.momentum != 0.0f;
  if (vec)
    for (std::size_t q = first_index(); q < n / 4; q += grid_stride()) {
      F4 p = load4<kF32>(master, q), b{};
      if (momentum && !c.first_step) b = load4<kF32>(buf, q);
      const F4 g = load4<G>(grad, q);
#pragma unroll
      for (int k = 0; k < 4; ++k) sgd_one(p.v[k], b.v[k], g.v[k], c);
      if (momentum) store4<kF32>(buf, q, b);
      store4<kF32>(master, q, p);
      store4<O>(out, q, p);
    }
  for (std::size_t i = (vec ? n / 4 * 4 : 0) + first_index(); i < n; i += grid_stride()) {
    float p = master[i], b = 0.0f;
    if (momentum && !c.first_step) b = buf[i];
    sgd_one(p, b, load<G>(grad, i), c);
    if (momentum) buf[i] = b;
    master[i] = p;
    store<O>(out, i, p);
  }
}

int out_code(const void* out, DType t) { return out ? static_cast<int>(t) : kNone; }

// Whether every buffer of an update allows four-element accesses (null buffers do).
bool all_aligned4(const float* master, const float* a, const float* b, const void* grad, int gc, const void* out,
                  int oc) {
  const bool g = gc == kF32 ? aligned4<kF32>(grad) : aligned4<kBF16>(grad);
  const bool o = oc == kF32 ? aligned4<kF32>(out) : aligned4<kBF16>(out);
  return aligned4<kF32>(master) && aligned4<kF32>(a) && aligned4<kF32>(b) && g && o;
}

template <int G>
void adam_out(float* master, float* m, float* v, const void* grad, void* out, int oc, std::size_t n,
              const AdamConstants& c, cudaStream_t s) {
  const bool vec = all_aligned4(master, m, v, grad, G, out, oc);
  const unsigned b = blocks_for(n, vec);
  switch (oc) {
    case kF32: adam_kernel<G, kF32><<<b, kThreads, 0, s>>>(master, m, v, grad, out, n, c, vec); break;
    case kBF16: adam_kernel<G, kBF16><<<b, kThreads, 0, s>>>(master, m, v, grad, out, n, c, vec); break;
    case kF16: adam_kernel<G, kF16><<<b, kThreads, 0, s>>>(master, m, v, grad, out, n, c, vec); break;
    default: adam_kernel<G, kNone><<<b, kThreads, 0, s>>>(master, m, v, grad, out, n, c, vec); break;
  }
}

template <int G>
void sgd_out(float* master, float* buf, const void* grad, void* out, int oc, std::size_t n, const SgdConstants& c,
             cudaStream_t s) {
  const bool vec = all_aligned4(master, buf, nullptr, grad, G, out, oc);
  const unsigned b = blocks_for(n, vec);
  switch (oc) {
    case kF32: sgd_kernel<G, kF32><<<b, kThreads, 0, s>>>(master, buf, grad, out, n, c, vec); break;
    case kBF16: sgd_kernel<G, kBF16><<<b, kThreads, 0, s>>>(master, buf, grad, out, n, c, vec); break;
    case kF16: sgd_kernel<G, kF16><<<b, kThreads, 0, s>>>(master, buf, grad, out, n, c, vec); break;
    default: sgd_kernel<G, kNone><<<b, kThreads, 0, s>>>(master, buf, grad, out, n, c, vec); break;
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
