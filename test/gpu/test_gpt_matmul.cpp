// CudaOps' matrix products (cuBLASLt, bf16, fp32 accumulation) against the host kernels in
// double precision.
//
// Every input is drawn at random and rounded to bf16 first; the reference runs
// host_kernels.hpp's double instantiation on exactly those values, so what is left to tolerate
// is the GPU's own arithmetic. An element of a product D = A B (+ D0) over K terms passes when
//
//   |got - want| <= 2^-8 |want| + (K + 2) 2^-22 (|A| |B| + |D0|)
//
// 2^-8 is bf16's unit roundoff (8 significant bits, round to nearest) for the rounding of the
// output; (K + 2) 2^-24 bounds fp32 accumulation of K exact bf16 products plus the initial
// value and bias, taken 4x larger (2^-22) for tensor cores' truncating adds. |A| |B| is the
// same product on absolute values (the host kernel run on |inputs|), which also keeps the
// bound tight where the result cancels to near zero. The GELU outputs add the propagation of
// the pre-activation's error through GELU (|GELU'| < 1.13, taken as 1.2) and the error of a
// hardware tanh approximation (~2^-11 absolute, taken as 2^-10 scaled by how strongly tanh
// enters the formula). A wrong transpose, a missing bias or a lost += misses by O(1).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gpt/cuda/cuda_ops.hpp"
#include "gpt/cuda/matmul.hpp"
#include "gpt/host_kernels.hpp"
#include "gpt/ops.hpp"
#include "zero/dtype.hpp"
#include "zero/error.hpp"

namespace {

using zero::gpt::Act;
using zero::gpt::Ops;

constexpr double kRound = 0x1p-8;  // bf16 unit roundoff
double acc_eps(int K) { return (K + 2) * 0x1p-22; }
constexpr double kGeluSlope = 1.2;  // > max |GELU'(x)| = 1.13

// bf16 values on the host: the bits the device gets and the same values in double.
struct Tensor {
  std::vector<std::uint16_t> bits;
  std::vector<double> val;
};

Tensor random_tensor(std::size_t n, std::uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  Tensor t;
  t.bits.resize(n);
  t.val.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    t.bits[i] = zero::f32_to_bf16_bits(normal(rng));
    t.val[i] = zero::bf16_bits_to_f32(t.bits[i]);
  }
  return t;
}

std::vector<double> abs_of(const std::vector<double>& v) {
  std::vector<double> a(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) a[i] = std::fabs(v[i]);
  return a;
}

// A device buffer of bf16 elements from the Ops under test.
class DeviceTensor {
 public:
  DeviceTensor(Ops& ops, std::size_t n)
      : ops_(ops), n_(n), p_(static_cast<Act*>(ops.allocate(n * sizeof(std::uint16_t)))) {}
  DeviceTensor(Ops& ops, const Tensor& t) : DeviceTensor(ops, t.bits.size()) { set(t); }
  ~DeviceTensor() { ops_.deallocate(p_); }
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;

  Act* get() const { return p_; }
  zero::gpt::cuda::bf16* bf16() const { return reinterpret_cast<zero::gpt::cuda::bf16*>(p_); }
  void set(const Tensor& t) {
    REQUIRE(t.bits.size() == n_);
    ops_.upload(p_, t.bits.data(), n_ * sizeof(std::uint16_t));
    ops_.synchronize();
  }
  std::vector<double> values() const {
    std::vector<std::uint16_t> bits(n_);
    ops_.download(bits.data(), p_, n_ * sizeof(std::uint16_t));
    std::vector<double> v(n_);
    for (std::size_t i = 0; i < n_; ++i) v[i] = zero::bf16_bits_to_f32(bits[i]);
    return v;
  }

 private:
  Ops& ops_;
  std::size_t n_;
  Act* p_;
};

// Every element within 2^-8 |want| + slack[i] (NaN fails).
void require_close(const std::vector<double>& got, const std::vector<double>& want, const std::vector<double>& slack,
                   const std::string& what) {
  REQUIRE(got.size() == want.size());
  REQUIRE(slack.size() == want.size());
  std::size_t bad = 0, first = 0;
  double worst = 0;  // largest error / tolerance
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double tol = kRound * std::fabs(want[i]) + slack[i];
    const double err = std::fabs(got[i] - want[i]);
    if (!(err <= tol)) {
      if (bad++ == 0) first = i;
    }
    if (tol > 0) worst = std::max(worst, err / tol);
  }
  std::ostringstream s;
  s << what << ": " << bad << " of " << want.size() << " elements out of tolerance";
  if (bad)
    s << "; first at " << first << ": got " << got[first] << ", want " << want[first] << ", tolerance "
      << kRound * std::fabs(want[first]) + slack[first];
  s << "; worst error/tolerance " << worst;
  INFO(s.str());
  CHECK(bad == 0);
}

std::vector<double> scaled(const std::vector<double>& v, double f) {
  std::vector<double> r(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) r[i] = f * v[i];
  return r;
}

// A stream the Ops under test enqueue on.
class Stream {
 public:
  Stream() { REQUIRE(cudaStreamCreate(&s_) == cudaSuccess); }
  ~Stream() { cudaStreamDestroy(s_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

struct Shape {
  int N, C, OC;
};
// GPT-2-like (qkv 3C, fc 4C, proj back to C), an odd row count and a single row.
const Shape kShapes[] = {{64, 64, 192}, {64, 128, 512}, {64, 256, 64}, {37, 64, 256}, {1, 64, 192}};

std::string shape_name(const Shape& s) {
  return "N=" + std::to_string(s.N) + " C=" + std::to_string(s.C) + " OC=" + std::to_string(s.OC);
}

std::size_t sz(int a, int b) { return static_cast<std::size_t>(a) * static_cast<std::size_t>(b); }

// Tolerance on GELU(pre) given the tolerance on pre.
std::vector<double> gelu_slack(const std::vector<double>& pre, const std::vector<double>& pre_slack) {
  std::vector<double> s(pre.size());
  for (std::size_t i = 0; i < pre.size(); ++i) {
    const double x = std::fabs(pre[i]);
    // pre's own error (its bf16 rounding where the GELU kernel reads the stored pre) through
    // GELU's slope, and 0.5 x times a tanh approximation's error.
    s[i] = kGeluSlope * (kRound * x + pre_slack[i]) + 0x1p-10 * x;
  }
  return s;
}

// Error of a GELU'(x) evaluated with an approximate tanh (abs. error e): e times
// |d GELU'/d tanh| = |0.5 - x th du| <= 0.5 + |x| 0.8 (1 + 0.134 x^2), with e = 2^-10.
double dgelu_error(double x) {
  const double a = std::fabs(x);
  return 0x1p-10 * (0.5 + a * (0.8 + 0.11 * a * a));
}

// --- forward ---

void check_forward(Ops& ops, const Shape& sh, bool with_bias, bool with_gelu, zero::gpt::cuda::Matmul* matmul) {
  const auto [N, C, OC] = sh;
  const Tensor inp = random_tensor(sz(N, C), 11, 1.0f);
  const Tensor w = random_tensor(sz(C, OC), 12, 1.0f / std::sqrt(static_cast<float>(C)));
  const Tensor bias = random_tensor(static_cast<std::size_t>(OC), 13, 0.5f);
  // Garbage in the outputs: everything must be overwritten.
  const Tensor junk = random_tensor(sz(N, OC), 14, 3.0f);

  DeviceTensor d_inp(ops, inp), d_w(ops, w), d_bias(ops, bias), d_out(ops, junk), d_pre(ops, junk);
  const Act* b = with_bias ? d_bias.get() : nullptr;
  Act* pre = with_gelu ? d_pre.get() : nullptr;
  if (matmul) {
    matmul->forward(d_out.bf16(), d_inp.bf16(), d_w.bf16(), with_bias ? d_bias.bf16() : nullptr, N, C, OC,
                    with_gelu ? d_pre.bf16() : nullptr);
  } else {
    ops.matmul_forward(d_out.get(), d_inp.get(), d_w.get(), b, N, C, OC, pre);
  }

  std::vector<double> want(sz(N, OC)), absw(sz(N, OC));
  zero::gpt::host::matmul_forward(want.data(), inp.val.data(), w.val.data(), with_bias ? bias.val.data() : nullptr, N,
                                  C, OC);
  const std::vector<double> abias = abs_of(bias.val);
  zero::gpt::host::matmul_forward(absw.data(), abs_of(inp.val).data(), abs_of(w.val).data(),
                                  with_bias ? abias.data() : nullptr, N, C, OC);
  const std::vector<double> slack = scaled(absw, acc_eps(C));
  const std::string name = shape_name(sh) + (with_bias ? " bias" : " no bias");
  if (!with_gelu) {
    require_close(d_out.values(), want, slack, "forward " + name + ": out");
    return;
  }
  require_close(d_pre.values(), want, slack, "forward GELU " + name + ": pre_gelu");
  std::vector<double> want_out(want.size());
  zero::gpt::host::gelu_forward(want_out.data(), want.data(), want.size());
  require_close(d_out.values(), want_out, gelu_slack(want, slack), "forward GELU " + name + ": out");
}

// --- backward ---

struct BackwardCase {
  bool dinp = true;
  bool dbias = true;
  bool gelu = false;
};

void check_backward(Ops& ops, const Shape& sh, BackwardCase bc, zero::gpt::cuda::Matmul* matmul) {
  const auto [N, C, OC] = sh;
  const Tensor dout = random_tensor(sz(N, OC), 21, 1.0f);
  const Tensor inp = random_tensor(sz(N, C), 22, 1.0f);
  const Tensor w = random_tensor(sz(C, OC), 23, 1.0f / std::sqrt(static_cast<float>(C)));
  const Tensor pre = random_tensor(sz(N, C), 24, 1.5f);
  // Non-zero gradients already there: the products must add to them (except the GELU-fused
  // dinp, which they must overwrite).
  const Tensor dinp0 = random_tensor(sz(N, C), 25, 1.0f);
  const Tensor dw0 = random_tensor(sz(C, OC), 26, 1.0f);
  const Tensor db0 = random_tensor(static_cast<std::size_t>(OC), 27, 1.0f);

  DeviceTensor d_dout(ops, dout), d_inp(ops, inp), d_w(ops, w), d_pre(ops, pre), d_dinp(ops, dinp0), d_dw(ops, dw0),
      d_db(ops, db0);
  Act* dinp = bc.dinp ? d_dinp.get() : nullptr;
  if (matmul) {
    REQUIRE(!bc.dbias);  // Matmul has no bias gradient
    matmul->backward(bc.dinp ? d_dinp.bf16() : nullptr, d_dw.bf16(), d_dout.bf16(), d_inp.bf16(), d_w.bf16(), N, C, OC,
                     bc.gelu ? d_pre.bf16() : nullptr);
  } else {
    ops.matmul_backward(dinp, d_dw.get(), bc.dbias ? d_db.get() : nullptr, d_dout.get(), d_inp.get(), d_w.get(), N, C,
                        OC, bc.gelu ? d_pre.get() : nullptr);
  }

  // prod = dout w^T alone (from zero), dw and db added to their initial values.
  std::vector<double> prod(sz(N, C), 0.0), want_dw = dw0.val, want_db = db0.val;
  zero::gpt::host::matmul_backward(prod.data(), want_dw.data(), want_db.data(), dout.val.data(), inp.val.data(),
                                   w.val.data(), N, C, OC);
  std::vector<double> abs_prod(sz(N, C), 0.0), abs_dw = abs_of(dw0.val), abs_db = abs_of(db0.val);
  zero::gpt::host::matmul_backward(abs_prod.data(), abs_dw.data(), abs_db.data(), abs_of(dout.val).data(),
                                   abs_of(inp.val).data(), abs_of(w.val).data(), N, C, OC);

  const std::string name =
      shape_name(sh) + (bc.gelu ? " GELU" : "") + (bc.dinp ? "" : " no dinp") + (bc.dbias ? "" : " no dbias");
  require_close(d_dw.values(), want_dw, scaled(abs_dw, acc_eps(N)), "backward " + name + ": dw");
  if (bc.dbias)
    require_close(d_db.values(), want_db, scaled(abs_db, acc_eps(N)), "backward " + name + ": dbias");
  else
    require_close(d_db.values(), db0.val, std::vector<double>(db0.val.size(), 0.0),
                  "backward " + name + ": dbias untouched");

  if (!bc.dinp) {
    require_close(d_dinp.values(), dinp0.val, std::vector<double>(dinp0.val.size(), 0.0),
                  "backward " + name + ": dinp untouched");
    return;
  }
  if (!bc.gelu) {
    std::vector<double> want = dinp0.val, abs_want = abs_of(dinp0.val);
    for (std::size_t i = 0; i < want.size(); ++i) {
      want[i] += prod[i];
      abs_want[i] += abs_prod[i];
    }
    require_close(d_dinp.values(), want, scaled(abs_want, acc_eps(OC)), "backward " + name + ": dinp");
    return;
  }
  // dinp = prod * GELU'(pre), overwritten.
  std::vector<double> want(sz(N, C), 0.0);
  zero::gpt::host::gelu_backward(want.data(), pre.val.data(), prod.data(), want.size());
  std::vector<double> slack(want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    // The product's accumulation (and its bf16 rounding where the GELU kernel reads it back)
    // through |GELU'|, plus the approximate GELU' times the product.
    const double p = std::fabs(prod[i]);
    slack[i] = kGeluSlope * (acc_eps(OC) * abs_prod[i] + kRound * p) + dgelu_error(pre.val[i]) * p;
  }
  require_close(d_dinp.values(), want, slack, "backward " + name + ": dinp = dout w^T GELU'");
}

// --- logits ---

struct LogitsShape {
  int N, C, V;
};
const LogitsShape kLogitsShapes[] = {{64, 64, 1000}, {37, 128, 200}, {1, 64, 50}};

int padded_vocab(int V) { return (V + 127) / 128 * 128; }

void check_logits(Ops& ops, const LogitsShape& ls) {
  const int N = ls.N, C = ls.C, Vp = padded_vocab(ls.V);
  const std::string name = "N=" + std::to_string(N) + " C=" + std::to_string(C) + " Vp=" + std::to_string(Vp);
  const Tensor x = random_tensor(sz(N, C), 31, 1.0f);
  const Tensor wte = random_tensor(sz(Vp, C), 32, 0.5f);
  const Tensor junk = random_tensor(sz(N, Vp), 33, 3.0f);
  const Tensor dlogits = random_tensor(sz(N, Vp), 34, 0.1f);
  const Tensor dx0 = random_tensor(sz(N, C), 35, 1.0f);
  const Tensor dwte0 = random_tensor(sz(Vp, C), 36, 1.0f);

  DeviceTensor d_x(ops, x), d_wte(ops, wte), d_logits(ops, junk), d_dlogits(ops, dlogits), d_dx(ops, dx0),
      d_dwte(ops, dwte0);
  ops.logits_forward(d_logits.get(), d_x.get(), d_wte.get(), N, C, Vp);
  ops.logits_backward(d_dx.get(), d_dwte.get(), d_dlogits.get(), d_x.get(), d_wte.get(), N, C, Vp);

  std::vector<double> want(sz(N, Vp)), abs_want(sz(N, Vp));
  zero::gpt::host::logits_forward(want.data(), x.val.data(), wte.val.data(), N, C, Vp);
  zero::gpt::host::logits_forward(abs_want.data(), abs_of(x.val).data(), abs_of(wte.val).data(), N, C, Vp);
  require_close(d_logits.values(), want, scaled(abs_want, acc_eps(C)), "logits_forward " + name);

  std::vector<double> want_dx = dx0.val, want_dwte = dwte0.val;
  zero::gpt::host::logits_backward(want_dx.data(), want_dwte.data(), dlogits.val.data(), x.val.data(), wte.val.data(),
                                   N, C, Vp);
  std::vector<double> abs_dx = abs_of(dx0.val), abs_dwte = abs_of(dwte0.val);
  zero::gpt::host::logits_backward(abs_dx.data(), abs_dwte.data(), abs_of(dlogits.val).data(), abs_of(x.val).data(),
                                   abs_of(wte.val).data(), N, C, Vp);
  require_close(d_dx.values(), want_dx, scaled(abs_dx, acc_eps(Vp)), "logits_backward " + name + ": dx");
  require_close(d_dwte.values(), want_dwte, scaled(abs_dwte, acc_eps(N)), "logits_backward " + name + ": dwte");
}

}  // namespace

TEST_CASE("CudaOps matmul_forward matches the host reference", "[gpt][matmul]") {
  Stream stream;
  auto ops = zero::gpt::make_cuda_ops(stream.get());
  REQUIRE(ops->dtype() == zero::DType::bf16);
  REQUIRE_FALSE(ops->host_memory());
  for (const Shape& sh : kShapes) {
    for (bool bias : {false, true}) {
      check_forward(*ops, sh, bias, false, nullptr);
      check_forward(*ops, sh, bias, true, nullptr);
    }
  }
}

TEST_CASE("CudaOps matmul_backward matches the host reference", "[gpt][matmul]") {
  Stream stream;
  auto ops = zero::gpt::make_cuda_ops(stream.get());
  for (const Shape& sh : kShapes) {
    check_backward(*ops, sh, {.dinp = true, .dbias = true, .gelu = false}, nullptr);
    check_backward(*ops, sh, {.dinp = false, .dbias = true, .gelu = false}, nullptr);
    check_backward(*ops, sh, {.dinp = true, .dbias = false, .gelu = false}, nullptr);
    check_backward(*ops, sh, {.dinp = true, .dbias = true, .gelu = true}, nullptr);
  }
}

TEST_CASE("CudaOps logits_forward and logits_backward match the host reference", "[gpt][matmul]") {
  Stream stream;
  auto ops = zero::gpt::make_cuda_ops(stream.get());
  for (const LogitsShape& ls : kLogitsShapes) check_logits(*ops, ls);
}

TEST_CASE("Matmul's GELU paths, fused and separate, match the host reference", "[gpt][matmul]") {
  Stream stream;
  auto ops = zero::gpt::make_cuda_ops(stream.get());  // memory only
  for (bool epilogues : {true, false}) {
    zero::gpt::cuda::Matmul matmul(stream.get(), {.gelu_epilogues = epilogues});
    for (const Shape& sh : kShapes) {
      check_forward(*ops, sh, true, true, &matmul);
      check_forward(*ops, sh, false, true, &matmul);
      check_backward(*ops, sh, {.dinp = true, .dbias = false, .gelu = true}, &matmul);
    }
    const auto st = matmul.stats();
    if (epilogues) {
      // Not a failure: cuBLASLt may lack a GELU epilogue for some shape; say so.
      if (st.gelu_fallbacks != 0)
        WARN("cuBLASLt's GELU epilogues were unavailable for " << st.gelu_fallbacks << " of the calls");
    } else {
      CHECK(st.gelu_fallbacks == 3 * std::size(kShapes));
    }
  }
}

TEST_CASE("Matmul plans each product once", "[gpt][matmul]") {
  Stream stream;
  auto ops = zero::gpt::make_cuda_ops(stream.get());  // memory only
  zero::gpt::cuda::Matmul matmul(stream.get());
  const Shape sh{64, 64, 256};
  check_forward(*ops, sh, true, false, &matmul);
  check_forward(*ops, sh, true, true, &matmul);
  check_backward(*ops, sh, {.dinp = true, .dbias = false, .gelu = false}, &matmul);
  const auto first = matmul.stats();
  CHECK(first.plans > 0);
  CHECK(first.heuristic_queries == first.plans);
  for (int i = 0; i < 3; ++i) {
    check_forward(*ops, sh, true, false, &matmul);
    check_forward(*ops, sh, true, true, &matmul);
    check_backward(*ops, sh, {.dinp = true, .dbias = false, .gelu = false}, &matmul);
  }
  const auto later = matmul.stats();
  CHECK(later.plans == first.plans);
  CHECK(later.heuristic_queries == first.heuristic_queries);
}

TEST_CASE("CudaOps products refuse unaligned shapes and pointers", "[gpt][matmul]") {
  Stream stream;
  auto ops = zero::gpt::make_cuda_ops(stream.get());
  const std::size_t elems = 64 * 256;
  DeviceTensor a(*ops, elems), b(*ops, elems), c(*ops, elems);
  const std::size_t es = ops->elem_bytes();
  // Row lengths that are not multiples of 8 elements.
  CHECK_THROWS_AS(ops->matmul_forward(a.get(), b.get(), c.get(), nullptr, 16, 64, 100), zero::Error);
  CHECK_THROWS_WITH(ops->matmul_forward(a.get(), b.get(), c.get(), nullptr, 16, 60, 64), Catch::Contains("C = 60"));
  CHECK_THROWS_AS(ops->logits_forward(a.get(), b.get(), c.get(), 16, 64, 1001), zero::Error);
  CHECK_THROWS_AS(ops->matmul_backward(a.get(), b.get(), nullptr, c.get(), a.get(), b.get(), 16, 64, 36), zero::Error);
  // A pointer one element (2 bytes) off 16-byte alignment.
  Act* odd = zero::gpt::act_offset(a.get(), 1, es);
  CHECK_THROWS_WITH(ops->matmul_forward(odd, b.get(), c.get(), nullptr, 16, 64, 64), Catch::Contains("aligned"));
  CHECK_THROWS_WITH(ops->matmul_forward(a.get(), b.get(), c.get(), odd, 16, 64, 64), Catch::Contains("bias"));
  CHECK_THROWS_AS(ops->logits_backward(a.get(), b.get(), odd, a.get(), c.get(), 16, 64, 128), zero::Error);
  // Rows must exist; pre_gelu must not be out.
  CHECK_THROWS_AS(ops->matmul_forward(a.get(), b.get(), c.get(), nullptr, 0, 64, 64), zero::Error);
  CHECK_THROWS_AS(ops->matmul_forward(a.get(), b.get(), c.get(), nullptr, 16, 64, 64, a.get()), zero::Error);
  // Nothing was enqueued by the refused calls, and the stream is still healthy.
  ops->synchronize();
}
