// Token + position embedding, forward and a deterministic backward.
//
// The forward is a gather: each thread adds one 8-wide (16-byte) chunk of a wte row and a wpe
// row, or one element when C is not a multiple of 8 or a pointer is not 16-byte aligned.
//
// The backward must not depend on scheduling, so it never lets two threads add into the same
// dwte row. The B*T positions are sorted by token id (CUB radix sort, which is stable: equal ids
// keep increasing position order), and the block that sits at the start of each run of equal
// ids sums that run's dout rows in position order in fp32, then adds the total to the bf16 dwte
// row once. dwpe[t] is a plain column sum over b in b order. Under tensor parallelism wte is one
// part of the vocabulary, rows [row0, row0 + rows): ids outside it read zeros in the forward and
// their runs are skipped in the backward. A null wpe (a model without learned positions, or a
// tensor rank that leaves the position term to another) adds no position term, and a null dwpe
// takes no position gradient. All scratch (the sorted keys, position values and CUB's temporary
// storage) lives in the caller's buffer.
#include <cub/device/device_radix_sort.cuh>
#include <string>

#include "gpt/cuda/bf16_io.cuh"
#include "gpt/cuda/gpt_kernels.hpp"
#include "zero/error.hpp"

namespace zero::gpt::cuda {

namespace {

using detail::align_up;
using detail::aligned16;
using detail::ceil_div;
using detail::load_bf16;
using detail::store_bf16;

using detail::kScratchAlign;

std::string shape_text(int B, int T, int C) {
  return "B=" + std::to_string(B) + ", T=" + std::to_string(T) + ", C=" + std::to_string(C);
}

void check_shape(const char* op, int B, int T, int C) {
  ZERO_CHECK(B >= 1 && T >= 1 && C >= 1,
             std::string(op) + ": unsupported shape " + shape_text(B, T, C) + " (B, T and C must be at least 1)");
  ZERO_CHECK(static_cast<long long>(B) * T <= 0x7fffffffLL,
             std::string(op) + ": B*T = " + std::to_string(static_cast<long long>(B) * T) +
                 " positions exceed the 2^31-1 the sort supports (" + shape_text(B, T, C) + ")");
}

// One thread per VEC-wide chunk of an output row.
template <int VEC>
__global__ void encoder_forward_kernel(bf16* out, const std::int32_t* tokens, const bf16* wte, const bf16* wpe, int T,
                                       int C, std::size_t chunks, int row0, int rows) {
  const std::size_t per_row = static_cast<std::size_t>(C / VEC);
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < chunks;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t n = i / per_row;
    const std::size_t c = (i % per_row) * VEC;
    const std::size_t t = n % static_cast<std::size_t>(T);
    const int r = tokens[n] - row0;
    float e[VEC], p[VEC];
#pragma unroll
    for (int k = 0; k < VEC; ++k) e[k] = p[k] = 0.0f;
    if (rows < 0 || (r >= 0 && r < rows)) load_bf16<VEC>(wte + static_cast<std::size_t>(r) * C + c, e);
    if (wpe) load_bf16<VEC>(wpe + t * C + c, p);
#pragma unroll
    for (int k = 0; k < VEC; ++k) e[k] += p[k];
    store_bf16<VEC>(out + n * C + c, e);
  }
}

__global__ void iota_kernel(std::int32_t* v, int n) {
  for (int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x); i < n;
       i += static_cast<int>(gridDim.x * blockDim.x))
    v[i] = i;
}

// Block i handles sorted entry i if it starts a run of equal token ids: it walks the run (the
// positions in increasing order, as the stable sort left them) for each of its columns.
template <int VEC>
__global__ void encoder_backward_wte_kernel(bf16* dwte, const bf16* dout, const std::int32_t* sorted_ids,
                                            const std::int32_t* sorted_pos, int N, int C, int row0, int rows) {
  const int i = static_cast<int>(blockIdx.x);
  const std::int32_t id = sorted_ids[i];
  if (i > 0 && sorted_ids[i - 1] == id) return;
  if (rows >= 0 && (id - row0 < 0 || id - row0 >= rows)) return;  // another rank's part
  bf16* row = dwte + static_cast<std::size_t>(id - row0) * C;
  for (int c = static_cast<int>(threadIdx.x) * VEC; c < C; c += static_cast<int>(blockDim.x) * VEC) {
    float acc[VEC];
#pragma unroll
    for (int k = 0; k < VEC; ++k) acc[k] = 0.0f;
    for (int j = i; j < N && sorted_ids[j] == id; ++j) {
      float d[VEC];
      load_bf16<VEC>(dout + static_cast<std::size_t>(sorted_pos[j]) * C + c, d);
#pragma unroll
      for (int k = 0; k < VEC; ++k) acc[k] += d[k];
    }
    float g[VEC];
    load_bf16<VEC>(row + c, g);
#pragma unroll
    for (int k = 0; k < VEC; ++k) g[k] += acc[k];
    store_bf16<VEC>(row + c, g);
  }
}

// One thread per VEC-wide chunk of dwpe: sums the B rows at position t in b order.
template <int VEC>
__global__ void encoder_backward_wpe_kernel(bf16* dwpe, const bf16* dout, int B, int T, int C) {
  const std::size_t per_row = static_cast<std::size_t>(C / VEC);
  const std::size_t chunks = static_cast<std::size_t>(T) * per_row;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < chunks;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t t = i / per_row;
    const std::size_t c = (i % per_row) * VEC;
    float acc[VEC];
#pragma unroll
    for (int k = 0; k < VEC; ++k) acc[k] = 0.0f;
    for (int b = 0; b < B; ++b) {
      float d[VEC];
      load_bf16<VEC>(dout + (static_cast<std::size_t>(b) * T + t) * C + c, d);
#pragma unroll
      for (int k = 0; k < VEC; ++k) acc[k] += d[k];
    }
    float g[VEC];
    load_bf16<VEC>(dwpe + t * C + c, g);
#pragma unroll
    for (int k = 0; k < VEC; ++k) g[k] += acc[k];
    store_bf16<VEC>(dwpe + t * C + c, g);
  }
}

// Grid-stride kernels need no more blocks than keep every SM busy; this cap is far above that.
unsigned grid_for(std::size_t items, int threads) {
  const std::size_t blocks = (items + threads - 1) / threads;
  return static_cast<unsigned>(blocks < (1u << 20) ? (blocks > 0 ? blocks : 1) : (1u << 20));
}

std::size_t sort_temp_bytes(int n) {
  std::size_t bytes = 0;
  const cudaError_t rc = cub::DeviceRadixSort::SortPairs(
      nullptr, bytes, static_cast<const std::int32_t*>(nullptr), static_cast<std::int32_t*>(nullptr),
      static_cast<const std::int32_t*>(nullptr), static_cast<std::int32_t*>(nullptr), n);
  ZERO_CHECK(rc == cudaSuccess, std::string("encoder_backward: sizing the CUB radix sort of ") + std::to_string(n) +
                                    " ids failed: " + cudaGetErrorName(rc));
  return bytes;
}

// Scratch layout, each part 256-byte aligned from an aligned base: sorted ids [N], positions
// [N], sorted positions [N], CUB temporary storage. The leading kScratchAlign bytes of slack let
// the base be any pointer.
struct BackwardScratch {
  std::size_t ids_bytes, sort_bytes, total;
};

BackwardScratch backward_scratch(int N) {
  BackwardScratch s{};
  s.ids_bytes = align_up(static_cast<std::size_t>(N) * sizeof(std::int32_t), kScratchAlign);
  s.sort_bytes = sort_temp_bytes(N);
  s.total = kScratchAlign + 3 * s.ids_bytes + align_up(s.sort_bytes, kScratchAlign);
  return s;
}

}  // namespace

void encoder_forward(bf16* out, const std::int32_t* tokens, const bf16* wte, const bf16* wpe, int B, int T, int C,
                     cudaStream_t stream, int row0, int rows) {
  check_shape("encoder_forward", B, T, C);
  constexpr int kThreads = 256;
  const std::size_t N = static_cast<std::size_t>(B) * T;
  if (C % 8 == 0 && aligned16(out) && aligned16(wte) && aligned16(wpe)) {
    const std::size_t chunks = N * (C / 8);
    encoder_forward_kernel<8>
        <<<grid_for(chunks, kThreads), kThreads, 0, stream>>>(out, tokens, wte, wpe, T, C, chunks, row0, rows);
  } else {
    const std::size_t chunks = N * C;
    encoder_forward_kernel<1>
        <<<grid_for(chunks, kThreads), kThreads, 0, stream>>>(out, tokens, wte, wpe, T, C, chunks, row0, rows);
  }
  GPT_LAUNCH_CHECK("encoder_forward");
}

std::size_t encoder_backward_scratch_bytes(int B, int T, int C) {
  check_shape("encoder_backward_scratch_bytes", B, T, C);
  return backward_scratch(B * T).total;
}

void encoder_backward(bf16* dwte, bf16* dwpe, const bf16* dout, const std::int32_t* tokens, int B, int T, int C,
                      void* scratch, std::size_t scratch_bytes, cudaStream_t stream, int row0, int rows) {
  check_shape("encoder_backward", B, T, C);
  const int N = B * T;
  const BackwardScratch s = backward_scratch(N);
  detail::check_scratch("encoder_backward", scratch, scratch_bytes, s.total, shape_text(B, T, C));
  std::byte* base = detail::scratch_base(scratch);
  auto* sorted_ids = reinterpret_cast<std::int32_t*>(base);
  auto* positions = reinterpret_cast<std::int32_t*>(base + s.ids_bytes);
  auto* sorted_pos = reinterpret_cast<std::int32_t*>(base + 2 * s.ids_bytes);
  void* sort_temp = base + 3 * s.ids_bytes;
  std::size_t sort_bytes = s.sort_bytes;

  constexpr int kThreads = 256;
  iota_kernel<<<grid_for(static_cast<std::size_t>(N), kThreads), kThreads, 0, stream>>>(positions, N);
  GPT_LAUNCH_CHECK("encoder_backward (positions)");
  const cudaError_t rc =
      cub::DeviceRadixSort::SortPairs(sort_temp, sort_bytes, tokens, sorted_ids, positions, sorted_pos, N, 0,
                                      static_cast<int>(sizeof(std::int32_t) * 8), stream);
  ZERO_CHECK(rc == cudaSuccess, std::string("encoder_backward: CUB radix sort of ") + std::to_string(N) +
                                    " token ids failed: " + cudaGetErrorName(rc) + " (" + shape_text(B, T, C) + ")");

  const bool vec = C % 8 == 0 && aligned16(dwte) && aligned16(dwpe) && aligned16(dout);
  // Enough threads for one pass over the row's chunks, a whole number of warps, at most 256.
  const int row_chunks = vec ? C / 8 : C;
  const int wte_threads = row_chunks >= 256 ? 256 : (row_chunks + 31) / 32 * 32;
  if (vec) {
    encoder_backward_wte_kernel<8>
        <<<static_cast<unsigned>(N), wte_threads, 0, stream>>>(dwte, dout, sorted_ids, sorted_pos, N, C, row0, rows);
  } else {
    encoder_backward_wte_kernel<1>
        <<<static_cast<unsigned>(N), wte_threads, 0, stream>>>(dwte, dout, sorted_ids, sorted_pos, N, C, row0, rows);
  }
  GPT_LAUNCH_CHECK("encoder_backward (wte)");
  if (dwpe == nullptr) return;  // no learned positions, or another rank's
  const std::size_t wpe_chunks = static_cast<std::size_t>(T) * row_chunks;
  if (vec) {
    encoder_backward_wpe_kernel<8><<<grid_for(wpe_chunks, kThreads), kThreads, 0, stream>>>(dwpe, dout, B, T, C);
  } else {
    encoder_backward_wpe_kernel<1><<<grid_for(wpe_chunks, kThreads), kThreads, 0, stream>>>(dwpe, dout, B, T, C);
  }
  GPT_LAUNCH_CHECK("encoder_backward (wpe)");
}

}  // namespace zero::gpt::cuda
