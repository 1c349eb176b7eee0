// cuBLASLt behind the GPT model's products (see matmul.hpp for the idea).
//
// Every public operation validates its shape and pointers, then describes each product it
// needs in cuBLASLt's column-major terms (a Gemm: D[m,n] = op(A) op(B), plus beta D) and runs
// it through the plan cached for that Gemm. Transposition cheat sheet: a row-major [R, K]
// buffer is, column-major, a [K, R] matrix with leading dimension K.
#include <cublasLt.h>

#include <compare>
#include <cstdint>
#include <map>
#include <sstream>
#include <string>

#include "gpt/cuda/gpt_kernels.hpp"
#include "gpt/cuda/matmul.hpp"
#include "gpt/cuda/status_check.hpp"
#include "zero/error.hpp"

namespace zero::gpt::cuda {
namespace {

// cuBLASLt's bf16 kernels read 16-byte vectors: 8 elements.
constexpr std::uint32_t kAlignBytes = 16;
constexpr int kAlignElements = kAlignBytes / sizeof(bf16);

[[noreturn]] void throw_cublas_status(const char* file, int line, const char* call, cublasStatus_t s) {
  zero::throw_error(
      file, line, std::string(call) + " failed: " + cublasLtGetStatusName(s) + " (" + cublasLtGetStatusString(s) + ")");
}

#define GPT_CUBLAS_CHECK(call)                                                                                   \
  do {                                                                                                           \
    const cublasStatus_t gpt_cublas_rc_ = (call);                                                                \
    if (gpt_cublas_rc_ != CUBLAS_STATUS_SUCCESS) throw_cublas_status(__FILE__, __LINE__, #call, gpt_cublas_rc_); \
  } while (0)

enum class Epilogue : std::uint8_t { none, bias, gelu_aux, gelu_aux_bias, dgelu };

cublasLtEpilogue_t to_cublas(Epilogue e) {
  switch (e) {
    case Epilogue::none: return CUBLASLT_EPILOGUE_DEFAULT;
    case Epilogue::bias: return CUBLASLT_EPILOGUE_BIAS;
    case Epilogue::gelu_aux: return CUBLASLT_EPILOGUE_GELU_AUX;
    case Epilogue::gelu_aux_bias: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case Epilogue::dgelu: return CUBLASLT_EPILOGUE_DGELU;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}
bool reads_bias(Epilogue e) { return e == Epilogue::bias || e == Epilogue::gelu_aux_bias; }
bool is_gelu(Epilogue e) { return e == Epilogue::gelu_aux || e == Epilogue::gelu_aux_bias || e == Epilogue::dgelu; }
bool uses_aux(Epilogue e) { return is_gelu(e); }
const char* epilogue_name(Epilogue e) {
  switch (e) {
    case Epilogue::none: return "DEFAULT";
    case Epilogue::bias: return "BIAS";
    case Epilogue::gelu_aux: return "GELU_AUX";
    case Epilogue::gelu_aux_bias: return "GELU_AUX_BIAS";
    case Epilogue::dgelu: return "DGELU";
  }
  return "?";
}

// One column-major product D[m,n] = op(A)[m,k] op(B)[k,n] (+ beta D). A is stored [m,k] (or
// [k,m] when transposed), B [k,n] (or [n,k]); the aux matrix of the GELU epilogues has D's
// shape and leading dimension. Also the key of the plan cache.
struct Gemm {
  bool trans_a = false;
  bool trans_b = false;
  std::int64_t m = 0, n = 0, k = 0;
  std::int64_t lda = 0, ldb = 0, ldd = 0;
  Epilogue epilogue = Epilogue::none;
  auto operator<=>(const Gemm&) const = default;
};

std::string describe(const Gemm& g) {
  std::ostringstream s;
  s << "m=" << g.m << " n=" << g.n << " k=" << g.k << " op(A)=" << (g.trans_a ? "T" : "N")
    << " op(B)=" << (g.trans_b ? "T" : "N") << " lda=" << g.lda << " ldb=" << g.ldb << " ldd=" << g.ldd << " epilogue "
    << epilogue_name(g.epilogue);
  return s.str();
}

// The descriptors of one Gemm and the algorithm chosen for it.
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool supported = false;

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

template <class T>
void set_desc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& value) {
  GPT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)));
}
template <class T>
void set_pref(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, const T& value) {
  GPT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)));
}

// --- validation, before anything is enqueued ---

std::string shape_text(const char* op, const char* a, int av, const char* b, int bv, const char* c, int cv) {
  std::ostringstream s;
  s << "matmul " << op << " (" << a << "=" << av << ", " << b << "=" << bv << ", " << c << "=" << cv << ")";
  return s.str();
}

void check_rows(const std::string& where, int rows) {
  ZERO_CHECK(rows > 0, where + ": the row count must be positive");
}

void check_row_length(const std::string& where, const char* name, int v) {
  ZERO_CHECK(v > 0 && v % kAlignElements == 0,
             where + ": " + name + " = " + std::to_string(v) + " is not supported: it must be a positive multiple of " +
                 std::to_string(kAlignElements) +
                 " (cuBLASLt's bf16 kernels need every row 16-byte aligned); pad the dimension");
}

void check_pointer(const std::string& where, const char* name, const void* p, bool may_be_null) {
  if (p == nullptr) {
    ZERO_CHECK(may_be_null, where + ": " + name + " is null");
    return;
  }
  const auto addr = reinterpret_cast<std::uintptr_t>(p);
  if (addr % kAlignBytes != 0) {
    std::ostringstream s;
    s << where << ": " << name << " = " << p << " is not " << kAlignBytes
      << "-byte aligned, which cuBLASLt's bf16 kernels need; carve buffers at offsets that are "
         "multiples of "
      << kAlignElements << " elements";
    ZERO_THROW(s.str());
  }
}

}  // namespace

struct Matmul::Impl {
  cudaStream_t stream = nullptr;
  Options options;
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  void* workspace = nullptr;
  std::map<Gemm, std::unique_ptr<Plan>> plans;
  Stats stats;

  Impl() = default;
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  ~Impl() {
    // Products still in flight may be using the workspace and the descriptors' pointers.
    if (workspace) cudaStreamSynchronize(stream);
    plans.clear();
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (handle) cublasLtDestroy(handle);
    if (workspace) cudaFree(workspace);
  }

  // The address the heuristic sees for the bias and aux pointers: exactly 16-byte aligned
  // (the workspace itself is 256-byte aligned), so the algorithm it picks works for any
  // 16-byte aligned pointer, not only for as aligned as the first call's. Never dereferenced.
  const void* probe_address() const { return static_cast<const char*>(workspace) + kAlignBytes; }

  Plan& plan(const Gemm& g) {
    if (auto it = plans.find(g); it != plans.end()) return *it->second;
    auto p = std::make_unique<Plan>();
    GPT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t op_a = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    set_desc(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, op_a);
    set_desc(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, op_b);
    const cublasLtEpilogue_t epilogue = to_cublas(g.epilogue);
    set_desc(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue);
    if (reads_bias(g.epilogue)) {
      const std::int32_t bias_type = CUDA_R_16BF;
      set_desc(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bias_type);
      set_desc(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, probe_address());
    }
    if (uses_aux(g.epilogue)) {
      // The aux matrix (the GELU input) is laid out like D; its element type defaults to D's.
      const std::int64_t aux_ld = g.ldd;
      set_desc(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, aux_ld);
      set_desc(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, probe_address());
    }
    const auto u = [](std::int64_t v) { return static_cast<std::uint64_t>(v); };
    GPT_CUBLAS_CHECK(
        cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16BF, u(g.trans_a ? g.k : g.m), u(g.trans_a ? g.m : g.k), g.lda));
    GPT_CUBLAS_CHECK(
        cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16BF, u(g.trans_b ? g.n : g.k), u(g.trans_b ? g.k : g.n), g.ldb));
    GPT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->d, CUDA_R_16BF, u(g.m), u(g.n), g.ldd));

    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t s =
        cublasLtMatmulAlgoGetHeuristic(handle, p->desc, p->a, p->b, p->d, p->d, pref, 1, &result, &found);
    ++stats.heuristic_queries;
    p->supported = s == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS &&
                   result.workspaceSize <= kWorkspaceBytes;
    if (p->supported) {
      p->algo = result.algo;
    } else if (!is_gelu(g.epilogue)) {
      // The GELU epilogues have a fallback; a plain product has none.
      ZERO_THROW(std::string("cuBLASLt has no algorithm for the bf16 product ") + describe(g) + " (heuristic status " +
                 cublasLtGetStatusName(s) + ", " + std::to_string(found) + " results)");
    }
    Plan& ref = *p;
    plans.emplace(g, std::move(p));
    ++stats.plans;
    return ref;
  }

  // Runs g if cuBLASLt has an algorithm for it; false (nothing enqueued) when it has none,
  // which only a GELU epilogue may see.
  bool run(const Gemm& g, const bf16* A, const bf16* B, bf16* D, float beta, const bf16* bias = nullptr,
           const void* aux = nullptr) {
    Plan& p = plan(g);
    if (!p.supported) return false;
    if (reads_bias(g.epilogue)) {
      const void* bias_ptr = bias;
      set_desc(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias_ptr);
    }
    if (uses_aux(g.epilogue)) set_desc(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux);
    const float alpha = 1.0f;
    // C is D (in place, same layout): beta = 1 accumulates into D, beta = 0 overwrites it.
    const cublasStatus_t s = cublasLtMatmul(handle, p.desc, &alpha, A, p.a, B, p.b, &beta, D, p.d, D, p.d, &p.algo,
                                            workspace, kWorkspaceBytes, stream);
    if (s == CUBLAS_STATUS_NOT_SUPPORTED && is_gelu(g.epilogue)) {
      // Refused at launch although the heuristic offered it: use the fallback from now on.
      p.supported = false;
      return false;
    }
    if (s != CUBLAS_STATUS_SUCCESS)
      throw_cublas_status(__FILE__, __LINE__, ("cublasLtMatmul for " + describe(g)).c_str(), s);
    return true;
  }
};

Matmul::Matmul(cudaStream_t stream, Options options) : impl_(std::make_unique<Impl>()) {
  impl_->stream = stream;
  impl_->options = options;
  GPT_CUBLAS_CHECK(cublasLtCreate(&impl_->handle));
  GPT_CUDA_CHECK(cudaMalloc(&impl_->workspace, kWorkspaceBytes));
  GPT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&impl_->pref));
  const std::uint64_t workspace_bytes = kWorkspaceBytes;
  set_pref(impl_->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, workspace_bytes);
  // Only algorithms that work with 16-byte aligned operands (the default assumes 256).
  const std::uint32_t align = kAlignBytes;
  set_pref(impl_->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align);
  set_pref(impl_->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align);
  set_pref(impl_->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align);
  set_pref(impl_->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align);
  // Split-K partial sums in fp32 only: the in-place and output-type schemes would keep them in
  // bf16 (D's type) between the splits.
  const std::uint32_t reduction = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  set_pref(impl_->pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, reduction);
}

Matmul::~Matmul() = default;

Matmul::Stats Matmul::stats() const { return impl_->stats; }

void Matmul::forward(bf16* out, const bf16* inp, const bf16* w, const bf16* bias, int N, int C, int OC,
                     bf16* pre_gelu) {
  const std::string where = shape_text(pre_gelu ? "forward (GELU)" : "forward", "N", N, "C", C, "OC", OC);
  check_rows(where, N);
  check_row_length(where, "C", C);
  check_row_length(where, "OC", OC);
  check_pointer(where, "out", out, false);
  check_pointer(where, "inp", inp, false);
  check_pointer(where, "w", w, false);
  check_pointer(where, "bias", bias, true);
  check_pointer(where, "pre_gelu", pre_gelu, true);
  ZERO_CHECK(pre_gelu != out, where + ": pre_gelu and out must be different buffers");

  // out^T [OC,N] = w^T [OC,C] inp^T [C,N]: w read column-major is already w^T (ld OC), inp
  // read column-major is inp^T (ld C).
  Gemm g;
  g.m = OC;
  g.n = N;
  g.k = C;
  g.lda = OC;
  g.ldb = C;
  g.ldd = OC;
  const Epilogue plain = bias ? Epilogue::bias : Epilogue::none;
  if (!pre_gelu) {
    g.epilogue = plain;
    impl_->run(g, w, inp, out, 0.0f, bias);
    return;
  }
  if (impl_->options.gelu_epilogues) {
    // D receives GELU(product + bias), the aux matrix the product plus bias.
    g.epilogue = bias ? Epilogue::gelu_aux_bias : Epilogue::gelu_aux;
    if (impl_->run(g, w, inp, out, 0.0f, bias, pre_gelu)) return;
  }
  g.epilogue = plain;
  impl_->run(g, w, inp, pre_gelu, 0.0f, bias);
  gelu_forward(out, pre_gelu, static_cast<std::size_t>(N) * static_cast<std::size_t>(OC), impl_->stream);
  ++impl_->stats.gelu_fallbacks;
}

void Matmul::backward(bf16* dinp, bf16* dw, const bf16* dout, const bf16* inp, const bf16* w, int N, int C, int OC,
                      const bf16* pre_gelu) {
  const std::string where = shape_text(pre_gelu ? "backward (GELU)" : "backward", "N", N, "C", C, "OC", OC);
  check_rows(where, N);
  check_row_length(where, "C", C);
  check_row_length(where, "OC", OC);
  check_pointer(where, "dinp", dinp, true);
  check_pointer(where, "dw", dw, false);
  check_pointer(where, "dout", dout, false);
  check_pointer(where, "inp", inp, false);
  check_pointer(where, "w", w, false);
  check_pointer(where, "pre_gelu", pre_gelu, true);
  ZERO_CHECK(!pre_gelu || pre_gelu != dinp,
             where + ": dinp must not be pre_gelu (the GELU input is read while dinp is written)");

  // dw^T [OC,C] += dout^T [OC,N] inp [N,C]: dout read column-major is dout^T (ld OC); inp
  // read column-major is inp^T [C,N] (ld C), transposed back by op(B).
  Gemm gw;
  gw.trans_b = true;
  gw.m = OC;
  gw.n = C;
  gw.k = N;
  gw.lda = OC;
  gw.ldb = C;
  gw.ldd = OC;
  impl_->run(gw, dout, inp, dw, 1.0f);
  if (!dinp) return;

  // dinp^T [C,N] = w [C,OC] dout^T [OC,N]: w read column-major is w^T [OC,C] (ld OC),
  // transposed back by op(A); dout read column-major is dout^T (ld OC).
  Gemm gi;
  gi.trans_a = true;
  gi.m = C;
  gi.n = N;
  gi.k = OC;
  gi.lda = OC;
  gi.ldb = OC;
  gi.ldd = C;
  if (!pre_gelu) {
    impl_->run(gi, w, dout, dinp, 1.0f);
    return;
  }
  // The GELU-fused backward overwrites dinp (beta = 0), as ops.hpp says.
  if (impl_->options.gelu_epilogues) {
    gi.epilogue = Epilogue::dgelu;
    if (impl_->run(gi, w, dout, dinp, 0.0f, nullptr, pre_gelu)) return;
  }
  gi.epilogue = Epilogue::none;
  impl_->run(gi, w, dout, dinp, 0.0f);
  gelu_backward_inplace(dinp, pre_gelu, dinp, static_cast<std::size_t>(N) * static_cast<std::size_t>(C), impl_->stream);
  ++impl_->stats.gelu_fallbacks;
}

void Matmul::logits_forward(bf16* logits, const bf16* x, const bf16* wte, int N, int C, int Vp) {
  const std::string where = shape_text("logits_forward", "N", N, "C", C, "Vp", Vp);
  check_rows(where, N);
  check_row_length(where, "C", C);
  check_row_length(where, "Vp", Vp);
  check_pointer(where, "logits", logits, false);
  check_pointer(where, "x", x, false);
  check_pointer(where, "wte", wte, false);

  // logits^T [Vp,N] = wte [Vp,C] x^T [C,N]: wte read column-major is wte^T [C,Vp] (ld C),
  // transposed back by op(A); x read column-major is x^T (ld C).
  Gemm g;
  g.trans_a = true;
  g.m = Vp;
  g.n = N;
  g.k = C;
  g.lda = C;
  g.ldb = C;
  g.ldd = Vp;
  impl_->run(g, wte, x, logits, 0.0f);
}

void Matmul::logits_backward(bf16* dx, bf16* dwte, const bf16* dlogits, const bf16* x, const bf16* wte, int N, int C,
                             int Vp) {
  const std::string where = shape_text("logits_backward", "N", N, "C", C, "Vp", Vp);
  check_rows(where, N);
  check_row_length(where, "C", C);
  check_row_length(where, "Vp", Vp);
  check_pointer(where, "dx", dx, true);
  check_pointer(where, "dwte", dwte, false);
  check_pointer(where, "dlogits", dlogits, false);
  check_pointer(where, "x", x, false);
  check_pointer(where, "wte", wte, false);

  // dwte^T [C,Vp] += x^T [C,N] dlogits [N,Vp]: x read column-major is x^T (ld C); dlogits
  // read column-major is dlogits^T [Vp,N] (ld Vp), transposed back by op(B).
  Gemm gw;
  gw.trans_b = true;
  gw.m = C;
  gw.n = Vp;
  gw.k = N;
  gw.lda = C;
  gw.ldb = Vp;
  gw.ldd = C;
  impl_->run(gw, x, dlogits, dwte, 1.0f);
  if (!dx) return;

  // dx^T [C,N] += wte^T [C,Vp] dlogits^T [Vp,N]: both read column-major as they are stored.
  Gemm gx;
  gx.m = C;
  gx.n = N;
  gx.k = Vp;
  gx.lda = C;
  gx.ldb = Vp;
  gx.ldd = C;
  impl_->run(gx, wte, dlogits, dx, 1.0f);
}

}  // namespace zero::gpt::cuda
