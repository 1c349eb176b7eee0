// Fused Adam / AdamW, SGD, Lion and LAMB over a flat shard (fp32 master and moments, any compute
// dtype for gradients and the parameter copy). Each line below is the host reference's line in
// offload/src (host_adam.cpp's adam_scalar, host_sgd.cpp, host_lion.cpp, host_lamb.cpp, built
// with -ffp-contract=off) with its operations spelled as round-to-nearest intrinsics; see
// kernels.hpp for why that makes the element-wise results bitwise equal.
//
// LAMB's sums of p^2 and u^2 are the one place the device does not repeat the host: the host
// folds them sequentially in eight lanes, which a GPU cannot do at speed. Here each square is
// exact in double (a float has 24 significant bits) and the run's squares are added in a fixed
// order: a grid fixed by n, each thread a grid-stride sequential sum, a shared-memory tree per
// block, then one block adding the block partials in index order. The same run gives the same
// bits every time; the value differs from the host's only in the rounding of the double sums.
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

// Lion and LAMB.

namespace {

using namespace dev;

// One element of Lion: master p, momentum m, raw gradient g (host_lion.cpp's loop body).
__device__ __forceinline__ void lion_one(float& p, float& m, float g, const offload::LionConstants& c) {
  g = __fmul_rn(g, c.grad_scale);
  const float u = __fadd_rn(__fmul_rn(c.beta1, m), __fmul_rn(c.one_minus_beta1, g));
  const float sign = u > 0.0f ? 1.0f : (u < 0.0f ? -1.0f : 0.0f);
  p = __fsub_rn(__fmul_rn(p, c.decay), __fmul_rn(c.lr, sign));
  m = __fadd_rn(__fmul_rn(c.beta2, m), __fmul_rn(c.one_minus_beta2, g));
}

template <int G, int O>
__global__ void lion_kernel(float* __restrict__ master, float* __restrict__ m, const void* __restrict__ grad,
                            void* __restrict__ out, std::size_t n, offload::LionConstants c, bool vec) {
  if (vec)
    for (std::size_t q = first_index(); q < n / 4; q += grid_stride()) {
      F4 p = load4<kF32>(master, q), mq = load4<kF32>(m, q);
      const F4 g = load4<G>(grad, q);
#pragma unroll
      for (int k = 0; k < 4; ++k) lion_one(p.v[k], mq.v[k], g.v[k], c);
      store4<kF32>(m, q, mq);
      store4<kF32>(master, q, p);
      store4<O>(out, q, p);
    }
  for (std::size_t i = (vec ? n / 4 * 4 : 0) + first_index(); i < n; i += grid_stride()) {
    float p = master[i], mi = m[i];
    lion_one(p, mi, load<G>(grad, i), c);
    m[i] = mi;
    master[i] = p;
    store<O>(out, i, p);
  }
}

// host_lamb.cpp's lamb_direction: the one expression of the update both passes use.
__device__ __forceinline__ float lamb_direction(float m, float v, float p, const offload::LambConstants& c) {
  const float denom = __fadd_rn(__fsqrt_rn(__fmul_rn(v, c.inv_bias_c2)), c.eps);
  return __fadd_rn(__fdiv_rn(__fmul_rn(m, c.inv_bias_c1), denom), __fmul_rn(c.weight_decay, p));
}

// LAMB's first pass (host lamb_moments): m and v, and per block the partial sums of p^2 and
// u^2 into partials[2 block], partials[2 block + 1].
template <int G>
__global__ void lamb_moments_kernel(const float* __restrict__ master, float* __restrict__ m, float* __restrict__ v,
                                    const void* __restrict__ grad, std::size_t n, offload::LambConstants c,
                                    double* __restrict__ partials) {
  double ps = 0.0, us = 0.0;
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    const float g = __fmul_rn(load<G>(grad, i), c.grad_scale);
    const float mi = __fadd_rn(__fmul_rn(c.beta1, m[i]), __fmul_rn(c.one_minus_beta1, g));
    const float vi = __fadd_rn(__fmul_rn(c.beta2, v[i]), __fmul_rn(__fmul_rn(c.one_minus_beta2, g), g));
    m[i] = mi;
    v[i] = vi;
    const double p = master[i], u = lamb_direction(mi, vi, master[i], c);
    ps = __dadd_rn(ps, __dmul_rn(p, p));
    us = __dadd_rn(us, __dmul_rn(u, u));
  }
  block_partials2(ps, us, partials);
}

// Per block the partial sum of x^2 (the pair's second value 0).
__global__ void sumsq_partials_kernel(const float* __restrict__ x, std::size_t n, double* __restrict__ partials) {
  double s = 0.0;
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    const double v = x[i];
    s = __dadd_rn(s, __dmul_rn(v, v));
  }
  block_partials2(s, 0.0, partials);
}

// One block: sums[0] += the first values of the partial pairs, sums[1] += the second (when
// `two`), each in a fixed order.
__global__ void add_partials_kernel(const double* __restrict__ partials, unsigned blocks, bool two,
                                    double* __restrict__ sums) {
  double ps = 0.0, us = 0.0;
  for (unsigned b = threadIdx.x; b < blocks; b += blockDim.x) {
    ps = __dadd_rn(ps, partials[2 * b]);
    us = __dadd_rn(us, partials[2 * b + 1]);
  }
  block_sum2(ps, us);
  if (threadIdx.x == 0) {
    sums[0] = __dadd_rn(sums[0], ps);
    if (two) sums[1] = __dadd_rn(sums[1], us);
  }
}

// LAMB's second pass (host lamb_apply): p -= step * u, u recomputed from m, v and p.
template <int O>
__global__ void lamb_apply_kernel(float* __restrict__ master, const float* __restrict__ m, const float* __restrict__ v,
                                  void* __restrict__ out, std::size_t n, offload::LambConstants c, float step) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    const float p0 = master[i];
    const float p = __fsub_rn(p0, __fmul_rn(step, lamb_direction(m[i], v[i], p0, c)));
    master[i] = p;
    store<O>(out, i, p);
  }
}

template <int G>
void lion_out(float* master, float* m, const void* grad, void* out, int oc, std::size_t n,
              const offload::LionConstants& c, cudaStream_t s) {
  const bool vec = all_aligned4(master, m, nullptr, grad, G, out, oc);
  const unsigned b = blocks_for(n, vec);
  switch (oc) {
    case kF32: lion_kernel<G, kF32><<<b, kThreads, 0, s>>>(master, m, grad, out, n, c, vec); break;
    case kBF16: lion_kernel<G, kBF16><<<b, kThreads, 0, s>>>(master, m, grad, out, n, c, vec); break;
    case kF16: lion_kernel<G, kF16><<<b, kThreads, 0, s>>>(master, m, grad, out, n, c, vec); break;
    default: lion_kernel<G, kNone><<<b, kThreads, 0, s>>>(master, m, grad, out, n, c, vec); break;
  }
}

}  // namespace

void launch_lion(float* master, float* m, const void* grad, DType gt, void* out, DType pt, std::size_t n,
                 const offload::LionConstants& c, cudaStream_t s) {
  if (n == 0) return;
  const int oc = out_code(out, pt);
  switch (gt) {
    case DType::f32: lion_out<kF32>(master, m, grad, out, oc, n, c, s); break;
    case DType::bf16: lion_out<kBF16>(master, m, grad, out, oc, n, c, s); break;
    case DType::f16: lion_out<kF16>(master, m, grad, out, oc, n, c, s); break;
  }
  ZERO_CUDA_CHECK(cudaGetLastError());
}

void launch_lamb_moments(const float* master, float* m, float* v, const void* grad, DType gt, std::size_t n,
                         const offload::LambConstants& c, double* sums, double* scratch, cudaStream_t s) {
  if (n == 0) return;
  const unsigned b = sum_blocks(n, kSumBlocks);
  switch (gt) {
    case DType::f32: lamb_moments_kernel<kF32><<<b, kThreads, 0, s>>>(master, m, v, grad, n, c, scratch); break;
    case DType::bf16: lamb_moments_kernel<kBF16><<<b, kThreads, 0, s>>>(master, m, v, grad, n, c, scratch); break;
    case DType::f16: lamb_moments_kernel<kF16><<<b, kThreads, 0, s>>>(master, m, v, grad, n, c, scratch); break;
  }
  ZERO_CUDA_CHECK(cudaGetLastError());
  launch_add_partials(scratch, b, true, sums, s);
}

void launch_add_partials(const double* partials, unsigned blocks, bool two, double* sums, cudaStream_t s) {
  add_partials_kernel<<<1, kThreads, 0, s>>>(partials, blocks, two, sums);
  ZERO_CUDA_CHECK(cudaGetLastError());
}

void launch_add_sumsq(const float* x, std::size_t n, double* sum, double* scratch, cudaStream_t s) {
  if (n == 0) return;
  const unsigned b = sum_blocks(n, kSumBlocks);
  sumsq_partials_kernel<<<b, kThreads, 0, s>>>(x, n, scratch);
  ZERO_CUDA_CHECK(cudaGetLastError());
  launch_add_partials(scratch, b, false, sum, s);
}

void launch_lamb_apply(float* master, const float* m, const float* v, void* out, DType pt, std::size_t n,
                       const offload::LambConstants& c, float step, cudaStream_t s) {
  if (n == 0) return;
  const unsigned b = blocks_for(n);
  switch (out_code(out, pt)) {
    case kF32: lamb_apply_kernel<kF32><<<b, kThreads, 0, s>>>(master, m, v, out, n, c, step); break;
    case kBF16: lamb_apply_kernel<kBF16><<<b, kThreads, 0, s>>>(master, m, v, out, n, c, step); break;
    case kF16: lamb_apply_kernel<kF16><<<b, kThreads, 0, s>>>(master, m, v, out, n, c, step); break;
    default: lamb_apply_kernel<kNone><<<b, kThreads, 0, s>>>(master, m, v, out, n, c, step); break;
  }
  ZERO_CUDA_CHECK(cudaGetLastError());
}

}  // namespace zero::cuda
