// The CUDA operations of the llama and bloom blocks (RMSNorm, rotary positions, SwiGLU,
// grouped-query and ALiBi attention, the encoder without learned positions) through CudaOps,
// against HostOps (fp32, host_kernels.cpp: the reference semantics) on the same bf16-rounded
// random inputs.
//
// Tolerances: CudaOps stores every output in bf16 (at most 2^-9 relative, about 2^-9 / sqrt(3)
// root-mean-square over many values) and computes in fp32; attention also rounds its
// probabilities and score gradients to bf16 before the tensor-core products. Each output is
// compared as a whole by its relative error norm ||got - want|| / ||want||: the element-wise
// operations must stay within kElementRel = 1e-2 (rounding alone gives ~2e-3), attention within
// kAttentionRel = 3e-2. A wrong index (a key/value head read from the wrong group, a missing or
// misplaced ALiBi slope, a rotation pair or sign mixed up) moves an output by a good fraction of
// its norm. Backward passes start from non-zero gradients (they add), except SwiGLU's, which
// overwrites and starts from garbage; the deterministic ones run twice and must agree bit for bit.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gpt/attention_shape.hpp"
#include "gpt/cuda/cuda_ops.hpp"
#include "gpt/ops.hpp"
#include "zero/dtype.hpp"

using namespace zero::gpt;

namespace {

constexpr double kElementRel = 1e-2;
constexpr double kAttentionRel = 3e-2;

std::vector<float> random_values(std::size_t n, std::uint64_t seed, double scale = 1.0, double offset = 0.0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> d(offset, scale);
  std::vector<float> v(n);
  for (float& x : v) x = zero::round_to(zero::DType::bf16, static_cast<float>(d(rng)));
  return v;
}

// n elements of an Ops' dtype in its memory, read and written as fp32 values.
class Buffer {
 public:
  Buffer(Ops& ops, std::size_t n)
      : ops_(ops), n_(n), p_(ops.allocate(std::max<std::size_t>(n, 1) * ops.elem_bytes())) {}
  Buffer(Ops& ops, const std::vector<float>& v) : Buffer(ops, v.size()) { set(v); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { ops_.deallocate(p_); }
  Act* act() const { return static_cast<Act*>(p_); }
  void set(const std::vector<float>& v) {
    REQUIRE(v.size() == n_);
    std::vector<unsigned char> raw(n_ * ops_.elem_bytes());
    zero::convert(v.data(), zero::DType::f32, raw.data(), ops_.dtype(), n_);
    ops_.upload(p_, raw.data(), raw.size());
  }
  std::vector<unsigned char> bytes() const {
    std::vector<unsigned char> raw(n_ * ops_.elem_bytes());
    ops_.download(raw.data(), p_, raw.size());
    return raw;
  }
  std::vector<float> get() const {
    const std::vector<unsigned char> raw = bytes();
    std::vector<float> v(n_);
    zero::convert(raw.data(), ops_.dtype(), v.data(), zero::DType::f32, n_);
    return v;
  }

 private:
  Ops& ops_;
  std::size_t n_;
  void* p_;
};

// fp32 values (statistics) in an Ops' memory.
class Floats {
 public:
  Floats(Ops& ops, std::size_t n) : ops_(ops), n_(n), p_(ops.allocate(std::max<std::size_t>(n, 1) * sizeof(float))) {}
  Floats(const Floats&) = delete;
  Floats& operator=(const Floats&) = delete;
  ~Floats() { ops_.deallocate(p_); }
  float* get() const { return static_cast<float*>(p_); }
  std::vector<float> values() const {
    std::vector<float> v(n_);
    ops_.download(v.data(), p_, n_ * sizeof(float));
    return v;
  }

 private:
  Ops& ops_;
  std::size_t n_;
  void* p_;
};

double rel_error(const std::vector<float>& got, const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  double d2 = 0, w2 = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    d2 += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
    w2 += static_cast<double>(want[i]) * want[i];
  }
  REQUIRE(w2 > 0);  // an all-zero reference would prove nothing
  return std::sqrt(d2 / w2);
}

void check_close(const char* what, const std::vector<float>& got, const std::vector<float>& want, double tol) {
  const double rel = rel_error(got, want);
  INFO(what << ": relative error norm " << rel << " (tolerance " << tol << ")");
  CHECK(rel <= tol);
}

struct Both {
  std::unique_ptr<Ops> dev = make_cuda_ops(nullptr);
  std::unique_ptr<Ops> host = make_host_ops();
};

AttentionShape shape(int B, int T, int NH, int NKV, int hs, int alibi_heads = 0, int head0 = 0) {
  return AttentionShape{B, T, NH, NKV, hs, alibi_heads, head0};
}

std::string describe(const AttentionShape& s) {
  return "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) + " NH=" + std::to_string(s.NH) +
         " NKV=" + std::to_string(s.NKV) + " hs=" + std::to_string(s.hs) +
         " alibi_heads=" + std::to_string(s.alibi_heads) + " head0=" + std::to_string(s.head0);
}

void run_rmsnorm(int N, int C, std::uint64_t seed) {
  INFO("N=" << N << " C=" << C);
  Both o;
  const float eps = 1e-5f;
  const auto x = random_values(static_cast<std::size_t>(N) * C, seed, 1.0, 0.3);
  const auto w = random_values(static_cast<std::size_t>(C), seed + 1, 0.2, 1.0);
  const auto dy = random_values(static_cast<std::size_t>(N) * C, seed + 2);
  const auto dx0 = random_values(static_cast<std::size_t>(N) * C, seed + 3, 0.5);
  const auto dw0 = random_values(static_cast<std::size_t>(C), seed + 4, 0.5);
  std::vector<float> out[2], rstd[2], dx[2], dw[2];
  std::vector<unsigned char> dw_bits[2];
  Ops* ops[2] = {o.dev.get(), o.host.get()};
  for (int k = 0; k < 2; ++k) {
    Ops& op = *ops[k];
    Buffer bx(op, x), bw(op, w), bdy(op, dy), bout(op, x.size()), bdx(op, dx0), bdw(op, dw0);
    Floats br(op, static_cast<std::size_t>(N));
    op.rmsnorm_forward(bout.act(), br.get(), bx.act(), bw.act(), N, C, eps);
    op.rmsnorm_backward(bdx.act(), bdw.act(), bdy.act(), bx.act(), bw.act(), br.get(), N, C);
    out[k] = bout.get();
    rstd[k] = br.values();
    dx[k] = bdx.get();
    dw[k] = bdw.get();
    if (k == 0) {
      // The same backward again from the same start: the same bits.
      dw_bits[0] = bdw.bytes();
      bdw.set(dw0);
      op.rmsnorm_backward(bdx.act(), bdw.act(), bdy.act(), bx.act(), bw.act(), br.get(), N, C);
      dw_bits[1] = bdw.bytes();
    }
  }
  check_close("out", out[0], out[1], kElementRel);
  check_close("rstd", rstd[0], rstd[1], 1e-5);
  check_close("dinp", dx[0], dx[1], kElementRel);
  check_close("dw", dw[0], dw[1], kElementRel);
  CHECK(dw_bits[0] == dw_bits[1]);
}

void run_rotary(const AttentionShape& s, float theta, std::uint64_t seed) {
  INFO(describe(s) << " theta=" << theta);
  Both o;
  const std::size_t n = static_cast<std::size_t>(s.B) * s.T * s.qkv_width();
  const auto qkv = random_values(n, seed);
  const auto dqkv = random_values(n, seed + 1);
  std::vector<float> fwd[2], bwd[2], round_trip;
  Ops* ops[2] = {o.dev.get(), o.host.get()};
  for (int k = 0; k < 2; ++k) {
    Ops& op = *ops[k];
    Buffer a(op, qkv), d(op, dqkv);
    op.rotary_forward(a.act(), s, theta);
    fwd[k] = a.get();
    op.rotary_backward(d.act(), s, theta);
    bwd[k] = d.get();
    if (k == 0) {
      op.rotary_backward(a.act(), s, theta);  // the transpose of a rotation is its inverse
      round_trip = a.get();
    }
  }
  check_close("rotary_forward", fwd[0], fwd[1], kElementRel);
  check_close("rotary_backward", bwd[0], bwd[1], kElementRel);
  check_close("rotary_backward(rotary_forward(x))", round_trip, qkv, kElementRel);
  // The value heads are left alone, bit for bit.
  const std::size_t W = static_cast<std::size_t>(s.qkv_width());
  const std::size_t v0 = static_cast<std::size_t>(s.NH + s.NKV) * s.hs;
  std::size_t changed = 0;
  for (std::size_t r = 0; r < n / W; ++r)
    for (std::size_t c = v0; c < W; ++c) changed += fwd[0][r * W + c] != qkv[r * W + c];
  CHECK(changed == 0);
}

void run_swiglu(int N, int F, std::uint64_t seed) {
  INFO("N=" << N << " F=" << F);
  Both o;
  const std::size_t nf = static_cast<std::size_t>(N) * F;
  const auto inp = random_values(2 * nf, seed, 1.5);
  const auto dy = random_values(nf, seed + 1);
  const auto garbage = random_values(2 * nf, seed + 2, 100.0);
  std::vector<float> out[2], din[2], din_aliased;
  Ops* ops[2] = {o.dev.get(), o.host.get()};
  for (int k = 0; k < 2; ++k) {
    Ops& op = *ops[k];
    Buffer bi(op, inp), bo(op, nf), bdy(op, dy), bdi(op, garbage);
    op.swiglu_forward(bo.act(), bi.act(), N, F);
    op.swiglu_backward(bdi.act(), bdy.act(), bi.act(), N, F);
    out[k] = bo.get();
    din[k] = bdi.get();
    if (k == 0) {
      op.swiglu_backward(bi.act(), bdy.act(), bi.act(), N, F);  // dinp aliasing inp
      din_aliased = bi.get();
    }
  }
  check_close("swiglu_forward", out[0], out[1], kElementRel);
  check_close("swiglu_backward", din[0], din[1], kElementRel);
  CHECK(din_aliased == din[0]);
}

void run_attention(const AttentionShape& s, std::uint64_t seed) {
  INFO(describe(s));
  Both o;
  const std::size_t rows = static_cast<std::size_t>(s.B) * s.T;
  const auto qkv = random_values(rows * s.qkv_width(), seed);
  const auto dout = random_values(rows * s.width(), seed + 1);
  const auto dqkv0 = random_values(rows * s.qkv_width(), seed + 2, 0.01);
  std::vector<float> out[2], dqkv[2];
  std::vector<unsigned char> bits[2];
  Ops* ops[2] = {o.dev.get(), o.host.get()};
  for (int k = 0; k < 2; ++k) {
    Ops& op = *ops[k];
    Buffer bq(op, qkv), bo(op, rows * s.width()), bdo(op, dout), bdq(op, dqkv0);
    Floats stats(op, op.attention_stats_floats(s.B, s.T, s.NH));
    Floats scratch(op, op.attention_scratch_floats(s.B, s.T, s.NH));
    op.attention_forward(bo.act(), stats.get(), bq.act(), s);
    op.attention_backward(bdq.act(), scratch.get(), bdo.act(), bq.act(), bo.act(), stats.get(), s);
    out[k] = bo.get();
    dqkv[k] = bdq.get();
    if (k == 0) {
      bits[0] = bdq.bytes();
      bdq.set(dqkv0);
      op.attention_backward(bdq.act(), scratch.get(), bdo.act(), bq.act(), bo.act(), stats.get(), s);
      bits[1] = bdq.bytes();
    }
  }
  check_close("attention out", out[0], out[1], kAttentionRel);
  // q, k and v gradients apart, so that one part's error is not hidden by another's norm.
  const std::size_t W = static_cast<std::size_t>(s.qkv_width());
  const std::size_t k0 = static_cast<std::size_t>(s.NH) * s.hs, v0 = k0 + static_cast<std::size_t>(s.NKV) * s.hs;
  const char* names[3] = {"dq", "dk", "dv"};
  const std::size_t begin[3] = {0, k0, v0}, end[3] = {k0, v0, W};
  for (int part = 0; part < 3; ++part) {
    std::vector<float> got, want;
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t c = begin[part]; c < end[part]; ++c) {
        // The gradient added, without the starting values (which would dilute the error).
        got.push_back(dqkv[0][r * W + c] - dqkv0[r * W + c]);
        want.push_back(dqkv[1][r * W + c] - dqkv0[r * W + c]);
      }
    check_close(names[part], got, want, kAttentionRel);
  }
  CHECK(bits[0] == bits[1]);
}

}  // namespace

TEST_CASE("CudaOps rmsnorm forward and backward match HostOps", "[gpt][arch]") {
  SECTION("C a multiple of 8") { run_rmsnorm(37, 128, 1); }
  SECTION("C not a multiple of 8, one row") { run_rmsnorm(1, 100, 2); }
  SECTION("many rows (several column blocks)") { run_rmsnorm(300, 96, 3); }
}

TEST_CASE("CudaOps rotary forward and backward match HostOps", "[gpt][arch]") {
  SECTION("grouped-query heads, hs 64") { run_rotary(shape(2, 33, 4, 2, 64), 10000.0f, 11); }
  SECTION("hs 32, T 130, theta 5e5") { run_rotary(shape(1, 130, 2, 1, 32), 500000.0f, 12); }
}

TEST_CASE("CudaOps swiglu forward and backward match HostOps", "[gpt][arch]") {
  SECTION("F a multiple of 8") { run_swiglu(29, 136, 21); }
  SECTION("F not a multiple of 8") { run_swiglu(7, 100, 22); }
}

TEST_CASE("CudaOps grouped-query and ALiBi attention match HostOps", "[gpt][arch][attention]") {
  SECTION("GQA: NH 4, NKV 2, hs 64, T 100") { run_attention(shape(2, 100, 4, 2, 64), 31); }
  SECTION("GQA: NH 4, NKV 1, hs 32, T 130") { run_attention(shape(1, 130, 4, 1, 32), 32); }
  SECTION("ALiBi: 4 of 4 heads, hs 32, T 64") { run_attention(shape(2, 64, 4, 4, 32, 4), 33); }
  SECTION("ALiBi: heads 2..5 of 8 (a tensor rank), hs 64, T 100") { run_attention(shape(1, 100, 4, 4, 64, 8, 2), 34); }
  SECTION("multi-head, no ALiBi (GPT-2), hs 64, T 65") { run_attention(shape(2, 65, 2, 2, 64), 35); }
}

TEST_CASE("CudaOps encoder without learned positions matches HostOps", "[gpt][arch]") {
  const int B = 2, T = 37, C = 64, V = 50;
  Both o;
  std::mt19937_64 rng(41);
  std::uniform_int_distribution<int> id(0, V - 1);
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(B) * T);
  for (auto& t : tokens) t = id(rng);
  const auto wte = random_values(static_cast<std::size_t>(V) * C, 42);
  const auto dout = random_values(static_cast<std::size_t>(B) * T * C, 43);
  const auto dwte0 = random_values(static_cast<std::size_t>(V) * C, 44, 0.1);
  std::vector<float> out[2], dwte[2], out_part[2], dwte_part[2];
  Ops* ops[2] = {o.dev.get(), o.host.get()};
  for (int k = 0; k < 2; ++k) {
    Ops& op = *ops[k];
    void* ids = op.allocate(tokens.size() * sizeof(std::int32_t));
    op.upload(ids, tokens.data(), tokens.size() * sizeof(std::int32_t));
    const auto* tok = static_cast<const std::int32_t*>(ids);
    {
      Buffer bw(op, wte), bo(op, static_cast<std::size_t>(B) * T * C), bdo(op, dout), bdw(op, dwte0);
      op.encoder_forward(bo.act(), tok, bw.act(), nullptr, B, T, C);
      op.encoder_backward(bdw.act(), nullptr, bdo.act(), tok, B, T, C);
      out[k] = bo.get();
      dwte[k] = bdw.get();
    }
    {
      // The part holding ids [10, 35).
      const int v0 = 10, vl = 25;
      const std::vector<float> part(wte.begin() + v0 * C, wte.begin() + (v0 + vl) * C);
      const std::vector<float> part0(dwte0.begin() + v0 * C, dwte0.begin() + (v0 + vl) * C);
      Buffer bw(op, part), bo(op, static_cast<std::size_t>(B) * T * C), bdo(op, dout), bdw(op, part0);
      op.encoder_forward_part(bo.act(), tok, bw.act(), nullptr, B, T, C, v0, vl);
      op.encoder_backward_part(bdw.act(), nullptr, bdo.act(), tok, B, T, C, v0, vl);
      out_part[k] = bo.get();
      dwte_part[k] = bdw.get();
    }
    op.deallocate(ids);
  }
  CHECK(out[0] == out[1]);  // a gather of bf16 values: exact
  check_close("dwte", dwte[0], dwte[1], kElementRel);
  CHECK(out_part[0] == out_part[1]);
  check_close("dwte (part)", dwte_part[0], dwte_part[1], kElementRel);
}
