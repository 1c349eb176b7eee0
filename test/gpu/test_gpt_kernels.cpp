// The GPT example's bf16 CUDA kernels (encoder, LayerNorm, element-wise, bias gradient, softmax
// cross-entropy) against the fp64 host kernels (host_kernels.hpp) on the same bf16 inputs.
//
// Tolerances follow from where the kernels round. Every output is rounded to bf16 once (round
// to nearest even: at most 2^-9 of the value; the tests allow 2^-8). Everything before that is
// fp32 (2^-24 relative per operation): a sum of K terms is off by at most about K 2^-24 times
// the sum of the terms' magnitudes, so each check adds (K + slack) 2^-24 x "magnitude", the
// magnitude computed on the host from the same data. A wrong index, term or sign is off by the
// magnitude itself, far outside these bounds. Backward kernels add into gradients, so those
// start from non-zero values; the deterministic ones are run twice and must agree bit for bit.
// Shapes include N = 1, C not a multiple of the 8-wide vectors, and misaligned pointers (the
// kernels' element-by-element paths).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "gpt/cuda/gpt_kernels.hpp"
#include "gpt/host_kernels.hpp"
#include "zero/error.hpp"

namespace g = zero::gpt::cuda;
namespace h = zero::gpt::host;
using g::bf16;

namespace {

#define CUDA_OK(call) REQUIRE((call) == cudaSuccess)

// Under compute-sanitizer (ZERO_TEST_SMALL=1) the largest shapes are left out: instrumented
// kernels run far slower, and the small shapes exercise the same code paths.
bool small_run() { return std::getenv("ZERO_TEST_SMALL") != nullptr; }
constexpr std::size_t kLargeElements = 1u << 18;

constexpr double kBf16Round = 0x1p-8;  // twice the largest relative rounding error of bf16
constexpr double kF32 = 0x1p-24;

std::uint16_t to_bf16_bits(float f) {
  const auto u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
double from_bf16_bits(std::uint16_t b) { return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16); }

// bf16 values as the device holds them (bits) and as the reference reads them (exact doubles).
struct Bf16Vec {
  std::vector<std::uint16_t> bits;
  std::vector<double> val;
  std::size_t size() const { return bits.size(); }
};

Bf16Vec random_bf16(std::size_t n, std::uint64_t seed, double scale, double offset = 0.0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> d(offset, scale);
  Bf16Vec v;
  v.bits.resize(n);
  v.val.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    v.bits[i] = to_bf16_bits(static_cast<float>(d(rng)));
    v.val[i] = from_bf16_bits(v.bits[i]);
  }
  return v;
}

std::vector<double> values(const std::vector<std::uint16_t>& bits) {
  std::vector<double> v(bits.size());
  for (std::size_t i = 0; i < bits.size(); ++i) v[i] = from_bf16_bits(bits[i]);
  return v;
}

std::vector<std::int32_t> random_ids(std::size_t n, int vocab, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> d(0, vocab - 1);
  std::vector<std::int32_t> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Device memory of n elements of T, placed `offset` elements into its allocation (offset 1 on
// bf16 data breaks 16-byte alignment and sends the kernels down their scalar paths).
template <class T>
class DeviceArray {
 public:
  explicit DeviceArray(std::size_t n, std::size_t offset = 0) : n_(n), offset_(offset) {
    CUDA_OK(cudaMalloc(&base_, (n + offset) * sizeof(T) + 16));
    CUDA_OK(cudaMemset(base_, 0xff, (n + offset) * sizeof(T) + 16));
  }
  DeviceArray(const std::vector<T>& host, std::size_t offset = 0) : DeviceArray(host.size(), offset) { upload(host); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() { cudaFree(base_); }
  T* get() const { return static_cast<T*>(base_) + offset_; }
  void upload(const std::vector<T>& host) {
    REQUIRE(host.size() == n_);
    CUDA_OK(cudaMemcpy(get(), host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    CUDA_OK(cudaMemcpy(host.data(), get(), n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  void* base_ = nullptr;
  std::size_t n_, offset_;
};

using DevBf16 = DeviceArray<std::uint16_t>;
bf16* bp(const DevBf16& a) { return reinterpret_cast<bf16*>(a.get()); }

// A blocking stream: its work is ordered after the synchronous cudaMemcpy / cudaMemset calls
// of the legacy default stream (a pageable upload may still be in flight when cudaMemcpy
// returns; a non-blocking stream's kernel could start before it lands).
class Stream {
 public:
  Stream() { CUDA_OK(cudaStreamCreateWithFlags(&s_, cudaStreamDefault)); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream() { cudaStreamDestroy(s_); }
  cudaStream_t get() const { return s_; }
  void sync() const {
    CUDA_OK(cudaStreamSynchronize(s_));
    CUDA_OK(cudaGetLastError());
  }

 private:
  cudaStream_t s_ = nullptr;
};

// Checks |got - want| <= tol(i) for every i; reports the count and the first offender.
template <class Tol>
void expect_close(const std::string& what, const std::vector<double>& got, const std::vector<double>& want, Tol tol) {
  REQUIRE(got.size() == want.size());
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::abs(got[i] - want[i]) <= tol(i)) continue;  // false for NaN
    if (bad++ == 0) first = i;
  }
  if (bad != 0) {
    INFO(what << ": " << bad << " of " << got.size() << " elements outside tolerance; first at " << first << ": got "
              << got[first] << ", want " << want[first] << ", tolerance " << tol(first));
    CHECK(bad == 0);
  }
}

template <class T>
void expect_same_bits(const std::string& what, const std::vector<T>& a, const std::vector<T>& b) {
  REQUIRE(a.size() == b.size());
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(T)) == 0) continue;
    if (bad++ == 0) first = i;
  }
  INFO(what << ": " << bad << " of " << a.size() << " elements differ in their bits; first at " << first);
  CHECK(bad == 0);
}

// --- encoder ---

struct EncShape {
  int B, T, C, vocab;
  bool misaligned;
};

std::string text(const EncShape& s) {
  return "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) + " C=" + std::to_string(s.C) +
         " vocab=" + std::to_string(s.vocab) + (s.misaligned ? " misaligned" : "");
}

}  // namespace

TEST_CASE("encoder_forward equals wte[token] + wpe[t] rounded once", "[gpt][kernels]") {
  for (const EncShape s : {EncShape{2, 5, 64, 50, false}, EncShape{1, 1, 40, 3, false}, EncShape{3, 7, 37, 11, false},
                           EncShape{2, 3, 64, 9, true}, EncShape{1, 4, 1, 2, false}}) {
    INFO(text(s));
    const std::size_t N = static_cast<std::size_t>(s.B) * s.T;
    const std::size_t off = s.misaligned ? 1 : 0;
    const auto wte = random_bf16(static_cast<std::size_t>(s.vocab) * s.C, 1, 1.0);
    const auto wpe = random_bf16(static_cast<std::size_t>(s.T) * s.C, 2, 0.5);
    const auto tokens = random_ids(N, s.vocab, 3);
    DevBf16 d_wte(wte.bits, off), d_wpe(wpe.bits, off), d_out(N * s.C, off);
    DeviceArray<std::int32_t> d_tok(tokens);
    Stream st;
    g::encoder_forward(bp(d_out), d_tok.get(), bp(d_wte), bp(d_wpe), s.B, s.T, s.C, st.get());
    st.sync();
    std::vector<double> want(N * s.C);
    h::encoder_forward(want.data(), tokens.data(), wte.val.data(), wpe.val.data(), s.B, s.T, s.C);
    // One fp32 add (exact or within 2^-24 of |e| + |p|), one bf16 rounding.
    const auto got = values(d_out.download());
    expect_close("out", got, want, [&](std::size_t i) {
      const std::size_t n = i / s.C, c = i % s.C;
      const double mag =
          std::abs(wte.val[tokens[n] * static_cast<std::size_t>(s.C) + c]) + std::abs(wpe.val[(n % s.T) * s.C + c]);
      return kBf16Round * std::abs(want[i]) + 2 * kF32 * mag;
    });
  }
  Stream st;
  REQUIRE_THROWS_AS(g::encoder_forward(nullptr, nullptr, nullptr, nullptr, 2, 3, 0, st.get()), zero::Error);
}

TEST_CASE("encoder_backward adds per-token and per-position sums, deterministically", "[gpt][kernels]") {
  // Small vocabularies make every id repeat; vocab 1 is one run over all positions.
  for (const EncShape s :
       {EncShape{4, 16, 64, 10, false}, EncShape{1, 1, 40, 5, false}, EncShape{3, 7, 37, 4, false},
        EncShape{2, 9, 64, 1, false}, EncShape{2, 5, 64, 7, true}, EncShape{8, 64, 256, 300, false}}) {
    INFO(text(s));
    const std::size_t N = static_cast<std::size_t>(s.B) * s.T;
    const std::size_t off = s.misaligned ? 1 : 0;
    const auto dout = random_bf16(N * s.C, 11, 1.0);
    const auto wte0 = random_bf16(static_cast<std::size_t>(s.vocab) * s.C, 12, 0.5);
    const auto wpe0 = random_bf16(static_cast<std::size_t>(s.T) * s.C, 13, 0.5);
    const auto tokens = random_ids(N, s.vocab, 14);
    DevBf16 d_dout(dout.bits, off), d_dwte(wte0.bits, off), d_dwpe(wpe0.bits, off);
    DeviceArray<std::int32_t> d_tok(tokens);
    const std::size_t need = g::encoder_backward_scratch_bytes(s.B, s.T, s.C);
    // The scratch may start anywhere: pass it 4 bytes into its allocation.
    DeviceArray<std::uint8_t> d_scratch(need, 4);
    Stream st;

    auto run = [&] {
      d_dwte.upload(wte0.bits);
      d_dwpe.upload(wpe0.bits);
      g::encoder_backward(bp(d_dwte), bp(d_dwpe), bp(d_dout), d_tok.get(), s.B, s.T, s.C, d_scratch.get(), need,
                          st.get());
      st.sync();
      return std::pair{d_dwte.download(), d_dwpe.download()};
    };
    const auto [dwte1, dwpe1] = run();
    const auto [dwte2, dwpe2] = run();
    expect_same_bits("dwte, two runs", dwte1, dwte2);
    expect_same_bits("dwpe, two runs", dwpe1, dwpe2);

    std::vector<double> dwte = wte0.val, dwpe = wpe0.val;
    h::encoder_backward(dwte.data(), dwpe.data(), dout.val.data(), tokens.data(), s.B, s.T, s.C);
    // Magnitudes: the same sums over absolute values.
    std::vector<double> mag_te(dwte.size()), mag_pe(dwpe.size()), abs_dout(dout.size());
    for (std::size_t i = 0; i < mag_te.size(); ++i) mag_te[i] = std::abs(wte0.val[i]);
    for (std::size_t i = 0; i < mag_pe.size(); ++i) mag_pe[i] = std::abs(wpe0.val[i]);
    for (std::size_t i = 0; i < abs_dout.size(); ++i) abs_dout[i] = std::abs(dout.val[i]);
    h::encoder_backward(mag_te.data(), mag_pe.data(), abs_dout.data(), tokens.data(), s.B, s.T, s.C);
    // A run of up to N rows (dwte) or B rows (dwpe) summed in fp32, plus the add to the old
    // gradient.
    const double k_te = static_cast<double>(N) + 4, k_pe = s.B + 4.0;
    expect_close("dwte", values(dwte1), dwte,
                 [&](std::size_t i) { return kBf16Round * std::abs(dwte[i]) + k_te * kF32 * mag_te[i]; });
    expect_close("dwpe", values(dwpe1), dwpe,
                 [&](std::size_t i) { return kBf16Round * std::abs(dwpe[i]) + k_pe * kF32 * mag_pe[i]; });
    // Rows of ids that do not occur are untouched.
    std::vector<bool> seen(s.vocab, false);
    for (auto t : tokens) seen[t] = true;
    for (int v = 0; v < s.vocab; ++v) {
      if (seen[v]) continue;
      const std::vector<std::uint16_t> row(dwte1.begin() + v * s.C, dwte1.begin() + (v + 1) * s.C);
      const std::vector<std::uint16_t> row0(wte0.bits.begin() + v * s.C, wte0.bits.begin() + (v + 1) * s.C);
      expect_same_bits("dwte row of an absent id", row, row0);
    }
    REQUIRE_THROWS_AS(g::encoder_backward(bp(d_dwte), bp(d_dwpe), bp(d_dout), d_tok.get(), s.B, s.T, s.C,
                                          d_scratch.get(), need - 1, st.get()),
                      zero::Error);
  }
}

// --- LayerNorm ---

namespace {

struct LnShape {
  int N, C;
  bool misaligned;
};

std::string text(const LnShape& s) {
  return "N=" + std::to_string(s.N) + " C=" + std::to_string(s.C) + (s.misaligned ? " misaligned" : "");
}

const LnShape kLnShapes[] = {{5, 64, false}, {1, 40, false}, {3, 37, false},   {17, 768, false},
                             {4, 64, true},  {2, 1, false},  {130, 64, false}, {70000, 8, false}};

// Forward outputs against the fp64 host forward of x (the bf16 values the kernel normalised).
void check_layernorm_outputs(const LnShape& s, const std::vector<double>& x, const Bf16Vec& w, const Bf16Vec& b,
                             const std::vector<double>& got_out, const std::vector<float>& got_mean,
                             const std::vector<float>& got_rstd) {
  const std::size_t n = static_cast<std::size_t>(s.N) * s.C;
  std::vector<double> out(n), mean(s.N), rstd(s.N);
  h::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.val.data(), b.val.data(), s.N, s.C);
  // Row statistics: per-lane sums of C/32 terms, then a 5-level butterfly; generous slack for
  // the two passes and rsqrt (2 ulp).
  const double k = s.C / 32.0 + 16;
  std::vector<double> gm(got_mean.begin(), got_mean.end()), gr(got_rstd.begin(), got_rstd.end());
  expect_close("mean", gm, mean, [&](std::size_t r) { return k * kF32 * (std::abs(mean[r]) + 1.0 / rstd[r]); });
  expect_close("rstd", gr, rstd, [&](std::size_t r) { return 2 * k * kF32 * rstd[r]; });
  expect_close("out", got_out, out, [&](std::size_t i) {
    const std::size_t r = i / s.C, c = i % s.C;
    const double xhat = (x[i] - mean[r]) * rstd[r];
    return kBf16Round * std::abs(out[i]) +
           4 * k * kF32 * (std::abs(w.val[c]) * (1 + std::abs(xhat)) + std::abs(b.val[c]));
  });
}

}  // namespace

TEST_CASE("layernorm_forward matches the fp64 host forward", "[gpt][kernels]") {
  for (const LnShape& s : kLnShapes) {
    if (small_run() && static_cast<std::size_t>(s.N) * s.C > kLargeElements) continue;
    INFO(text(s));
    const std::size_t n = static_cast<std::size_t>(s.N) * s.C, off = s.misaligned ? 1 : 0;
    const auto x = random_bf16(n, 21, 2.0, 0.5);
    const auto w = random_bf16(s.C, 22, 1.0, 1.0);
    const auto b = random_bf16(s.C, 23, 0.5);
    DevBf16 d_x(x.bits, off), d_w(w.bits, off), d_b(b.bits, off), d_out(n, off);
    DeviceArray<float> d_mean(s.N), d_rstd(s.N);
    Stream st;
    g::layernorm_forward(bp(d_out), d_mean.get(), d_rstd.get(), bp(d_x), bp(d_w), bp(d_b), s.N, s.C, st.get());
    st.sync();
    check_layernorm_outputs(s, x.val, w, b, values(d_out.download()), d_mean.download(), d_rstd.download());
  }
  Stream st;
  REQUIRE_THROWS_AS(g::layernorm_forward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 8, st.get()),
                    zero::Error);
}

TEST_CASE("residual_layernorm_forward writes bf16(a + b) and normalises it, in place too", "[gpt][kernels]") {
  enum Where { kSeparate, kInA, kInB };
  for (const LnShape& s : kLnShapes) {
    if (small_run() && static_cast<std::size_t>(s.N) * s.C > kLargeElements) continue;
    for (const Where where : {kSeparate, kInA, kInB}) {
      INFO(text(s) << (where == kSeparate ? " residual separate"
                       : where == kInA    ? " residual == a"
                                          : " residual == b"));
      const std::size_t n = static_cast<std::size_t>(s.N) * s.C, off = s.misaligned ? 1 : 0;
      const auto a = random_bf16(n, 31, 2.0, 0.5);
      const auto bb = random_bf16(n, 32, 1.0);
      const auto w = random_bf16(s.C, 33, 1.0, 1.0);
      const auto bias = random_bf16(s.C, 34, 0.5);
      DevBf16 d_a(a.bits, off), d_b(bb.bits, off), d_w(w.bits, off), d_bias(bias.bits, off);
      DevBf16 d_res(n, off), d_out(n, off);
      DeviceArray<float> d_mean(s.N), d_rstd(s.N);
      DevBf16& res = where == kSeparate ? d_res : where == kInA ? d_a : d_b;
      Stream st;
      g::residual_layernorm_forward(bp(res), bp(d_out), d_mean.get(), d_rstd.get(), bp(d_a), bp(d_b), bp(d_w),
                                    bp(d_bias), s.N, s.C, st.get());
      st.sync();
      // The residual is exactly the fp32 sum rounded to bf16, as the host rounds it.
      std::vector<std::uint16_t> want_res(n);
      for (std::size_t i = 0; i < n; ++i)
        want_res[i] = to_bf16_bits(static_cast<float>(a.val[i]) + static_cast<float>(bb.val[i]));
      const auto got_res = res.download();
      expect_same_bits("residual", got_res, want_res);
      // ... and it is what was normalised (its values, not a + b unrounded).
      check_layernorm_outputs(s, values(want_res), w, bias, values(d_out.download()), d_mean.download(),
                              d_rstd.download());
    }
  }
}

TEST_CASE("layernorm_backward matches the fp64 host backward, deterministically", "[gpt][kernels]") {
  for (const LnShape& s : kLnShapes) {
    if (small_run() && static_cast<std::size_t>(s.N) * s.C > kLargeElements) continue;
    INFO(text(s));
    const std::size_t n = static_cast<std::size_t>(s.N) * s.C, off = s.misaligned ? 1 : 0;
    const auto x = random_bf16(n, 41, 2.0, 0.5);
    const auto w = random_bf16(s.C, 42, 1.0, 1.0);
    const auto b = random_bf16(s.C, 43, 0.5);
    const auto dout = random_bf16(n, 44, 1.0);
    const auto dinp0 = random_bf16(n, 45, 0.5);
    const auto dw0 = random_bf16(s.C, 46, 0.5);
    const auto db0 = random_bf16(s.C, 47, 0.5);
    // The statistics as the forward leaves them (fp32), shared by kernel and reference.
    std::vector<double> ref_out(n), mean_d(s.N), rstd_d(s.N);
    h::layernorm_forward(ref_out.data(), mean_d.data(), rstd_d.data(), x.val.data(), w.val.data(), b.val.data(), s.N,
                         s.C);
    std::vector<float> mean(s.N), rstd(s.N);
    for (int r = 0; r < s.N; ++r) {
      mean[r] = static_cast<float>(mean_d[r]);
      rstd[r] = static_cast<float>(rstd_d[r]);
      mean_d[r] = mean[r];
      rstd_d[r] = rstd[r];
    }
    DevBf16 d_x(x.bits, off), d_w(w.bits, off), d_dout(dout.bits, off), d_dinp(n, off), d_dw(s.C, off), d_db(s.C, off);
    DeviceArray<float> d_mean(mean), d_rstd(rstd);
    const std::size_t need = g::layernorm_backward_scratch_bytes(s.N, s.C);
    DeviceArray<std::uint8_t> d_scratch(need, 4);
    Stream st;
    auto run = [&] {
      d_dinp.upload(dinp0.bits);
      d_dw.upload(dw0.bits);
      d_db.upload(db0.bits);
      g::layernorm_backward(bp(d_dinp), bp(d_dw), bp(d_db), bp(d_dout), bp(d_x), bp(d_w), d_mean.get(), d_rstd.get(),
                            s.N, s.C, d_scratch.get(), need, st.get());
      st.sync();
      return std::tuple{d_dinp.download(), d_dw.download(), d_db.download()};
    };
    const auto [dinp1, dw1, db1] = run();
    const auto [dinp2, dw2, db2] = run();
    expect_same_bits("dinp, two runs", dinp1, dinp2);
    expect_same_bits("dw, two runs", dw1, dw2);
    expect_same_bits("db, two runs", db1, db2);

    std::vector<double> dinp = dinp0.val, dw = dw0.val, db = db0.val;
    h::layernorm_backward(dinp.data(), dw.data(), db.data(), dout.val.data(), x.val.data(), w.val.data(), mean_d.data(),
                          rstd_d.data(), s.N, s.C);
    // Magnitudes of the terms each output sums.
    std::vector<double> mag_dinp(n), mag_dw(s.C), mag_db(s.C);
    for (int r = 0; r < s.N; ++r) {
      double sum_dn = 0, sum_dn_xhat = 0;
      for (int c = 0; c < s.C; ++c) {
        const std::size_t i = static_cast<std::size_t>(r) * s.C + c;
        const double xhat = (x.val[i] - mean_d[r]) * rstd_d[r];
        sum_dn += std::abs(dout.val[i] * w.val[c]);
        sum_dn_xhat += std::abs(dout.val[i] * w.val[c] * xhat);
        mag_dw[c] += std::abs(dout.val[i] * xhat);
        mag_db[c] += std::abs(dout.val[i]);
      }
      for (int c = 0; c < s.C; ++c) {
        const std::size_t i = static_cast<std::size_t>(r) * s.C + c;
        const double xhat = (x.val[i] - mean_d[r]) * rstd_d[r];
        mag_dinp[i] = std::abs(dinp0.val[i]) + rstd_d[r] * (std::abs(dout.val[i] * w.val[c]) + sum_dn / s.C +
                                                            std::abs(xhat) * sum_dn_xhat / s.C);
      }
    }
    for (int c = 0; c < s.C; ++c) {
      mag_dw[c] += std::abs(dw0.val[c]);
      mag_db[c] += std::abs(db0.val[c]);
    }
    // dinp: row sums as in the forward; dw/db: a row block's serial sum, then the ordered sum
    // of the blocks' partials (at most rows + 1024 additions; N + 16 bounds both).
    const double k_row = s.C / 32.0 + 16, k_col = s.N + 16.0;
    expect_close("dinp", values(dinp1), dinp,
                 [&](std::size_t i) { return kBf16Round * std::abs(dinp[i]) + 4 * k_row * kF32 * mag_dinp[i]; });
    expect_close("dw", values(dw1), dw,
                 [&](std::size_t c) { return kBf16Round * std::abs(dw[c]) + 2 * k_col * kF32 * mag_dw[c]; });
    expect_close("db", values(db1), db,
                 [&](std::size_t c) { return kBf16Round * std::abs(db[c]) + k_col * kF32 * mag_db[c]; });
    REQUIRE_THROWS_AS(g::layernorm_backward(bp(d_dinp), bp(d_dw), bp(d_db), bp(d_dout), bp(d_x), bp(d_w), d_mean.get(),
                                            d_rstd.get(), s.N, s.C, d_scratch.get(), need - 1, st.get()),
                      zero::Error);
  }
}

// --- element-wise ---

namespace {

struct EwShape {
  std::size_t n;
  bool misaligned;
};
const EwShape kEwShapes[] = {{1, false},    {8, false},   {1000, false},
                             {1003, false}, {1003, true}, {(1u << 20) + 5, false}};

}  // namespace

TEST_CASE("residual_forward is the fp32 sum rounded once, out may alias a", "[gpt][kernels]") {
  for (const EwShape& s : kEwShapes) {
    if (small_run() && s.n > kLargeElements) continue;
    for (const bool in_place : {false, true}) {
      INFO("n=" << s.n << (s.misaligned ? " misaligned" : "") << (in_place ? " out == a" : ""));
      const std::size_t off = s.misaligned ? 1 : 0;
      const auto a = random_bf16(s.n, 51, 1.0), b = random_bf16(s.n, 52, 3.0);
      DevBf16 d_a(a.bits, off), d_b(b.bits, off), d_out(s.n, off);
      DevBf16& out = in_place ? d_a : d_out;
      Stream st;
      g::residual_forward(bp(out), bp(d_a), bp(d_b), s.n, st.get());
      st.sync();
      const auto got = out.download();
      std::vector<double> want(s.n);
      h::residual_forward(want.data(), a.val.data(), b.val.data(), s.n);
      expect_close("out", values(got), want, [&](std::size_t i) {
        return kBf16Round * std::abs(want[i]) + kF32 * (std::abs(a.val[i]) + std::abs(b.val[i]));
      });
      std::vector<std::uint16_t> exact(s.n);
      for (std::size_t i = 0; i < s.n; ++i)
        exact[i] = to_bf16_bits(static_cast<float>(a.val[i]) + static_cast<float>(b.val[i]));
      expect_same_bits("out against the host's fp32 sum", got, exact);
    }
  }
}

TEST_CASE("gelu_forward matches the fp64 host GELU", "[gpt][kernels]") {
  for (const EwShape& s : kEwShapes) {
    if (small_run() && s.n > kLargeElements) continue;
    INFO("n=" << s.n << (s.misaligned ? " misaligned" : ""));
    const std::size_t off = s.misaligned ? 1 : 0;
    const auto x = random_bf16(s.n, 61, 3.0);
    DevBf16 d_x(x.bits, off), d_out(s.n, off);
    Stream st;
    g::gelu_forward(bp(d_out), bp(d_x), s.n, st.get());
    st.sync();
    std::vector<double> want(s.n);
    h::gelu_forward(want.data(), x.val.data(), s.n);
    // tanhf is within 2 ulp; 0.5 x (1 + tanh) cancels for negative x, so the absolute error
    // grows with |x|: 16 ulp of 1 times (1 + |x|) bounds it.
    expect_close("out", values(d_out.download()), want,
                 [&](std::size_t i) { return kBf16Round * std::abs(want[i]) + 16 * kF32 * (1 + std::abs(x.val[i])); });
  }
}

TEST_CASE("gelu_backward_inplace overwrites dinp with dout * GELU'(inp), dinp may alias dout", "[gpt][kernels]") {
  for (const EwShape& s : kEwShapes) {
    if (small_run() && s.n > kLargeElements) continue;
    for (const bool in_place : {false, true}) {
      INFO("n=" << s.n << (s.misaligned ? " misaligned" : "") << (in_place ? " dinp == dout" : ""));
      const std::size_t off = s.misaligned ? 1 : 0;
      const auto x = random_bf16(s.n, 71, 3.0), dout = random_bf16(s.n, 72, 1.0);
      const auto junk = random_bf16(s.n, 73, 100.0);  // overwritten, never added to
      DevBf16 d_x(x.bits, off), d_dout(dout.bits, off), d_dinp(junk.bits, off);
      DevBf16& dinp = in_place ? d_dout : d_dinp;
      Stream st;
      g::gelu_backward_inplace(bp(dinp), bp(d_x), bp(d_dout), s.n, st.get());
      st.sync();
      std::vector<double> want(s.n, 0.0);
      h::gelu_backward(want.data(), x.val.data(), dout.val.data(), s.n);
      // GELU' has terms up to ~x^2 in size; 16 ulp of each.
      expect_close("dinp", values(dinp.download()), want, [&](std::size_t i) {
        return kBf16Round * std::abs(want[i]) + 16 * kF32 * std::abs(dout.val[i]) * (1 + x.val[i] * x.val[i]);
      });
    }
  }
}

TEST_CASE("bias_backward adds column sums, deterministically", "[gpt][kernels]") {
  for (const LnShape& s : kLnShapes) {
    if (small_run() && static_cast<std::size_t>(s.N) * s.C > kLargeElements) continue;
    INFO(text(s));
    const std::size_t n = static_cast<std::size_t>(s.N) * s.C, off = s.misaligned ? 1 : 0;
    const auto dout = random_bf16(n, 81, 1.0);
    const auto db0 = random_bf16(s.C, 82, 0.5);
    DevBf16 d_dout(dout.bits, off), d_db(s.C, off);
    const std::size_t need = g::bias_backward_scratch_bytes(s.N, s.C);
    DeviceArray<std::uint8_t> d_scratch(need, 4);
    Stream st;
    auto run = [&] {
      d_db.upload(db0.bits);
      g::bias_backward(bp(d_db), bp(d_dout), s.N, s.C, d_scratch.get(), need, st.get());
      st.sync();
      return d_db.download();
    };
    const auto db1 = run(), db2 = run();
    expect_same_bits("dbias, two runs", db1, db2);
    // The host's dbias is part of matmul_backward: a 1-column input makes its product trivial.
    std::vector<double> db = db0.val, dw(s.C, 0.0), inp(s.N, 1.0), w(s.C, 0.0);
    h::matmul_backward<double>(nullptr, dw.data(), db.data(), dout.val.data(), inp.data(), w.data(), s.N, 1, s.C);
    std::vector<double> mag(s.C);
    for (std::size_t i = 0; i < n; ++i) mag[i % s.C] += std::abs(dout.val[i]);
    for (int c = 0; c < s.C; ++c) mag[c] += std::abs(db0.val[c]);
    expect_close("dbias", values(db1), db,
                 [&](std::size_t c) { return kBf16Round * std::abs(db[c]) + (s.N + 16.0) * kF32 * mag[c]; });
    REQUIRE_THROWS_AS(g::bias_backward(bp(d_db), bp(d_dout), s.N, s.C, d_scratch.get(), need - 1, st.get()),
                      zero::Error);
  }
}

// --- cross-entropy ---

TEST_CASE("softmax_cross_entropy: losses, gradients, zero padding, in place", "[gpt][kernels]") {
  struct CeShape {
    int N, V, Vp;
  };
  enum Grad { kNone, kSeparate, kInPlace };
  for (const CeShape s : {CeShape{4, 1000, 1008}, CeShape{1, 1, 1}, CeShape{3, 37, 40}, CeShape{5, 50, 53},
                          CeShape{2, 64, 64}, CeShape{2, 50257, 50304}, CeShape{64, 50257, 50304}}) {
    if (small_run() && static_cast<std::size_t>(s.N) * s.Vp > kLargeElements) continue;
    for (const Grad grad : {kNone, kSeparate, kInPlace}) {
      INFO("N=" << s.N << " V=" << s.V << " Vp=" << s.Vp
                << (grad == kNone       ? " losses only"
                    : grad == kSeparate ? " dlogits separate"
                                        : " dlogits == logits"));
      const std::size_t n = static_cast<std::size_t>(s.N) * s.Vp;
      const auto logits = random_bf16(n, 91, 4.0);
      const auto targets = random_ids(s.N, s.V, 92);
      const float dloss = 1.0f / 64;
      DevBf16 d_logits(logits.bits), d_dlogits(n);  // d_dlogits starts as 0xffff (NaN) bits
      DeviceArray<std::int32_t> d_targets(targets);
      DeviceArray<float> d_losses(s.N);
      bf16* dl = grad == kNone ? nullptr : grad == kSeparate ? bp(d_dlogits) : bp(d_logits);
      Stream st;
      g::softmax_cross_entropy(d_losses.get(), dl, bp(d_logits), d_targets.get(), s.N, s.V, s.Vp, dloss, st.get());
      st.sync();

      std::vector<double> losses(s.N), dlogits(n, 0.0);
      h::softmax_cross_entropy<double>(losses.data(), dlogits.data(), logits.val.data(), targets.data(), s.N, s.V, s.Vp,
                                       dloss);
      // lse in fp32 from exp sums over V terms (per-thread partial sums and a tree): an
      // absolute error of a few 2^-24 times (|lse| + the number of terms a thread sums).
      const auto got_losses = d_losses.download();
      std::vector<double> gl(got_losses.begin(), got_losses.end());
      expect_close("losses", gl, losses, [&](std::size_t r) {
        double mx = 0;
        for (int v = 0; v < s.V; ++v) mx = std::max(mx, std::abs(logits.val[r * s.Vp + v]));
        return 16 * kF32 * (std::abs(losses[r]) + 2 * mx + s.V / 512.0 + 16);
      });
      if (grad == kNone) {
        expect_same_bits("logits untouched without dlogits", d_logits.download(), logits.bits);
        continue;
      }
      const auto got = (grad == kSeparate ? d_dlogits : d_logits).download();
      // p = exp(l - lse) with lse off by the loss tolerance above: relative error ~1e-6 in p.
      expect_close("dlogits", values(got), dlogits,
                   [&](std::size_t i) { return kBf16Round * std::abs(dlogits[i]) + 0x1p-15 * dloss; });
      std::size_t padded_nonzero = 0;
      for (int r = 0; r < s.N; ++r)
        for (int v = s.V; v < s.Vp; ++v) padded_nonzero += got[r * s.Vp + v] != 0;
      CHECK(padded_nonzero == 0);  // +0.0 bits exactly
    }
  }
}

TEST_CASE("softmax_cross_entropy reports bad targets as NaN and rejects bad shapes", "[gpt][kernels]") {
  const int V = 10, Vp = 16;
  const auto logits = random_bf16(2 * Vp, 93, 1.0);
  const std::vector<std::int32_t> targets{V, 3};  // row 0's target is out of range
  DevBf16 d_logits(logits.bits);
  DeviceArray<std::int32_t> d_targets(targets);
  DeviceArray<float> d_losses(2);
  Stream st;
  g::softmax_cross_entropy(d_losses.get(), nullptr, bp(d_logits), d_targets.get(), 2, V, Vp, 1.0f, st.get());
  st.sync();
  const auto losses = d_losses.download();
  CHECK(std::isnan(losses[0]));
  CHECK(std::isfinite(losses[1]));
  REQUIRE_THROWS_AS(
      g::softmax_cross_entropy(d_losses.get(), nullptr, bp(d_logits), d_targets.get(), 2, 17, 16, 1.0f, st.get()),
      zero::Error);
}

// --- tensor parallelism: one part of the vocabulary ---

namespace {

struct PartShape {
  int V, Vp, TP, C;
  bool misaligned;
};

std::string text(const PartShape& s) {
  return "V=" + std::to_string(s.V) + " Vp=" + std::to_string(s.Vp) + " TP=" + std::to_string(s.TP) +
         " C=" + std::to_string(s.C) + (s.misaligned ? " misaligned" : "");
}

// n random ids in [0, V), the first ones replaced by ids that put every part with real ids on
// and off its slice: each part's first id (twice, a run), its last real id, one in the middle,
// and V - 1. Random ids alone leave a small part's slice empty in most draws.
std::vector<std::int32_t> ids_on_every_part(std::size_t n, int V, int Vl, std::uint64_t seed) {
  std::vector<std::int32_t> ids = random_ids(n, V, seed);
  std::vector<std::int32_t> chosen;
  for (int v0 = 0; v0 < V; v0 += Vl) {
    const int last = std::min(V, v0 + Vl) - 1;
    for (const int id : {v0, v0, last, v0 + (last - v0) / 2}) chosen.push_back(id);
  }
  chosen.push_back(V - 1);
  REQUIRE(chosen.size() <= n);
  // Spread over the batch (position k * n / size), so the runs are not adjacent positions.
  for (std::size_t k = 0; k < chosen.size(); ++k) ids[k * n / chosen.size()] = chosen[k];
  return ids;
}

// Each of TP parts of logits [rows, Vp] on the device: the ids [t Vl, (t + 1) Vl) of every row.
std::vector<std::unique_ptr<DevBf16>> device_parts(const Bf16Vec& logits, int rows, int Vp, int TP) {
  const int Vl = Vp / TP;
  std::vector<std::unique_ptr<DevBf16>> owned;
  for (int t = 0; t < TP; ++t) {
    std::vector<std::uint16_t> bits;
    for (int r = 0; r < rows; ++r)
      bits.insert(bits.end(), logits.bits.begin() + r * Vp + t * Vl, logits.bits.begin() + r * Vp + (t + 1) * Vl);
    owned.push_back(std::make_unique<DevBf16>(bits));
  }
  return owned;
}

}  // namespace

TEST_CASE("vocabulary parts: encoder and cross-entropy passes match the fp64 host kernels",
          "[gpt][kernels][tensor_parallel]") {
  // 300 of 384 ids in 4 parts of 96, fewer than a cross-entropy block's 512 threads (part 3:
  // ids 288-299 and padding). 2136 of 3072 in 4 parts of 768: a block walks each row twice,
  // part 2's real ids end inside its second pass, part 3 holds padding only (max -inf, sums 0).
  // C = 37 and a misaligned run take the encoder's element-by-element path.
  for (const PartShape s : {PartShape{300, 384, 4, 64, false}, PartShape{2136, 3072, 4, 64, false},
                            PartShape{300, 384, 2, 37, false}, PartShape{2136, 3072, 4, 64, true}}) {
    INFO(text(s));
    const int B = 3, T = 7, C = s.C, V = s.V, Vp = s.Vp, TP = s.TP, Vl = Vp / TP;
    const std::size_t N = static_cast<std::size_t>(B) * T, off = s.misaligned ? 1 : 0;
    const auto wte = random_bf16(static_cast<std::size_t>(Vl) * C, 21, 1.0);  // one part's rows
    const auto wpe = random_bf16(static_cast<std::size_t>(T) * C, 22, 0.5);
    const auto tokens = ids_on_every_part(N, V, Vl, 23);
    const auto dout = random_bf16(N * C, 24, 1.0);
    DeviceArray<std::int32_t> d_tok(tokens);
    Stream st;
    for (int t = 0; t < TP; ++t) {
      INFO("part " << t << " of " << TP);
      const bool with_wpe = t == 0;
      DevBf16 d_wte(wte.bits, off), d_wpe(wpe.bits, off), d_out(N * C, off);
      g::encoder_forward(bp(d_out), d_tok.get(), bp(d_wte), with_wpe ? bp(d_wpe) : nullptr, B, T, C, st.get(), t * Vl,
                         Vl);
      st.sync();
      std::vector<double> want(N * C);
      h::encoder_forward(want.data(), tokens.data(), wte.val.data(), with_wpe ? wpe.val.data() : nullptr, B, T, C,
                         t * Vl, Vl);
      // Without wpe a row is a copy of a wte row or zeros: exact. With it, one fp32 add (within
      // 2^-24 of |e| + |p|) and one bf16 rounding.
      expect_close("out", values(d_out.download()), want, [&](std::size_t i) {
        if (!with_wpe) return 0.0;
        const std::size_t n = i / C, c = i % C;
        const int r = tokens[n] - t * Vl;
        const double e = r >= 0 && r < Vl ? std::abs(wte.val[static_cast<std::size_t>(r) * C + c]) : 0.0;
        return kBf16Round * std::abs(want[i]) + 2 * kF32 * (e + std::abs(wpe.val[(n % T) * C + c]));
      });

      const std::size_t need = g::encoder_backward_scratch_bytes(B, T, C);
      DeviceArray<std::uint8_t> d_scratch(need);
      DevBf16 d_dout(dout.bits, off), d_dwte(wte.bits, off), d_dwpe(wpe.bits, off);
      g::encoder_backward(bp(d_dwte), bp(d_dwpe), bp(d_dout), d_tok.get(), B, T, C, d_scratch.get(), need, st.get(),
                          t * Vl, Vl);
      st.sync();
      std::vector<double> dwte = wte.val, dwpe = wpe.val;
      h::encoder_backward(dwte.data(), dwpe.data(), dout.val.data(), tokens.data(), B, T, C, t * Vl, Vl);
      // Magnitudes: the same sums over absolute values; a run of up to N rows (dwte) or B rows
      // (dwpe) summed in fp32, plus the add to the old gradient.
      std::vector<double> mag_te(dwte.size()), mag_pe(dwpe.size()), abs_dout(dout.size());
      for (std::size_t i = 0; i < mag_te.size(); ++i) mag_te[i] = std::abs(wte.val[i]);
      for (std::size_t i = 0; i < mag_pe.size(); ++i) mag_pe[i] = std::abs(wpe.val[i]);
      for (std::size_t i = 0; i < abs_dout.size(); ++i) abs_dout[i] = std::abs(dout.val[i]);
      h::encoder_backward(mag_te.data(), mag_pe.data(), abs_dout.data(), tokens.data(), B, T, C, t * Vl, Vl);
      const double k_te = static_cast<double>(N) + 4, k_pe = B + 4.0;
      const auto got_dwte = d_dwte.download();
      expect_close("dwte", values(got_dwte), dwte,
                   [&](std::size_t i) { return kBf16Round * std::abs(dwte[i]) + k_te * kF32 * mag_te[i]; });
      expect_close("dwpe", values(d_dwpe.download()), dwpe,
                   [&](std::size_t i) { return kBf16Round * std::abs(dwpe[i]) + k_pe * kF32 * mag_pe[i]; });
      // Rows of this part that no token names are left as they were, bit for bit.
      std::vector<bool> named(static_cast<std::size_t>(Vl), false);
      for (const auto id : tokens)
        if (id >= t * Vl && id < (t + 1) * Vl) named[static_cast<std::size_t>(id - t * Vl)] = true;
      std::size_t changed = 0;
      for (std::size_t i = 0; i < got_dwte.size(); ++i) changed += !named[i / C] && got_dwte[i] != wte.bits[i];
      CHECK(changed == 0);
    }

    // Cross-entropy: each part's pass on the device, the group's max and sums taken on the
    // host. Targets on every part (its first, middle and last real id, and V - 1).
    const int rows = 24;
    const auto logits = random_bf16(static_cast<std::size_t>(rows) * Vp, 25, 4.0);
    const auto targets = ids_on_every_part(rows, V, Vl, 26);
    const float dloss = 1.0f / 64;
    std::vector<double> want_losses(rows), want_d(logits.size(), 0.0);
    h::softmax_cross_entropy<double>(want_losses.data(), want_d.data(), logits.val.data(), targets.data(), rows, V, Vp,
                                     dloss);
    DeviceArray<std::int32_t> d_targets(targets);
    const auto owned = device_parts(logits, rows, Vp, TP);
    // A part's real ids: [t Vl, t Vl + real(t)).
    auto real = [&](int t) { return std::clamp(V - t * Vl, 0, Vl); };
    std::vector<float> mx(rows, -INFINITY), sums(2 * rows, 0.0f);
    DeviceArray<float> d_max(rows), d_sums(2 * rows), d_losses(rows);
    for (int t = 0; t < TP; ++t) {
      INFO("cross-entropy max, part " << t);
      g::cross_entropy_part_max(d_max.get(), bp(*owned[t]), rows, Vl, t * Vl, V, st.get());
      st.sync();
      const auto m = d_max.download();
      // A maximum of bf16 values is one of them: exact, -inf for a part of padding only.
      std::size_t wrong = 0;
      for (int r = 0; r < rows; ++r) {
        float want = -INFINITY;
        for (int j = 0; j < real(t); ++j) want = std::max(want, static_cast<float>(logits.val[r * Vp + t * Vl + j]));
        wrong += m[r] != want;
        mx[r] = std::max(mx[r], m[r]);
      }
      CHECK(wrong == 0);
    }
    d_max.upload(mx);
    for (int t = 0; t < TP; ++t) {
      INFO("cross-entropy sums, part " << t);
      g::cross_entropy_part_sums(d_sums.get(), bp(*owned[t]), d_max.get(), d_targets.get(), rows, Vl, t * Vl, V,
                                 st.get());
      st.sync();
      const auto got = d_sums.download();
      std::size_t wrong_target = 0, wrong_sum = 0;
      for (int r = 0; r < rows; ++r) {
        // The target's logit from the part that holds it (a copy: exact), 0 from the others.
        const int j = targets[r] - t * Vl;
        const float want_t = j >= 0 && j < real(t) ? static_cast<float>(logits.val[r * Vp + targets[r]]) : 0.0f;
        wrong_target += got[rows + r] != want_t;
        // The part's sum of exp(l - max), positive terms, exactly 0 for a part of padding only.
        // Each term is off by the rounding of l - max (2^-24 |l - max| relative once exp'd) and
        // expf's 2 ulp; the sum adds per-thread runs of Vl / 512 terms and a tree of 9 levels.
        double want_s = 0, spread = 0;
        for (int k = 0; k < real(t); ++k) {
          const double d = logits.val[r * Vp + t * Vl + k] - mx[r];
          want_s += std::exp(d);
          spread = std::max(spread, -d);
        }
        const double k_sum = spread + 2 + Vl / 512.0 + 9 + 4;
        wrong_sum += !(std::abs(got[r] - want_s) <= 2 * k_sum * kF32 * want_s);
        sums[r] += got[r];
        sums[rows + r] += got[rows + r];
      }
      CHECK(wrong_target == 0);
      CHECK(wrong_sum == 0);
    }
    d_sums.upload(sums);
    for (int t = 0; t < TP; ++t) {
      INFO("cross-entropy part " << t);
      g::cross_entropy_part_finish(d_losses.get(), bp(*owned[t]), bp(*owned[t]), d_max.get(), d_sums.get(),
                                   d_targets.get(), rows, Vl, t * Vl, V, dloss, st.get());
      st.sync();
      const auto got_losses = d_losses.download();
      std::vector<double> gl(got_losses.begin(), got_losses.end());
      // As the whole-row kernel's bound, with the part sums added in fp32 on the host.
      expect_close("losses", gl, want_losses, [&](std::size_t r) {
        double m = 0;
        for (int v = 0; v < V; ++v) m = std::max(m, std::abs(logits.val[r * Vp + v]));
        return 16 * kF32 * (std::abs(want_losses[r]) + 2 * m + Vl / 512.0 + TP + 16);
      });
      const auto got_bits = owned[t]->download();
      const auto got = values(got_bits);
      std::vector<double> want(got.size());
      for (int r = 0; r < rows; ++r)
        for (int j = 0; j < Vl; ++j) want[r * Vl + j] = want_d[r * Vp + t * Vl + j];
      expect_close("dlogits", got, want,
                   [&](std::size_t i) { return kBf16Round * std::abs(want[i]) + 0x1p-15 * dloss; });
      std::size_t padded_nonzero = 0;
      for (int r = 0; r < rows; ++r)
        for (int j = real(t); j < Vl; ++j) padded_nonzero += got_bits[r * Vl + j] != 0;
      CHECK(padded_nonzero == 0);  // +0.0 bits exactly
    }
  }
}

TEST_CASE("vocabulary parts report a target outside the vocabulary as a NaN loss", "[gpt][kernels][tensor_parallel]") {
  // V = 130 of Vp = 256 in 2 parts of 128: id 200 is padding on part 1 (no part holds it as a
  // real id), 256 is past the padded vocabulary and -1 below it. Row 4 is valid and stays finite.
  const int V = 130, Vp = 256, TP = 2, Vl = Vp / TP, rows = 5;
  const std::vector<std::int32_t> targets{-1, V, 200, Vp, 5};
  const auto logits = random_bf16(static_cast<std::size_t>(rows) * Vp, 94, 1.0);
  DeviceArray<std::int32_t> d_targets(targets);
  const auto owned = device_parts(logits, rows, Vp, TP);
  Stream st;
  DeviceArray<float> d_max(rows), d_sums(2 * rows), d_losses(rows);
  std::vector<float> mx(rows, -INFINITY), sums(2 * rows, 0.0f);
  for (int t = 0; t < TP; ++t) {
    g::cross_entropy_part_max(d_max.get(), bp(*owned[t]), rows, Vl, t * Vl, V, st.get());
    st.sync();
    const auto m = d_max.download();
    for (int r = 0; r < rows; ++r) mx[r] = std::max(mx[r], m[r]);
  }
  d_max.upload(mx);
  for (int t = 0; t < TP; ++t) {
    g::cross_entropy_part_sums(d_sums.get(), bp(*owned[t]), d_max.get(), d_targets.get(), rows, Vl, t * Vl, V,
                               st.get());
    st.sync();
    const auto s = d_sums.download();
    for (int i = 0; i < 2 * rows; ++i) sums[i] += s[i];
  }
  d_sums.upload(sums);
  for (int t = 0; t < TP; ++t) {
    INFO("part " << t);
    g::cross_entropy_part_finish(d_losses.get(), bp(*owned[t]), bp(*owned[t]), d_max.get(), d_sums.get(),
                                 d_targets.get(), rows, Vl, t * Vl, V, 1.0f, st.get());
    st.sync();
    const auto losses = d_losses.download();
    for (int r = 0; r < 4; ++r) {
      INFO("target " << targets[r]);
      CHECK(std::isnan(losses[r]));
    }
    CHECK(std::isfinite(losses[4]));
  }
}
