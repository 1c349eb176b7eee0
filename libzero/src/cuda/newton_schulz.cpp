#include "cuda/newton_schulz.hpp"

#include <cublasLt.h>
#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <map>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

#include "cuda/cuda_check.hpp"
#include "cuda/device_allocator.hpp"
#include "cuda/kernels.hpp"
#include "zero/error.hpp"

namespace zero::cuda {

namespace {

// host_muon.cpp's quintic coefficients (PyTorch's and Keller Jordan's).
constexpr float kA = 3.4445f, kB = -4.7750f, kC = 2.0315f;
// cuBLASLt's recommended workspace on Hopper.
constexpr std::size_t kWorkspaceBytes = std::size_t{32} << 20;

void lt_check(cublasStatus_t s, const char* call) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  ZERO_THROW(
      fmt::format("Muon's Newton-Schulz on the device: {} failed: {} ({}); check the CUDA and cuBLASLt "
                  "installation, or step Muon on the host (backend: host)",
                  call, cublasLtGetStatusName(s), cublasLtGetStatusString(s)));
}

// cuBLASLt's descriptors, owned.
struct DropDesc {
  void operator()(cublasLtMatmulDesc_t d) const { cublasLtMatmulDescDestroy(d); }
};
struct DropLayout {
  void operator()(cublasLtMatrixLayout_t l) const { cublasLtMatrixLayoutDestroy(l); }
};
using Desc = std::unique_ptr<std::remove_pointer_t<cublasLtMatmulDesc_t>, DropDesc>;
using MatrixLayout = std::unique_ptr<std::remove_pointer_t<cublasLtMatrixLayout_t>, DropLayout>;

// A dense column-major bf16 [rows, cols] matrix, `count` of them `stride` elements apart.
MatrixLayout bf16_layout(std::uint64_t rows, std::uint64_t cols, std::int32_t count, std::int64_t stride) {
  cublasLtMatrixLayout_t l = nullptr;
  lt_check(cublasLtMatrixLayoutCreate(&l, CUDA_R_16BF, rows, cols, static_cast<std::int64_t>(rows)),
           "cublasLtMatrixLayoutCreate");
  MatrixLayout out(l);
  lt_check(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)),
           "cublasLtMatrixLayoutSetAttribute");
  lt_check(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)),
           "cublasLtMatrixLayoutSetAttribute");
  return out;
}

// Elements between two matrices of `elems` bf16 elements in a batch: 256-byte aligned, as each
// matrix of one is.
std::int64_t batch_stride(std::uint64_t elems) { return static_cast<std::int64_t>((elems * 2 + 255) / 256 * 128); }

// One product D = alpha op(A) B + beta C over column-major bf16 matrices, each stored densely
// (C and D share a layout), a strided batch of them, with its algorithm.
struct Product {
  Desc desc;
  MatrixLayout a, b, cd;
  cublasLtMatmulAlgo_t algo{};
};

// A: [a_rows, a_cols] stored (transposed in the product when trans_a), B: [m or k, n], D: [m, n].
void describe(Product& p, cublasLtHandle_t h, cublasLtMatmulPreference_t pref, bool trans_a, std::uint64_t a_rows,
              std::uint64_t a_cols, std::uint64_t b_rows, std::uint64_t b_cols, std::uint64_t d_rows,
              std::uint64_t d_cols, std::int32_t batch) {
  cublasLtMatmulDesc_t desc = nullptr;
  lt_check(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  p.desc.reset(desc);
  const cublasOperation_t op = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  lt_check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op, sizeof(op)),
           "cublasLtMatmulDescSetAttribute");
  p.a = bf16_layout(a_rows, a_cols, batch, batch_stride(a_rows * a_cols));
  p.b = bf16_layout(b_rows, b_cols, batch, batch_stride(b_rows * b_cols));
  p.cd = bf16_layout(d_rows, d_cols, batch, batch_stride(d_rows * d_cols));
  cublasLtMatmulHeuristicResult_t found{};
  int count = 0;
  lt_check(
      cublasLtMatmulAlgoGetHeuristic(h, desc, p.a.get(), p.b.get(), p.cd.get(), p.cd.get(), pref, 1, &found, &count),
      "cublasLtMatmulAlgoGetHeuristic");
  ZERO_CHECK(count > 0, fmt::format("Muon's Newton-Schulz on the device: cuBLASLt has no bf16 algorithm for a "
                                    "[{}, {}] x [{}, {}] product; step Muon on the host (backend: host)",
                                    trans_a ? a_cols : a_rows, trans_a ? a_rows : a_cols, b_rows, b_cols));
  p.algo = found.algo;
}

}  // namespace

struct NewtonSchulz::Impl {
  // The three products of one [r, k] shape (r <= k), in the column-major view of the row-major
  // buffers (a row-major [m, n] matrix is its column-major transpose, [n, m]): X is [k, r],
  // A and B are [r, r] (symmetric in exact arithmetic).
  struct Plan {
    Product gram;    // A = X^T X (the row-major X X^T)
    Product poly;    // B = c A A + b A
    Product update;  // Y = X B + a X (the row-major a X + B X)
  };

  explicit Impl(DeviceAllocator& a) : alloc(a) {
    lt_check(cublasLtCreate(&handle), "cublasLtCreate");
    lt_check(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    const std::size_t ws = kWorkspaceBytes;
    lt_check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)),
             "cublasLtMatmulPreferenceSetAttribute");
  }
  ~Impl() {
    plans.clear();
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (handle) cublasLtDestroy(handle);
  }

  Plan& plan(std::int64_t r, std::int64_t k, std::int32_t count) {
    auto& p = plans[{r, k, count}];
    if (p) return *p;
    auto fresh = std::make_unique<Plan>();
    const auto R = static_cast<std::uint64_t>(r), K = static_cast<std::uint64_t>(k);
    describe(fresh->gram, handle, pref, true, K, R, K, R, R, R, count);
    describe(fresh->poly, handle, pref, false, R, R, R, R, R, R, count);
    describe(fresh->update, handle, pref, false, K, R, R, R, K, R, count);
    p = std::move(fresh);
    return *p;
  }

  // Buffers for `count` [r, k] matrices: X, Y (r k each per matrix), A, B (r r each), each
  // matrix 256-byte aligned (batch_stride), and the norms' inverses.
  void reserve(std::int64_t r, std::int64_t k, std::int32_t count) {
    const std::size_t n = static_cast<std::size_t>(count);
    const std::size_t rk = n * 2 * static_cast<std::size_t>(batch_stride(static_cast<std::uint64_t>(r * k)));
    const std::size_t rr = n * 2 * static_cast<std::size_t>(batch_stride(static_cast<std::uint64_t>(r * r)));
    const std::size_t need = 2 * rk + 2 * rr + (n * sizeof(float) + 255) / 256 * 256;
    if (!workspace) workspace = alloc.allocate(kWorkspaceBytes);
    if (need > bytes) {
      if (base) alloc.release(base, bytes);
      base = nullptr;
      base = alloc.allocate(need);
      bytes = need;
    }
    auto* p = static_cast<char*>(base);
    X = reinterpret_cast<std::uint16_t*>(p);
    Y = reinterpret_cast<std::uint16_t*>(p + rk);
    A = reinterpret_cast<std::uint16_t*>(p + 2 * rk);
    B = reinterpret_cast<std::uint16_t*>(p + 2 * rk + rr);
    inv = reinterpret_cast<float*>(p + 2 * rk + 2 * rr);
  }

  void matmul(const Product& p, float alpha, const void* a, const void* b, float beta, const void* c, void* d,
              cudaStream_t s) {
    lt_check(cublasLtMatmul(handle, p.desc.get(), &alpha, a, p.a.get(), b, p.b.get(), &beta, c, p.cd.get(), d,
                            p.cd.get(), &p.algo, workspace, kWorkspaceBytes, s),
             "cublasLtMatmul");
  }

  void release() {
    if (base) alloc.release(base, bytes);
    if (workspace) alloc.release(workspace, kWorkspaceBytes);
    base = workspace = nullptr;
    bytes = 0;
  }

  DeviceAllocator& alloc;
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  std::map<std::tuple<std::int64_t, std::int64_t, std::int32_t>, std::unique_ptr<Plan>> plans;
  void* workspace = nullptr;
  void* base = nullptr;
  std::size_t bytes = 0;
  std::uint16_t *X = nullptr, *Y = nullptr, *A = nullptr, *B = nullptr;
  float* inv = nullptr;
};

NewtonSchulz::NewtonSchulz(DeviceAllocator& alloc) : impl_(std::make_unique<Impl>(alloc)) {}
NewtonSchulz::~NewtonSchulz() = default;

void NewtonSchulz::release() { impl_->release(); }

void NewtonSchulz::run(float* x, std::int64_t rows, std::int64_t cols, int steps, double* scratch,
                       cudaStream_t stream) {
  run_batch(&x, 1, rows, cols, steps, scratch, stream);
}

void NewtonSchulz::run_batch(float* const* xs, std::size_t count, std::int64_t rows, std::int64_t cols, int steps,
                             double* scratch, cudaStream_t stream) {
  ZERO_CHECK(rows > 0 && cols > 0, "newton_schulz: empty matrix");
  if (count == 0) return;
  ZERO_CHECK(count <= static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()),
             "newton_schulz: too many matrices in one batch");
  Impl& m = *impl_;
  const std::int64_t r = std::min(rows, cols), k = std::max(rows, cols);
  const auto n = static_cast<std::int32_t>(count);
  m.reserve(r, k, n);
  const Impl::Plan& p = m.plan(r, k, n);
  const auto rk = static_cast<std::size_t>(batch_stride(static_cast<std::uint64_t>(r * k)));
  // The norms and conversions one matrix at a time (element-wise, cheap); the products of all
  // of them in one launch each.
  for (std::size_t i = 0; i < count; ++i) launch_ns_load(xs[i], rows, cols, m.X + i * rk, m.inv + i, scratch, stream);
  for (int s = 0; s < steps; ++s) {
    m.matmul(p.gram, 1.0f, m.X, m.X, 0.0f, m.A, m.A, stream);
    m.matmul(p.poly, kC, m.A, m.A, kB, m.A, m.B, stream);
    m.matmul(p.update, 1.0f, m.X, m.B, kA, m.X, m.Y, stream);
    std::swap(m.X, m.Y);
  }
  for (std::size_t i = 0; i < count; ++i) launch_ns_store(m.X + i * rk, rows, cols, xs[i], stream);
}

}  // namespace zero::cuda
