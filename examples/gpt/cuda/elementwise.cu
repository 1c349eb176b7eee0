// Element-wise kernels (residual add, GELU and its backward, SwiGLU and its backward, rotary
// positions), the deterministic bias gradient, and the loss means that stay on the device until
// the step ends.
//
// The element-wise maps split the n elements into 8-wide chunks, one per thread in a
// grid-stride loop: a whole chunk is one 16-byte access when every pointer is 16-byte aligned,
// and the last partial chunk (or every chunk, for a misaligned pointer) goes element by element.
// Each thread reads its elements before it writes them, so an output may alias an input.
//
// SwiGLU reads a row's gate and up halves at the same columns: one thread per 8-wide chunk of
// the output row (one element when F is not a multiple of 8 or a pointer is misaligned), and the
// backward's thread writes the gradients of exactly the gate and up elements it read, so dinp
// may alias inp. Rotary positions: one thread per (row, rotation pair i) computes the angle once
// in double (as the host does) and turns pair i of every q and k head of the row.
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

// SwiGLU over [N, F] outputs; VEC-wide chunks of each row.
template <int VEC>
__global__ void swiglu_forward_kernel(bf16* out, const bf16* inp, int F, std::size_t chunks) {
  const std::size_t per_row = static_cast<std::size_t>(F / VEC);
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < chunks;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t n = i / per_row, c = (i % per_row) * VEC;
    const bf16* gate = inp + n * 2 * static_cast<std::size_t>(F) + c;
    float g[VEC], u[VEC];
    load_bf16<VEC>(gate, g);
    load_bf16<VEC>(gate + F, u);
#pragma unroll
    for (int k = 0; k < VEC; ++k) g[k] = math::swiglu(g[k], u[k]);
    store_bf16<VEC>(out + n * F + c, g);
  }
}

template <int VEC>
__global__ void swiglu_backward_kernel(bf16* dinp, const bf16* dout, const bf16* inp, int F, std::size_t chunks) {
  const std::size_t per_row = static_cast<std::size_t>(F / VEC);
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < chunks;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t n = i / per_row, c = (i % per_row) * VEC;
    const std::size_t off = n * 2 * static_cast<std::size_t>(F) + c;
    float g[VEC], u[VEC], dy[VEC], dg[VEC], du[VEC];
    load_bf16<VEC>(inp + off, g);
    load_bf16<VEC>(inp + off + F, u);
    load_bf16<VEC>(dout + n * F + c, dy);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      dg[k] = math::swiglu_dgate(g[k], u[k], dy[k]);
      du[k] = math::swiglu_dup(g[k], dy[k]);
    }
    store_bf16<VEC>(dinp + off, dg);
    store_bf16<VEC>(dinp + off + F, du);
  }
}

// Thread (n, i): pair i of each of the row's `heads` q and k heads, at position n % T.
__global__ void rotary_kernel(bf16* qkv, int T, int heads, int hs, std::size_t ld, std::size_t pairs, double theta,
                              double sign) {
  const int half = hs / 2;
  for (std::size_t x = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; x < pairs;
       x += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t n = x / static_cast<std::size_t>(half);
    const int i = static_cast<int>(x % static_cast<std::size_t>(half));
    const int t = static_cast<int>(n % static_cast<std::size_t>(T));
    double sd = 0.0, cd = 1.0;
    sincos(t * pow(theta, -2.0 * i / hs), &sd, &cd);
    const float c = static_cast<float>(cd), s = static_cast<float>(sign * sd);
    bf16* row = qkv + n * ld + i;
    for (int h = 0; h < heads; ++h) {
      bf16* p = row + static_cast<std::size_t>(h) * hs;
      const float x1 = __bfloat162float(p[0]), x2 = __bfloat162float(p[half]);
      p[0] = __float2bfloat16_rn(x1 * c - x2 * s);
      p[half] = __float2bfloat16_rn(x2 * c + x1 * s);
    }
  }
}

unsigned stride_grid(std::size_t items) {
  const std::size_t blocks = (items + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < (1u << 20) ? (blocks > 0 ? blocks : 1) : (1u << 20));
}

void check_swiglu_shape(const char* op, int N, int F) {
  ZERO_CHECK(N >= 1 && F >= 1, std::string(op) + ": unsupported shape N=" + std::to_string(N) +
                                   ", F=" + std::to_string(F) + " (N and F must be at least 1)");
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

void swiglu_forward(bf16* out, const bf16* inp, int N, int F, cudaStream_t stream) {
  check_swiglu_shape("swiglu_forward", N, F);
  const std::size_t NF = static_cast<std::size_t>(N) * F;
  if (F % 8 == 0 && aligned16(out) && aligned16(inp)) {
    swiglu_forward_kernel<8><<<stride_grid(NF / 8), kThreads, 0, stream>>>(out, inp, F, NF / 8);
  } else {
    swiglu_forward_kernel<1><<<stride_grid(NF), kThreads, 0, stream>>>(out, inp, F, NF);
  }
  GPT_LAUNCH_CHECK("swiglu_forward");
}

void swiglu_backward(bf16* dinp, const bf16* dout, const bf16* inp, int N, int F, cudaStream_t stream) {
  check_swiglu_shape("swiglu_backward", N, F);
  const std::size_t NF = static_cast<std::size_t>(N) * F;
  if (F % 8 == 0 && aligned16(dinp) && aligned16(dout) && aligned16(inp)) {
    swiglu_backward_kernel<8><<<stride_grid(NF / 8), kThreads, 0, stream>>>(dinp, dout, inp, F, NF / 8);
  } else {
    swiglu_backward_kernel<1><<<stride_grid(NF), kThreads, 0, stream>>>(dinp, dout, inp, F, NF);
  }
  GPT_LAUNCH_CHECK("swiglu_backward");
}

void rotary(bf16* qkv, const AttentionShape& s, float theta, int sign, cudaStream_t stream) {
  ZERO_CHECK(s.B >= 1 && s.T >= 1 && s.NH >= 1 && s.NKV >= 1 && s.hs >= 2 && s.hs % 2 == 0 && theta > 0.0f &&
                 (sign == 1 || sign == -1),
             "rotary: unsupported shape B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) +
                 " NH=" + std::to_string(s.NH) + " NKV=" + std::to_string(s.NKV) + " hs=" + std::to_string(s.hs) +
                 " theta=" + std::to_string(theta) + " (an even head size and a positive theta are needed)");
  const std::size_t rows = static_cast<std::size_t>(s.B) * s.T;
  const std::size_t pairs = rows * static_cast<std::size_t>(s.hs / 2);
  rotary_kernel<<<stride_grid(pairs), kThreads, 0, stream>>>(qkv, s.T, s.NH + s.NKV, s.hs,
                                                             static_cast<std::size_t>(s.qkv_width()), pairs,
                                                             static_cast<double>(theta), static_cast<double>(sign));
  GPT_LAUNCH_CHECK(sign > 0 ? "rotary_forward" : "rotary_backward");
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
