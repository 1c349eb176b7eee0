// LayerNorm forward (plain and fused with the residual add) and a deterministic backward; the
// same for RMSNorm.
//
// Forward: one warp per row. Lane l owns the 8-wide chunks l, l+32, ... of the row (one element
// each when C is not a multiple of 8 or a pointer is not 16-byte aligned), so its loads are
// 16 bytes and a warp's are contiguous. Mean and variance are two passes in fp32 (the second
// re-reads the row, which is in L1), as host_kernels.cpp computes them. The fused form writes
// residual = bf16(a + b) first and normalises the rounded values it wrote: the same lane reads
// back only what it wrote itself, which is why residual may alias a or b.
//
// Backward: dinp is per row (a warp again: two row means, then one pass adding into dinp).
// dw and db are column sums over all N rows; atomics would make their rounding depend on the
// schedule, so rows are split into fixed blocks (gpt_math.cuh's column_reduce_*: a function of
// N only), each block writes its fp32 column partials to scratch, and one more kernel sums the
// partials in block order and adds the result to the bf16 gradients.
//
// RMSNorm (llama) is the same with no mean and no bias: the forward keeps rstd per row, the
// backward's dinp is one warp per row and its dw the same fixed-order column reduction.
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
using detail::warp_sum;

constexpr int kWarpsPerBlock = 8;
using detail::kColumnThreads;
using detail::kScratchAlign;

void check_shape(const char* op, int N, int C) {
  ZERO_CHECK(N >= 1 && C >= 1, std::string(op) + ": unsupported shape N=" + std::to_string(N) +
                                   ", C=" + std::to_string(C) + " (N and C must be at least 1)");
}

__device__ __forceinline__ float round_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

// RESIDUAL: the row is bf16(a + b), written to `residual` and then read back from there;
// otherwise the row is `a`. `b` is unused without RESIDUAL.
template <int VEC, bool RESIDUAL>
__global__ void layernorm_forward_kernel(bf16* residual, bf16* out, float* mean, float* rstd, const bf16* a,
                                         const bf16* b, const bf16* w, const bf16* bias, int N, int C) {
  const int row = static_cast<int>(blockIdx.x) * kWarpsPerBlock + static_cast<int>(threadIdx.x / 32);
  const int lane = static_cast<int>(threadIdx.x % 32);
  if (row >= N) return;
  const std::size_t off = static_cast<std::size_t>(row) * C;
  const bf16* x = RESIDUAL ? residual + off : a + off;

  float sum = 0.0f;
  for (int c = lane * VEC; c < C; c += 32 * VEC) {
    float v[VEC];
    if constexpr (RESIDUAL) {
      float v2[VEC];
      load_bf16<VEC>(a + off + c, v);
      load_bf16<VEC>(b + off + c, v2);
#pragma unroll
      for (int k = 0; k < VEC; ++k) v[k] = round_bf16(v[k] + v2[k]);
      store_bf16<VEC>(residual + off + c, v);
    } else {
      load_bf16<VEC>(x + c, v);
    }
#pragma unroll
    for (int k = 0; k < VEC; ++k) sum += v[k];
  }
  const float m = warp_sum(sum) / static_cast<float>(C);

  float sq = 0.0f;
  for (int c = lane * VEC; c < C; c += 32 * VEC) {
    float v[VEC];
    load_bf16<VEC>(x + c, v);
#pragma unroll
    for (int k = 0; k < VEC; ++k) sq += (v[k] - m) * (v[k] - m);
  }
  const float s = math::layernorm_rstd(warp_sum(sq) / static_cast<float>(C));

  for (int c = lane * VEC; c < C; c += 32 * VEC) {
    float v[VEC], wv[VEC], bv[VEC];
    load_bf16<VEC>(x + c, v);
    load_bf16<VEC>(w + c, wv);
    load_bf16<VEC>(bias + c, bv);
#pragma unroll
    for (int k = 0; k < VEC; ++k) v[k] = (v[k] - m) * s * wv[k] + bv[k];
    store_bf16<VEC>(out + off + c, v);
  }
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

// The second pass of a row's input gradient (LayerNorm, RMSNorm): lane's chunks of the row get
// dinp += f(dy, w, x) per element.
template <int VEC, class F>
__device__ __forceinline__ void add_to_dinp_row(bf16* dinp, const bf16* dout, const bf16* inp, const bf16* w, int C,
                                                int lane, F f) {
  for (int c = lane * VEC; c < C; c += 32 * VEC) {
    float dy[VEC], x[VEC], wv[VEC], g[VEC];
    load_bf16<VEC>(dout + c, dy);
    load_bf16<VEC>(inp + c, x);
    load_bf16<VEC>(w + c, wv);
    load_bf16<VEC>(dinp + c, g);
#pragma unroll
    for (int k = 0; k < VEC; ++k) g[k] += f(dy[k], wv[k], x[k]);
    store_bf16<VEC>(dinp + c, g);
  }
}

// dinp += rstd (dy w - mean(dy w) - xhat mean(dy w xhat)), one warp per row.
template <int VEC>
__global__ void layernorm_backward_dinp_kernel(bf16* dinp, const bf16* dout, const bf16* inp, const bf16* w,
                                               const float* mean, const float* rstd, int N, int C) {
  const int row = static_cast<int>(blockIdx.x) * kWarpsPerBlock + static_cast<int>(threadIdx.x / 32);
  const int lane = static_cast<int>(threadIdx.x % 32);
  if (row >= N) return;
  const std::size_t off = static_cast<std::size_t>(row) * C;
  const float m = mean[row], s = rstd[row];

  float sum_dn = 0.0f, sum_dn_xhat = 0.0f;
  for (int c = lane * VEC; c < C; c += 32 * VEC) {
    float dy[VEC], x[VEC], wv[VEC];
    load_bf16<VEC>(dout + off + c, dy);
    load_bf16<VEC>(inp + off + c, x);
    load_bf16<VEC>(w + c, wv);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const float dn = dy[k] * wv[k];
      sum_dn += dn;
      sum_dn_xhat += dn * ((x[k] - m) * s);
    }
  }
  const float mean_dn = warp_sum(sum_dn) / static_cast<float>(C);
  const float mean_dn_xhat = warp_sum(sum_dn_xhat) / static_cast<float>(C);

  add_to_dinp_row<VEC>(dinp + off, dout + off, inp + off, w, C, lane, [=](float dy, float wv, float x) {
    return math::layernorm_dinp(dy, wv, (x - m) * s, mean_dn, mean_dn_xhat, s);
  });
}

// Block (x, g): columns x*kColumnThreads + thread, rows of row block g in order. Writes the
// block's partial sums of dy * xhat (dw) and dy (db) to row g of each partial matrix [G, C].
__global__ void layernorm_backward_partials_kernel(float* part_dw, float* part_db, const bf16* dout, const bf16* inp,
                                                   const float* mean, const float* rstd, int N, int C,
                                                   int rows_per_block) {
  const int c = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (c >= C) return;
  const int g = static_cast<int>(blockIdx.y);
  const int r0 = g * rows_per_block;
  const int r1 = r0 + rows_per_block < N ? r0 + rows_per_block : N;
  float acc_dw = 0.0f, acc_db = 0.0f;
  for (int r = r0; r < r1; ++r) {
    const std::size_t i = static_cast<std::size_t>(r) * C + c;
    const float dy = __bfloat162float(dout[i]);
    const float xhat = (__bfloat162float(inp[i]) - mean[r]) * rstd[r];
    acc_dw += dy * xhat;
    acc_db += dy;
  }
  part_dw[static_cast<std::size_t>(g) * C + c] = acc_dw;
  part_db[static_cast<std::size_t>(g) * C + c] = acc_db;
}

// out = x w rstd, rstd = 1 / sqrt(mean(x^2) + eps); one warp per row.
template <int VEC>
__global__ void rmsnorm_forward_kernel(bf16* out, float* rstd, const bf16* inp, const bf16* w, int N, int C,
                                       float eps) {
  const int row = static_cast<int>(blockIdx.x) * kWarpsPerBlock + static_cast<int>(threadIdx.x / 32);
  const int lane = static_cast<int>(threadIdx.x % 32);
  if (row >= N) return;
  const std::size_t off = static_cast<std::size_t>(row) * C;
  float sq = 0.0f;
  for (int c = lane * VEC; c < C; c += 32 * VEC) {
    float v[VEC];
    load_bf16<VEC>(inp + off + c, v);
#pragma unroll
    for (int k = 0; k < VEC; ++k) sq += v[k] * v[k];
  }
  const float s = math::rmsnorm_rstd(warp_sum(sq) / static_cast<float>(C), eps);
  for (int c = lane * VEC; c < C; c += 32 * VEC) {
    float v[VEC], wv[VEC];
    load_bf16<VEC>(inp + off + c, v);
    load_bf16<VEC>(w + c, wv);
#pragma unroll
    for (int k = 0; k < VEC; ++k) v[k] = v[k] * s * wv[k];
    store_bf16<VEC>(out + off + c, v);
  }
  if (lane == 0) rstd[row] = s;
}

// dinp += rstd (dy w - x rstd^2 mean(dy w x)), one warp per row.
template <int VEC>
__global__ void rmsnorm_backward_dinp_kernel(bf16* dinp, const bf16* dout, const bf16* inp, const bf16* w,
                                             const float* rstd, int N, int C) {
  const int row = static_cast<int>(blockIdx.x) * kWarpsPerBlock + static_cast<int>(threadIdx.x / 32);
  const int lane = static_cast<int>(threadIdx.x % 32);
  if (row >= N) return;
  const std::size_t off = static_cast<std::size_t>(row) * C;
  const float s = rstd[row];
  float dot = 0.0f;
  for (int c = lane * VEC; c < C; c += 32 * VEC) {
    float dy[VEC], x[VEC], wv[VEC];
    load_bf16<VEC>(dout + off + c, dy);
    load_bf16<VEC>(inp + off + c, x);
    load_bf16<VEC>(w + c, wv);
#pragma unroll
    for (int k = 0; k < VEC; ++k) dot += dy[k] * wv[k] * x[k];
  }
  const float m = warp_sum(dot) / static_cast<float>(C) * s * s;
  add_to_dinp_row<VEC>(dinp + off, dout + off, inp + off, w, C, lane,
                       [=](float dy, float wv, float x) { return s * (dy * wv - x * m); });
}

// Block (x, g): the partial column sums of dy x rstd over row block g, into row g of part_dw.
__global__ void rmsnorm_backward_partials_kernel(float* part_dw, const bf16* dout, const bf16* inp, const float* rstd,
                                                 int N, int C, int rows_per_block) {
  const int c = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (c >= C) return;
  const int g = static_cast<int>(blockIdx.y);
  const int r0 = g * rows_per_block;
  const int r1 = r0 + rows_per_block < N ? r0 + rows_per_block : N;
  float acc = 0.0f;
  for (int r = r0; r < r1; ++r) {
    const std::size_t i = static_cast<std::size_t>(r) * C + c;
    acc += __bfloat162float(dout[i]) * __bfloat162float(inp[i]) * rstd[r];
  }
  part_dw[static_cast<std::size_t>(g) * C + c] = acc;
}

unsigned row_grid(int N) { return ceil_div(static_cast<std::size_t>(N), kWarpsPerBlock); }

template <bool RESIDUAL>
void launch_forward(const char* op, bf16* residual, bf16* out, float* mean, float* rstd, const bf16* a, const bf16* b,
                    const bf16* w, const bf16* bias, int N, int C, cudaStream_t stream) {
  check_shape(op, N, C);
  bool vec = C % 8 == 0 && aligned16(out) && aligned16(a) && aligned16(w) && aligned16(bias);
  if (RESIDUAL) vec = vec && aligned16(residual) && aligned16(b);
  constexpr int threads = 32 * kWarpsPerBlock;
  if (vec) {
    layernorm_forward_kernel<8, RESIDUAL>
        <<<row_grid(N), threads, 0, stream>>>(residual, out, mean, rstd, a, b, w, bias, N, C);
  } else {
    layernorm_forward_kernel<1, RESIDUAL>
        <<<row_grid(N), threads, 0, stream>>>(residual, out, mean, rstd, a, b, w, bias, N, C);
  }
  GPT_LAUNCH_CHECK(op);
}

}  // namespace

void layernorm_forward(bf16* out, float* mean, float* rstd, const bf16* inp, const bf16* w, const bf16* b, int N, int C,
                       cudaStream_t stream) {
  launch_forward<false>("layernorm_forward", nullptr, out, mean, rstd, inp, nullptr, w, b, N, C, stream);
}

void residual_layernorm_forward(bf16* residual, bf16* out, float* mean, float* rstd, const bf16* a, const bf16* b,
                                const bf16* w, const bf16* bias, int N, int C, cudaStream_t stream) {
  launch_forward<true>("residual_layernorm_forward", residual, out, mean, rstd, a, b, w, bias, N, C, stream);
}

std::size_t layernorm_backward_scratch_bytes(int N, int C) {
  check_shape("layernorm_backward_scratch_bytes", N, C);
  return kScratchAlign + 2 * detail::column_partial_bytes(N, C);
}

void layernorm_backward(bf16* dinp, bf16* dw, bf16* db, const bf16* dout, const bf16* inp, const bf16* w,
                        const float* mean, const float* rstd, int N, int C, void* scratch, std::size_t scratch_bytes,
                        cudaStream_t stream) {
  check_shape("layernorm_backward", N, C);
  const std::size_t need = layernorm_backward_scratch_bytes(N, C);
  detail::check_scratch("layernorm_backward", scratch, scratch_bytes, need,
                        "N=" + std::to_string(N) + ", C=" + std::to_string(C));
  std::byte* base = detail::scratch_base(scratch);
  auto* part_dw = reinterpret_cast<float*>(base);
  auto* part_db = reinterpret_cast<float*>(base + detail::column_partial_bytes(N, C));

  const bool vec = C % 8 == 0 && aligned16(dinp) && aligned16(dout) && aligned16(inp) && aligned16(w);
  constexpr int threads = 32 * kWarpsPerBlock;
  if (vec) {
    layernorm_backward_dinp_kernel<8><<<row_grid(N), threads, 0, stream>>>(dinp, dout, inp, w, mean, rstd, N, C);
  } else {
    layernorm_backward_dinp_kernel<1><<<row_grid(N), threads, 0, stream>>>(dinp, dout, inp, w, mean, rstd, N, C);
  }
  GPT_LAUNCH_CHECK("layernorm_backward (dinp)");

  const int rows = math::column_reduce_rows_per_block(N);
  const int blocks = math::column_reduce_blocks(N);
  const dim3 grid(ceil_div(static_cast<std::size_t>(C), kColumnThreads), static_cast<unsigned>(blocks));
  layernorm_backward_partials_kernel<<<grid, kColumnThreads, 0, stream>>>(part_dw, part_db, dout, inp, mean, rstd, N, C,
                                                                          rows);
  GPT_LAUNCH_CHECK("layernorm_backward (dw/db partials)");
  detail::add_column_partials(dw, part_dw, blocks, C, stream);
  GPT_LAUNCH_CHECK("layernorm_backward (dw)");
  detail::add_column_partials(db, part_db, blocks, C, stream);
  GPT_LAUNCH_CHECK("layernorm_backward (db)");
}

void rmsnorm_forward(bf16* out, float* rstd, const bf16* inp, const bf16* w, int N, int C, float eps,
                     cudaStream_t stream) {
  check_shape("rmsnorm_forward", N, C);
  constexpr int threads = 32 * kWarpsPerBlock;
  if (C % 8 == 0 && aligned16(out) && aligned16(inp) && aligned16(w)) {
    rmsnorm_forward_kernel<8><<<row_grid(N), threads, 0, stream>>>(out, rstd, inp, w, N, C, eps);
  } else {
    rmsnorm_forward_kernel<1><<<row_grid(N), threads, 0, stream>>>(out, rstd, inp, w, N, C, eps);
  }
  GPT_LAUNCH_CHECK("rmsnorm_forward");
}

std::size_t rmsnorm_backward_scratch_bytes(int N, int C) {
  check_shape("rmsnorm_backward_scratch_bytes", N, C);
  return kScratchAlign + detail::column_partial_bytes(N, C);
}

void rmsnorm_backward(bf16* dinp, bf16* dw, const bf16* dout, const bf16* inp, const bf16* w, const float* rstd, int N,
                      int C, void* scratch, std::size_t scratch_bytes, cudaStream_t stream) {
  check_shape("rmsnorm_backward", N, C);
  const std::size_t need = rmsnorm_backward_scratch_bytes(N, C);
  detail::check_scratch("rmsnorm_backward", scratch, scratch_bytes, need,
                        "N=" + std::to_string(N) + ", C=" + std::to_string(C));
  auto* part_dw = reinterpret_cast<float*>(detail::scratch_base(scratch));

  const bool vec = C % 8 == 0 && aligned16(dinp) && aligned16(dout) && aligned16(inp) && aligned16(w);
  constexpr int threads = 32 * kWarpsPerBlock;
  if (vec) {
    rmsnorm_backward_dinp_kernel<8><<<row_grid(N), threads, 0, stream>>>(dinp, dout, inp, w, rstd, N, C);
  } else {
    rmsnorm_backward_dinp_kernel<1><<<row_grid(N), threads, 0, stream>>>(dinp, dout, inp, w, rstd, N, C);
  }
  GPT_LAUNCH_CHECK("rmsnorm_backward (dinp)");

  const int rows = math::column_reduce_rows_per_block(N);
  const int blocks = math::column_reduce_blocks(N);
  const dim3 grid(ceil_div(static_cast<std::size_t>(C), kColumnThreads), static_cast<unsigned>(blocks));
  rmsnorm_backward_partials_kernel<<<grid, kColumnThreads, 0, stream>>>(part_dw, dout, inp, rstd, N, C, rows);
  GPT_LAUNCH_CHECK("rmsnorm_backward (dw partials)");
  detail::add_column_partials(dw, part_dw, blocks, C, stream);
  GPT_LAUNCH_CHECK("rmsnorm_backward (dw)");
}

}  // namespace zero::gpt::cuda
