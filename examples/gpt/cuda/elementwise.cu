// Element-wise kernels (residual add, GELU and its backward), the deterministic bias gradient,
// and the loss means that stay on the device until the step ends.
//
// The element-wise maps split the n elements into 8-wide chunks, one per thread in a
// grid-stride loop: a whole chunk is one 16-byte access when every pointer is 16-byte aligned,
// and the last partial chunk (or every chunk, for a misaligned pointer) goes element by element.
// Each thread reads its elements before it writes them, so an output may alias an input.
//
// The bias gradient is a column sum over N rows and must not depend on scheduling: fixed row
// blocks (gpt_math.cuh's column_reduce_*) write fp32 partial column sums to scratch, then one
// ordered pass adds them into the bf16 gradient, as for LayerNorm's dw and db.
#include <string>

#include "gpt/cuda/bf16_io.cuh"
#include "gpt/cuda/gpt_kernels.hpp"
#include "gpt/cuda/gpt_math.cuh"
#include "zero/error.hpp"

namespace zero::gpt::cuda {

namespace {

using detail::aligned16;
using detail::ceil_div;
using detail::load_bf16;
using detail::store_bf16;

constexpr int kThreads = 256;
constexpr int kChunk = 8;
using detail::kColumnThreads;
using detail::kScratchAlign;

struct Add {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct Gelu {
  __device__ float operator()(float x, float) const { return math::gelu(x); }
};
// (inp, dout) -> dout * GELU'(inp)
struct GeluBackward {
  __device__ float operator()(float x, float dy) const { return dy * math::gelu_grad(x); }
};

// out[i] = f(x[i], y[i]); y may be null (then f's second argument is 0).
template <bool VEC, class F>
__global__ void map_kernel(bf16* out, const bf16* x, const bf16* y, std::size_t n, F f) {
  const std::size_t chunks = (n + kChunk - 1) / kChunk;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < chunks;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t e0 = i * kChunk;
    if (VEC && e0 + kChunk <= n) {
      float xv[kChunk], yv[kChunk];
      load_bf16<kChunk>(x + e0, xv);
      if (y) {
        load_bf16<kChunk>(y + e0, yv);
      } else {
#pragma unroll
        for (int k = 0; k < kChunk; ++k) yv[k] = 0.0f;
      }
#pragma unroll
      for (int k = 0; k < kChunk; ++k) xv[k] = f(xv[k], yv[k]);
      store_bf16<kChunk>(out + e0, xv);
    } else {
      const std::size_t e1 = e0 + kChunk < n ? e0 + kChunk : n;
      for (std::size_t e = e0; e < e1; ++e) {
        const float xe = __bfloat162float(x[e]);
        const float ye = y ? __bfloat162float(y[e]) : 0.0f;
        out[e] = __float2bfloat16_rn(f(xe, ye));
      }
    }
  }
}

template <class F>
void launch_map(const char* op, bf16* out, const bf16* x, const bf16* y, std::size_t n, F f, cudaStream_t stream) {
  if (n == 0) return;
  const std::size_t chunks = (n + kChunk - 1) / kChunk;
  const std::size_t blocks = (chunks + kThreads - 1) / kThreads;
  // A grid-stride loop: more blocks than this only add scheduling work.
  const auto grid = static_cast<unsigned>(blocks < (1u << 20) ? blocks : (1u << 20));
  const bool vec = aligned16(out) && aligned16(x) && (y == nullptr || aligned16(y));
  if (vec) {
    map_kernel<true><<<grid, kThreads, 0, stream>>>(out, x, y, n, f);
  } else {
    map_kernel<false><<<grid, kThreads, 0, stream>>>(out, x, y, n, f);
  }
  GPT_LAUNCH_CHECK(op);
}

// Block (x, g): columns x*kColumnThreads + thread, rows of row block g in order; the column
// sums go to row g of partial [G, OC].
__global__ void bias_backward_partials_kernel(float* partial, const bf16* dout, int N, int OC, int rows_per_block) {
  const int c = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (c >= OC) return;
  const int g = static_cast<int>(blockIdx.y);
  const int r0 = g * rows_per_block;
  const int r1 = r0 + rows_per_block < N ? r0 + rows_per_block : N;
  float acc = 0.0f;
  for (int r = r0; r < r1; ++r) acc += __bfloat162float(dout[static_cast<std::size_t>(r) * OC + c]);
  partial[static_cast<std::size_t>(g) * OC + c] = acc;
}

// One block: thread t sums values t, t + blockDim, ... in double, then a tree over the block in
// a fixed order; the mean is added to *total. The same bits on every run.
constexpr int kSumThreads = 256;
__global__ void add_mean_kernel(double* total, const float* values, int n) {
  __shared__ double part[kSumThreads];
  double acc = 0.0;
  for (int i = static_cast<int>(threadIdx.x); i < n; i += kSumThreads) acc += values[i];
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int half = kSumThreads / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.x) < half) part[threadIdx.x] += part[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) *total += part[0] / n;
}

__global__ void widen_kernel(float* out, const bf16* in, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    out[i] = __bfloat162float(in[i]);
}
__global__ void round_kernel(bf16* out, const float* in, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16_rn(in[i]);
}
unsigned convert_grid(std::size_t n) {
  const std::size_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < (1u << 16) ? blocks : (1u << 16));
}

void check_bias_shape(const char* op, int N, int OC) {
  ZERO_CHECK(N >= 1 && OC >= 1, std::string(op) + ": unsupported shape N=" + std::to_string(N) +
                                    ", OC=" + std::to_string(OC) + " (N and OC must be at least 1)");
}

}  // namespace

void residual_forward(bf16* out, const bf16* a, const bf16* b, std::size_t n, cudaStream_t stream) {
  launch_map("residual_forward", out, a, b, n, Add{}, stream);
}

void widen_to_f32(float* out, const bf16* in, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  widen_kernel<<<convert_grid(n), kThreads, 0, stream>>>(out, in, n);
  GPT_LAUNCH_CHECK("widen_to_f32");
}

void round_to_bf16(bf16* out, const float* in, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  round_kernel<<<convert_grid(n), kThreads, 0, stream>>>(out, in, n);
  GPT_LAUNCH_CHECK("round_to_bf16");
}

void add_mean(double* total, const float* values, int n, cudaStream_t stream) {
  ZERO_CHECK(n >= 0 && total != nullptr && (n == 0 || values != nullptr),
             "add_mean: needs a total and n >= 0 values (got n=" + std::to_string(n) + ")");
  if (n == 0) return;
  add_mean_kernel<<<1, kSumThreads, 0, stream>>>(total, values, n);
  GPT_LAUNCH_CHECK("add_mean");
}

void gelu_forward(bf16* out, const bf16* inp, std::size_t n, cudaStream_t stream) {
  launch_map("gelu_forward", out, inp, nullptr, n, Gelu{}, stream);
}

void gelu_backward_inplace(bf16* dinp, const bf16* inp, const bf16* dout, std::size_t n, cudaStream_t stream) {
  launch_map("gelu_backward_inplace", dinp, inp, dout, n, GeluBackward{}, stream);
}

std::size_t bias_backward_scratch_bytes(int N, int OC) {
  check_bias_shape("bias_backward_scratch_bytes", N, OC);
  return kScratchAlign + detail::column_partial_bytes(N, OC);
}

void bias_backward(bf16* dbias, const bf16* dout, int N, int OC, void* scratch, std::size_t scratch_bytes,
                   cudaStream_t stream) {
  check_bias_shape("bias_backward", N, OC);
  const std::size_t need = bias_backward_scratch_bytes(N, OC);
  detail::check_scratch("bias_backward", scratch, scratch_bytes, need,
                        "N=" + std::to_string(N) + ", OC=" + std::to_string(OC));
  auto* partial = reinterpret_cast<float*>(detail::scratch_base(scratch));
  const int rows = math::column_reduce_rows_per_block(N);
  const int blocks = math::column_reduce_blocks(N);
  const dim3 grid(ceil_div(static_cast<std::size_t>(OC), kColumnThreads), static_cast<unsigned>(blocks));
  bias_backward_partials_kernel<<<grid, kColumnThreads, 0, stream>>>(partial, dout, N, OC, rows);
  GPT_LAUNCH_CHECK("bias_backward (partials)");
  detail::add_column_partials(dbias, partial, blocks, OC, stream);
  GPT_LAUNCH_CHECK("bias_backward (sum)");
}

}  // namespace zero::gpt::cuda
