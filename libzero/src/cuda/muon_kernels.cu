// Muon's element-wise parts (offload/src/host_muon.cpp's momentum and update, their operations
// as round-to-nearest intrinsics: bit for bit the host's) and the conversions around the
// Newton-Schulz products of cuda/newton_schulz.cpp: the Frobenius norm (a fixed-order sum, so
// the same matrix always gives the same bits), the scaling into bf16 and the way back.
#include <algorithm>

#include "cuda/cuda_check.hpp"
#include "cuda/device_math.cuh"
#include "cuda/kernels.hpp"

namespace zero::cuda {

namespace {

using namespace dev;

// buf = momentum buf + g; x = nesterov ? g + momentum buf : buf.
template <int G>
__global__ void momentum_kernel(float* __restrict__ buf, const void* __restrict__ grad, std::size_t n, float grad_scale,
                                float momentum, bool nesterov, float* __restrict__ x) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    const float g = __fmul_rn(load<G>(grad, i), grad_scale);
    const float m = __fadd_rn(__fmul_rn(momentum, buf[i]), g);
    buf[i] = m;
    x[i] = nesterov ? __fadd_rn(g, __fmul_rn(momentum, m)) : m;
  }
}

// p = p decay - step o.
template <int O>
__global__ void apply_kernel(float* __restrict__ master, const float* __restrict__ o, void* __restrict__ out,
                             std::size_t n, float decay, float step) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    const float p = __fsub_rn(__fmul_rn(master[i], decay), __fmul_rn(step, o[i]));
    master[i] = p;
    store<O>(out, i, p);
  }
}

// One thread: inv = 1 / max(sqrt(sum), 1e-7), in double and rounded once (the host's).
__global__ void inverse_norm_kernel(const double* __restrict__ sum, float* __restrict__ inv) {
  *inv = static_cast<float>(1.0 / fmax(sqrt(*sum), 1e-7));
}

// X[o] for o over the [r, k] result (r <= k): x's element scaled, transposed when x is tall.
__global__ void load_kernel(const float* __restrict__ x, std::int64_t rows, std::int64_t cols, bool tall,
                            std::uint16_t* __restrict__ X, const float* __restrict__ inv) {
  const std::size_t n = static_cast<std::size_t>(rows * cols);
  const float s = *inv;
  for (std::size_t o = first_index(); o < n; o += grid_stride()) {
    std::size_t from = o;
    if (tall) {  // X is [cols, rows]: X[j, i] = x[i, j]
      const std::size_t j = o / static_cast<std::size_t>(rows), i = o - j * static_cast<std::size_t>(rows);
      from = i * static_cast<std::size_t>(cols) + j;
    }
    X[o] = f32_to_bf16(__fmul_rn(x[from], s));
  }
}

// x's element e from X, transposed back when x is tall.
__global__ void store_kernel(const std::uint16_t* __restrict__ X, std::int64_t rows, std::int64_t cols, bool tall,
                             float* __restrict__ x) {
  const std::size_t n = static_cast<std::size_t>(rows * cols);
  for (std::size_t e = first_index(); e < n; e += grid_stride()) {
    std::size_t from = e;
    if (tall) {  // x[i, j] = X[j, i], X being [cols, rows]
      const std::size_t i = e / static_cast<std::size_t>(cols), j = e - i * static_cast<std::size_t>(cols);
      from = j * static_cast<std::size_t>(rows) + i;
    }
    x[e] = bf16_to_f32(X[from]);
  }
}

}  // namespace

void launch_muon_momentum(float* buf, const void* grad, DType gt, std::size_t n, float grad_scale, float momentum,
                          bool nesterov, float* x, cudaStream_t s) {
  if (n == 0) return;
  const unsigned b = blocks_for(n);
  switch (gt) {
    case DType::f32:
      momentum_kernel<kF32><<<b, kThreads, 0, s>>>(buf, grad, n, grad_scale, momentum, nesterov, x);
      break;
    case DType::bf16:
      momentum_kernel<kBF16><<<b, kThreads, 0, s>>>(buf, grad, n, grad_scale, momentum, nesterov, x);
      break;
    case DType::f16:
      momentum_kernel<kF16><<<b, kThreads, 0, s>>>(buf, grad, n, grad_scale, momentum, nesterov, x);
      break;
  }
  ZERO_CUDA_CHECK(cudaGetLastError());
}

void launch_muon_apply(float* master, const float* o, void* out, DType pt, std::size_t n, float decay, float step,
                       cudaStream_t s) {
  if (n == 0) return;
  const unsigned b = blocks_for(n);
  switch (out ? static_cast<int>(pt) : kNone) {
    case kF32: apply_kernel<kF32><<<b, kThreads, 0, s>>>(master, o, out, n, decay, step); break;
    case kBF16: apply_kernel<kBF16><<<b, kThreads, 0, s>>>(master, o, out, n, decay, step); break;
    case kF16: apply_kernel<kF16><<<b, kThreads, 0, s>>>(master, o, out, n, decay, step); break;
    default: apply_kernel<kNone><<<b, kThreads, 0, s>>>(master, o, out, n, decay, step); break;
  }
  ZERO_CUDA_CHECK(cudaGetLastError());
}

void launch_ns_load(const float* x, std::int64_t rows, std::int64_t cols, std::uint16_t* X, float* inv, double* scratch,
                    cudaStream_t s) {
  const std::size_t n = static_cast<std::size_t>(rows * cols);
  double* total = scratch + 2 * kSumBlocks;  // after the block partials
  ZERO_CUDA_CHECK(cudaMemsetAsync(total, 0, sizeof(double), s));
  launch_add_sumsq(x, n, total, scratch, s);
  inverse_norm_kernel<<<1, 1, 0, s>>>(total, inv);
  load_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, rows, cols, rows > cols, X, inv);
  ZERO_CUDA_CHECK(cudaGetLastError());
}

void launch_ns_store(const std::uint16_t* X, std::int64_t rows, std::int64_t cols, float* x, cudaStream_t s) {
  const std::size_t n = static_cast<std::size_t>(rows * cols);
  store_kernel<<<blocks_for(n), kThreads, 0, s>>>(X, rows, cols, rows > cols, x);
  ZERO_CUDA_CHECK(cudaGetLastError());
}

}  // namespace zero::cuda
