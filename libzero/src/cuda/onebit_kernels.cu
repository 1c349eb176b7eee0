// 1-bit Adam and 1-bit LAMB on the device (optim/onebit_exchange.cpp, onebit_adam.cpp,
// onebit_lamb.cpp): offload/src/host_onebit.cpp's arithmetic, its separate operations as
// round-to-nearest intrinsics, so every element-wise result equals the host's bit for bit.
//
// A chunk's scale is the RMS of its values with the host's definition (the squares summed in
// double, divided by the count, square-rooted in double, rounded once to fp32), the sum taken by
// one block per chunk in a fixed order (block_sum2's tree) where the host sums sequentially: the
// same value up to the double sum's rounding, which the rounding to fp32 almost always hides.
// The signs, bits and errors then follow from the scale exactly as the host's do.
#include "cuda/cuda_check.hpp"
#include "cuda/device_math.cuh"
#include "cuda/kernels.hpp"

namespace zero::cuda {

namespace {

using namespace dev;

// The real (not padding) values of chunk c: the first numel of count x chunk are.
__device__ __forceinline__ std::size_t chunk_len(std::size_t c, std::size_t chunk, std::size_t numel) {
  const std::size_t b = c * chunk;
  return b >= numel ? 0 : (numel - b < chunk ? numel - b : chunk);
}

__device__ __forceinline__ float sign_of(const std::uint8_t* bits, std::size_t i) {
  return (bits[i >> 3] >> (i & 7)) & 1u ? 1.0f : -1.0f;
}

// x = b1 shared + (1 - b1) (g grad_scale), plus x's previous value when add_error.
template <int G>
__global__ void worker_kernel(float* __restrict__ x, const float* __restrict__ shared, const void* __restrict__ grad,
                              std::size_t n, float b1, float one_minus_b1, float grad_scale, bool add_error) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    const float m =
        __fadd_rn(__fmul_rn(b1, shared[i]), __fmul_rn(one_minus_b1, __fmul_rn(load<G>(grad, i), grad_scale)));
    x[i] = add_error ? __fadd_rn(m, x[i]) : m;
  }
}

// The second half of onebit_compress for one chunk, by the whole block once every thread has
// the chunk's sum of squares ss: the scale into *scale_out, bit i of byte i / 8 set where
// x_i >= 0, x_i - (+-scale) left in x; all `bytes` bytes of the chunk's bits are written (those
// past n zero, as the host's zero-filled buffers hold them).
__device__ void sign_and_error(float* __restrict__ x, std::size_t n, std::size_t bytes, double ss,
                               std::uint8_t* __restrict__ bits, float* __restrict__ scale_out) {
  const float scale = n == 0 ? 0.0f : __double2float_rn(__dsqrt_rn(__ddiv_rn(ss, static_cast<double>(n))));
  for (std::size_t j = threadIdx.x; j < bytes; j += blockDim.x) {
    unsigned byte = 0;
    for (unsigned b = 0; b < 8; ++b) {
      const std::size_t i = 8 * j + b;
      if (i >= n) break;
      const float xi = x[i];
      const bool up = xi >= 0.0f;
      byte |= (up ? 1u : 0u) << b;
      x[i] = __fsub_rn(xi, up ? scale : -scale);
    }
    bits[j] = static_cast<std::uint8_t>(byte);
  }
  if (threadIdx.x == 0) *scale_out = scale;
}

// One block per chunk: onebit_compress of chunk blockIdx.x.
__global__ void compress_kernel(float* __restrict__ x, std::size_t chunk, std::size_t numel,
                                std::uint8_t* __restrict__ bits, std::size_t bits_stride, float* __restrict__ scales,
                                std::size_t scale_stride) {
  const std::size_t c = blockIdx.x, n = chunk_len(c, chunk, numel);
  float* xc = x + c * chunk;
  double ss = 0.0, unused = 0.0;
  for (std::size_t i = threadIdx.x; i < n; i += blockDim.x) {
    const double v = xc[i];
    ss = __dadd_rn(ss, __dmul_rn(v, v));
  }
  block_sum2(ss, unused);
  sign_and_error(xc, n, (chunk + 7) / 8, ss, bits + c * bits_stride, scales + c * scale_stride);
}

// One block: onebit_server's average of the workers' messages (in worker order) into the error,
// then its compression.
__global__ void server_kernel(const std::uint8_t* __restrict__ worker_bits, std::size_t stride,
                              const float* __restrict__ worker_scales, std::size_t scale_stride, int workers,
                              float* __restrict__ error, std::size_t n, std::size_t bytes,
                              std::uint8_t* __restrict__ bits, float* __restrict__ scale) {
  const float inv = __fdiv_rn(1.0f, static_cast<float>(workers));
  double ss = 0.0, unused = 0.0;
  for (std::size_t i = threadIdx.x; i < n; i += blockDim.x) {
    float sum = 0.0f;
    for (int w = 0; w < workers; ++w) {
      const std::size_t wz = static_cast<std::size_t>(w);
      sum = __fadd_rn(sum, __fmul_rn(worker_scales[wz * scale_stride], sign_of(worker_bits + wz * stride, i)));
    }
    const float e = __fadd_rn(__fmul_rn(sum, inv), error[i]);
    error[i] = e;
    const double v = e;
    ss = __dadd_rn(ss, __dmul_rn(v, v));
  }
  block_sum2(ss, unused);  // its barrier also orders the error writes before sign_and_error's reads
  sign_and_error(error, n, bytes, ss, bits, scale);
}

// out's chunk c = scale_c x sign_i over its real values, 0 over its padding.
__global__ void decode_kernel(const std::uint8_t* __restrict__ bits, std::size_t bits_stride,
                              const float* __restrict__ scales, std::size_t scale_stride, std::size_t chunk,
                              std::size_t numel, std::size_t total, float* __restrict__ out) {
  for (std::size_t k = first_index(); k < total; k += grid_stride()) {
    const std::size_t c = k / chunk, i = k - c * chunk;
    out[k] =
        i < chunk_len(c, chunk, numel) ? __fmul_rn(scales[c * scale_stride], sign_of(bits + c * bits_stride, i)) : 0.0f;
  }
}

__global__ void scale_kernel(float* __restrict__ x, std::size_t n, float c) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) x[i] = __fmul_rn(x[i], c);
}

// onebit_adam_apply: m = m_new; p = p decay + neg_lr m / (sqrt(v) + eps).
template <int O>
__global__ void adam_apply_kernel(float* __restrict__ master, float* __restrict__ m, const float* __restrict__ v,
                                  const float* __restrict__ m_new, void* __restrict__ out, std::size_t n, float decay,
                                  float neg_lr, float eps) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    const float mi = m_new[i];
    const float denom = __fmaf_rn(__fsqrt_rn(v[i]), 1.0f, eps);
    const float p = __fmaf_rn(neg_lr, __fdiv_rn(mi, denom), __fmul_rn(master[i], decay));
    m[i] = mi;
    master[i] = p;
    store<O>(out, i, p);
  }
}

// onebit_lamb_moments' element-wise part, with per block the partial sums of u^2 and prelim^2,
// and the largest ratio raised into *ratio_max (a max is exact in any order: non-negative
// doubles order as their bits, so an integer atomicMax keeps it; NaN ratios are skipped, as the
// host's std::max skips them).
__global__ void lamb_moments_kernel(const float* __restrict__ master, float* __restrict__ m,
                                    const float* __restrict__ v, float* __restrict__ v_fresh,
                                    const float* __restrict__ m_new, std::size_t n, offload::OneBitLambConstants c,
                                    double* __restrict__ partials, double* __restrict__ ratio_max) {
  double us = 0.0, ps = 0.0, worst = 0.0;
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    const float mi = __fdiv_rn(m_new[i], c.scaling_coeff);
    const float r = __fmul_rn(__fsub_rn(mi, __fmul_rn(m[i], c.beta1)), c.inv_one_minus_beta1);
    const float vf = __fadd_rn(__fmul_rn(c.beta2, v_fresh[i]), __fmul_rn(__fmul_rn(c.one_minus_beta2, r), r));
    const float denom = __fadd_rn(__fsqrt_rn(v[i]), c.eps);
    const float prelim = __fdiv_rn(mi, denom);
    const float u = __fadd_rn(prelim, __fmul_rn(c.weight_decay, master[i]));
    m[i] = mi;
    v_fresh[i] = vf;
    const double ud = u, pd = prelim;
    us = __dadd_rn(us, __dmul_rn(ud, ud));
    ps = __dadd_rn(ps, __dmul_rn(pd, pd));
    const double ratio = __ddiv_rn(static_cast<double>(denom),
                                   __dadd_rn(static_cast<double>(__fsqrt_rn(vf)), static_cast<double>(c.eps)));
    if (worst < ratio) worst = ratio;
  }
  block_partials2(us, ps, partials);
  for (int d = 16; d > 0; d /= 2) worst = fmax(worst, __shfl_down_sync(0xffffffffu, worst, d));
  if ((threadIdx.x & 31u) == 0 && worst > 0.0)
    atomicMax(reinterpret_cast<unsigned long long*>(ratio_max),
              static_cast<unsigned long long>(__double_as_longlong(worst)));
}

template <int G>
void worker_launch(float* x, const float* shared, const void* grad, std::size_t n, float b1, float one_minus_b1,
                   float grad_scale, bool add_error, cudaStream_t s) {
  worker_kernel<G><<<blocks_for(n), kThreads, 0, s>>>(x, shared, grad, n, b1, one_minus_b1, grad_scale, add_error);
}

}  // namespace

void launch_onebit_worker(float* x, const float* shared, const void* grad, DType gt, std::size_t n, float b1,
                          float one_minus_b1, float grad_scale, bool add_error, cudaStream_t s) {
  if (n == 0) return;
  switch (gt) {
    case DType::f32: worker_launch<kF32>(x, shared, grad, n, b1, one_minus_b1, grad_scale, add_error, s); break;
    case DType::bf16: worker_launch<kBF16>(x, shared, grad, n, b1, one_minus_b1, grad_scale, add_error, s); break;
    case DType::f16: worker_launch<kF16>(x, shared, grad, n, b1, one_minus_b1, grad_scale, add_error, s); break;
  }
  ZERO_CUDA_CHECK(cudaGetLastError());
}

void launch_onebit_compress(float* x, std::size_t chunk, std::size_t numel, std::size_t count, std::uint8_t* bits,
                            std::size_t bits_stride, float* scales, std::size_t scale_stride, cudaStream_t s) {
  if (count == 0) return;
  compress_kernel<<<static_cast<unsigned>(count), kThreads, 0, s>>>(x, chunk, numel, bits, bits_stride, scales,
                                                                    scale_stride);
  ZERO_CUDA_CHECK(cudaGetLastError());
}

void launch_onebit_server(const std::uint8_t* worker_bits, std::size_t stride, const float* worker_scales,
                          std::size_t scale_stride, int workers, float* error, std::size_t n, std::size_t chunk,
                          std::uint8_t* bits, float* scale, cudaStream_t s) {
  server_kernel<<<1, kThreads, 0, s>>>(worker_bits, stride, worker_scales, scale_stride, workers, error, n,
                                       (chunk + 7) / 8, bits, scale);
  ZERO_CUDA_CHECK(cudaGetLastError());
}

void launch_onebit_decode(const std::uint8_t* bits, std::size_t bits_stride, const float* scales,
                          std::size_t scale_stride, std::size_t chunk, std::size_t numel, std::size_t count, float* out,
                          cudaStream_t s) {
  const std::size_t total = chunk * count;
  if (total == 0) return;
  decode_kernel<<<blocks_for(total), kThreads, 0, s>>>(bits, bits_stride, scales, scale_stride, chunk, numel, total,
                                                       out);
  ZERO_CUDA_CHECK(cudaGetLastError());
}

void launch_onebit_scale(float* x, std::size_t n, float c, cudaStream_t s) {
  if (n == 0) return;
  scale_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, n, c);
  ZERO_CUDA_CHECK(cudaGetLastError());
}

void launch_onebit_adam_apply(float* master, float* m, const float* v, const float* m_new, void* out, DType pt,
                              std::size_t n, float decay, float neg_lr, float eps, cudaStream_t s) {
  if (n == 0) return;
  const unsigned b = blocks_for(n);
  switch (out ? static_cast<int>(pt) : kNone) {
    case kF32: adam_apply_kernel<kF32><<<b, kThreads, 0, s>>>(master, m, v, m_new, out, n, decay, neg_lr, eps); break;
    case kBF16: adam_apply_kernel<kBF16><<<b, kThreads, 0, s>>>(master, m, v, m_new, out, n, decay, neg_lr, eps); break;
    case kF16: adam_apply_kernel<kF16><<<b, kThreads, 0, s>>>(master, m, v, m_new, out, n, decay, neg_lr, eps); break;
    default: adam_apply_kernel<kNone><<<b, kThreads, 0, s>>>(master, m, v, m_new, out, n, decay, neg_lr, eps); break;
  }
  ZERO_CUDA_CHECK(cudaGetLastError());
}

void launch_onebit_lamb_moments(const float* master, float* m, const float* v, float* v_fresh, const float* m_new,
                                std::size_t n, const offload::OneBitLambConstants& c, double* sums, double* scratch,
                                cudaStream_t s) {
  if (n == 0) return;
  const unsigned b = sum_blocks(n, kSumBlocks);
  lamb_moments_kernel<<<b, kThreads, 0, s>>>(master, m, v, v_fresh, m_new, n, c, scratch, sums + 2);
  ZERO_CUDA_CHECK(cudaGetLastError());
  launch_add_partials(scratch, b, true, sums, s);
}

}  // namespace zero::cuda
