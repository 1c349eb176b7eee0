// Host Adam/AdamW/SGD: the scalar path against an independent double-precision reference, every
// SIMD path against the scalar path bit for bit (special values, tails, all dtype pairs), and
// invariance under the thread count.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "zero/dtype.hpp"
#include "zero/error.hpp"
#include "offload/host_optimizer.hpp"
#include "random_values.hpp"

using namespace zero;
using namespace zero::offload;
using zero::test::random_values;

namespace {

std::vector<SimdPath> available_paths() {
  std::vector<SimdPath> out;
  for (SimdPath p : {SimdPath::scalar, SimdPath::avx2, SimdPath::avx512}) {
    if (simd_path_supported(p)) out.push_back(p);
  }
  return out;
}

// A gradient buffer of any dtype built from float values (rounded to the dtype).
struct Grad {
  DType type;
  std::vector<std::uint16_t> half;
  std::vector<float> full;
  Grad(DType t, const std::vector<float>& values) : type(t) {
    if (t == DType::f32) {
      full = values;
    } else {
      half.resize(values.size());
      for (std::size_t i = 0; i < values.size(); ++i) {
        half[i] = t == DType::bf16 ? f32_to_bf16_bits(values[i]) : f32_to_f16_bits(values[i]);
      }
    }
  }
  const void* data() const { return type == DType::f32 ? static_cast<const void*>(full.data()) : half.data(); }
  float at(std::size_t i) const { return load_as_f32(data(), i, type); }
};

std::uint32_t bits(float f) { return std::bit_cast<std::uint32_t>(f); }

// PyTorch's Adam/AdamW written out in double, step by step, independent of the library's
// constant folding and operation order.
struct RefAdam {
  std::vector<double> p, m, v;
  void step(const Grad& g, const AdamHyper& h) {
    const double b1 = h.beta1, b2 = h.beta2, lr = h.lr, wd = h.weight_decay;
    const double bc1 = 1.0 - std::pow(b1, static_cast<double>(h.step));
    const double bc2 = 1.0 - std::pow(b2, static_cast<double>(h.step));
    for (std::size_t i = 0; i < p.size(); ++i) {
      double gi = static_cast<double>(g.at(i)) * h.grad_scale;
      if (h.decoupled) {
        p[i] *= 1.0 - lr * wd;
      } else if (wd != 0.0) {
        gi += wd * p[i];
      }
      m[i] = b1 * m[i] + (1.0 - b1) * gi;
      v[i] = b2 * v[i] + (1.0 - b2) * gi * gi;
      const double denom = std::sqrt(v[i]) / std::sqrt(bc2) + h.eps;
      p[i] -= lr / bc1 * m[i] / denom;
    }
  }
};

void check_close(const std::vector<float>& got, const std::vector<double>& want, double rel, double abs_floor,
                 const char* what) {
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double tol = rel * std::fabs(want[i]) + abs_floor;
    if (std::fabs(static_cast<double>(got[i]) - want[i]) > tol) {
      FAIL(what << "[" << i << "] = " << got[i] << ", reference " << want[i]);
    }
  }
}

}  // namespace

TEST_CASE("simd path names and CPU detection", "[host_optimizer]") {
  CHECK(simd_path_name(SimdPath::scalar) == "scalar");
  CHECK(simd_path_name(SimdPath::avx2) == "avx2");
  CHECK(simd_path_name(SimdPath::avx512) == "avx512");
  CHECK(simd_path_supported(SimdPath::scalar));
  CHECK(simd_path_supported(best_simd_path()));
  WARN("best SIMD path on this machine: " << simd_path_name(best_simd_path()));
}

TEST_CASE("scalar Adam and AdamW match a double-precision reference", "[host_optimizer]") {
  const std::size_t n = 1031;
  struct Case {
    const char* name;
    bool decoupled;
    float wd;
    float grad_scale;
    DType grad_type;
  };
  const Case cases[] = {
      {"AdamW wd=0.1", true, 0.1f, 1.0f, DType::f32},
      {"Adam L2 wd=0.05", false, 0.05f, 1.0f, DType::f32},
      {"Adam wd=0, grad_scale=1/1024", false, 0.0f, 1.0f / 1024.0f, DType::f32},
      {"AdamW bf16 grads, grad_scale=0.5", true, 0.01f, 0.5f, DType::bf16},
      {"AdamW fp16 grads", true, 0.01f, 1.0f, DType::f16},
  };
  for (const Case& tc : cases) {
    SECTION(tc.name) {
      std::vector<float> p = random_values(n, 1, -1.0f, 1.0f), m(n, 0.0f), v(n, 0.0f);
      RefAdam ref{{p.begin(), p.end()}, std::vector<double>(n, 0.0), std::vector<double>(n, 0.0)};
      std::vector<std::uint16_t> out(n);
      for (int t = 1; t <= 6; ++t) {
        const float scale = tc.grad_scale == 1.0f ? 1.0f : 1.0f / tc.grad_scale;
        Grad g(tc.grad_type, random_values(n, 100 + t, -scale, scale));
        AdamHyper h;
        h.lr = 1e-2f;
        h.beta1 = 0.9f;
        h.beta2 = 0.999f;
        h.eps = 1e-8f;
        h.weight_decay = tc.wd;
        h.decoupled = tc.decoupled;
        h.step = t;
        h.grad_scale = tc.grad_scale;
        adam_step(p.data(), m.data(), v.data(), g.data(), g.type, out.data(), DType::bf16, n, h, SimdPath::scalar, 1);
        ref.step(g, h);
      }
      // Six steps of fp32 rounding: a few ulps on each state variable. m sums terms of either
      // sign, so its error is bounded by the size of the terms (|g| <= 1 after scaling), not by
      // |m|; v only adds positive terms.
      check_close(p, ref.p, 2e-6, 1e-7, "p");
      check_close(m, ref.m, 2e-6, 1e-7, "m");
      check_close(v, ref.v, 2e-6, 1e-12, "v");
      for (std::size_t i = 0; i < n; ++i) REQUIRE(out[i] == f32_to_bf16_bits(p[i]));
    }
  }
}

TEST_CASE("scalar SGD matches a double-precision reference", "[host_optimizer]") {
  const std::size_t n = 777;
  for (float momentum : {0.0f, 0.9f}) {
    for (float wd : {0.0f, 1e-2f}) {
      std::vector<float> p = random_values(n, 3, -1.0f, 1.0f), buf(n, 123.0f);
      std::vector<double> rp(p.begin(), p.end()), rbuf(n, 0.0);
      std::vector<float> out(n);
      for (int t = 0; t < 4; ++t) {
        Grad g(DType::f16, random_values(n, 50 + t, -2.0f, 2.0f));
        SgdHyper h;
        h.lr = 0.1f;
        h.momentum = momentum;
        h.weight_decay = wd;
        h.grad_scale = 0.25f;
        h.first_step = t == 0;
        sgd_step(p.data(), momentum != 0.0f ? buf.data() : nullptr, g.data(), g.type, out.data(), DType::f32, n, h);
        for (std::size_t i = 0; i < n; ++i) {
          double gi = static_cast<double>(g.at(i)) * 0.25 + static_cast<double>(wd) * rp[i];
          if (momentum != 0.0f) {
            rbuf[i] = t == 0 ? gi : momentum * rbuf[i] + gi;
            gi = rbuf[i];
          }
          rp[i] -= 0.1 * gi;
        }
      }
      check_close(p, rp, 1e-5, 1e-6, "sgd p");
      REQUIRE(std::memcmp(out.data(), p.data(), n * 4) == 0);
      if (momentum == 0.0f) {
        REQUIRE(buf[0] == 123.0f);  // untouched without momentum
      } else {
        check_close(buf, rbuf, 1e-5, 1e-6, "sgd momentum");
      }
    }
  }
}

namespace {

// Values that stress every branch of the arithmetic and the conversions.
std::vector<float> special_values() {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> s = {0.0f,
                          -0.0f,
                          inf,
                          -inf,
                          nan,
                          -nan,
                          std::bit_cast<float>(0x7fa00001u),  // signalling NaN with payload
                          std::numeric_limits<float>::denorm_min(),
                          -1e-40f,
                          1e-39f,
                          std::numeric_limits<float>::min(),
                          65504.0f,
                          65520.0f,
                          65519.99f,
                          -70000.0f,
                          3e38f,
                          -3e38f,
                          5.96e-8f,
                          2.98e-8f,
                          6.1e-5f,
                          1.0f,
                          std::bit_cast<float>(0x3f808000u),  // bf16 tie, even
                          std::bit_cast<float>(0x3f818000u),  // bf16 tie, odd
                          std::bit_cast<float>(0x3f808001u),
                          std::bit_cast<float>(0x7f7fffffu),
                          std::bit_cast<float>(0x477ff000u),
                          std::bit_cast<float>(0x33000000u),
                          std::bit_cast<float>(0x33000001u),
                          std::bit_cast<float>(0x387fe000u)};
  return s;
}

struct State {
  std::vector<float> p, m, v;
  std::vector<std::uint8_t> out;
};

// Inputs with specials sprinkled over one array at a time (so a NaN result has one source and
// its payload is defined), plus random values elsewhere.
State make_state(std::size_t n, unsigned seed, std::size_t out_bytes) {
  State s{random_values(n, seed, -2.0f, 2.0f), random_values(n, seed + 1, -0.1f, 0.1f),
          random_values(n, seed + 2, 0.0f, 0.01f), std::vector<std::uint8_t>(n * out_bytes, 0xAB)};
  const auto sp = special_values();
  for (std::size_t i = 0; i < n; i += 5) {
    const float x = sp[(i / 5) % sp.size()];
    switch ((i / 5) % 4) {
      case 0: s.p[i] = x; break;
      case 1: s.m[i] = x; break;
      case 2: s.v[i] = std::fabs(x); break;
      default: break;  // the gradient gets this one
    }
  }
  return s;
}

std::vector<float> make_grad_values(std::size_t n, unsigned seed) {
  std::vector<float> g = random_values(n, seed, -1.0f, 1.0f);
  const auto sp = special_values();
  for (std::size_t i = 15; i < n; i += 20) g[i] = sp[(i / 20) % sp.size()];
  for (std::size_t i = 7; i < n; i += 53) g[i] = 1e-41f;  // subnormal fp32 gradient
  return g;
}

}  // namespace

TEST_CASE("every SIMD path is bitwise equal to the scalar path", "[host_optimizer]") {
  const auto paths = available_paths();
  const std::size_t sizes[] = {1, 7, 8, 15, 16, 17, 31, 33, 1000, 32768 + 13, 70001};
  const DType types[] = {DType::f32, DType::bf16, DType::f16};
  struct Mode {
    bool decoupled;
    float wd;
  };
  const Mode modes[] = {{true, 0.1f}, {false, 0.01f}, {false, 0.0f}};
  int compared = 0;
  for (SimdPath path : paths) {
    if (path == SimdPath::scalar) continue;
    for (std::size_t n : sizes) {
      for (DType gt : types) {
        const Grad g(gt, make_grad_values(n, static_cast<unsigned>(n)));
        for (int oi = 0; oi < 4; ++oi) {
          const bool has_out = oi < 3;
          const DType ot = has_out ? types[oi] : DType::f32;
          for (const Mode& mode : modes) {
            State a = make_state(n, 7, dtype_size(ot));
            State b = a;
            for (std::int64_t t = 1; t <= 2; ++t) {
              AdamHyper h;
              h.lr = 3e-3f;
              h.weight_decay = mode.wd;
              h.decoupled = mode.decoupled;
              h.step = t;
              h.grad_scale = t == 1 ? 1.0f : 0.37f;
              adam_step(a.p.data(), a.m.data(), a.v.data(), g.data(), gt, has_out ? a.out.data() : nullptr, ot, n, h,
                        SimdPath::scalar, 1);
              adam_step(b.p.data(), b.m.data(), b.v.data(), g.data(), gt, has_out ? b.out.data() : nullptr, ot, n, h,
                        path, 1);
            }
            INFO("path " << simd_path_name(path) << " n=" << n << " grad " << dtype_name(gt) << " out "
                         << (has_out ? dtype_name(ot) : "none") << " decoupled " << mode.decoupled << " wd "
                         << mode.wd);
            for (std::size_t i = 0; i < n; ++i) {
              INFO("element " << i << " scalar p=" << a.p[i] << " simd p=" << b.p[i]);
              REQUIRE(bits(a.p[i]) == bits(b.p[i]));
              REQUIRE(bits(a.m[i]) == bits(b.m[i]));
              REQUIRE(bits(a.v[i]) == bits(b.v[i]));
            }
            REQUIRE(a.out == b.out);
            ++compared;
          }
        }
      }
    }
  }
  if (paths.size() == 1) WARN("no SIMD path on this CPU: only the scalar path was exercised");
  CHECK(compared == static_cast<int>(paths.size() - 1) * 11 * 3 * 4 * 3);
}

TEST_CASE("param_out conversion equals zero/dtype.hpp for every path", "[host_optimizer]") {
  // lr = 0 and zero gradients and moments leave p unchanged, so param_out is exactly the
  // conversion of the given bit patterns: sweep a spread of patterns over all exponents.
  std::vector<float> p;
  for (std::uint64_t u = 0; u < (1ULL << 32); u += 65521) {
    p.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(u)));
  }
  for (float x : special_values()) p.push_back(x);
  // Every fp16 rounding boundary region: the 8 patterns around each multiple of 2^13.
  for (std::uint32_t e = 0x33000000u; e < 0x47800000u; e += 0x2000u * 97) {
    for (std::uint32_t d = 0; d < 8; ++d) p.push_back(std::bit_cast<float>(e + 0x0fffu + d));
  }
  const std::size_t n = p.size();
  const std::vector<float> zero_g(n, 0.0f);
  for (SimdPath path : available_paths()) {
    for (DType ot : {DType::bf16, DType::f16, DType::f32}) {
      std::vector<float> q = p, m(n, 0.0f), v(n, 0.0f);
      std::vector<std::uint16_t> out16(n);
      std::vector<float> out32(n);
      void* out = ot == DType::f32 ? static_cast<void*>(out32.data()) : out16.data();
      AdamHyper h;
      h.lr = 0.0f;
      h.weight_decay = 0.0f;
      h.decoupled = false;
      adam_step(q.data(), m.data(), v.data(), zero_g.data(), DType::f32, out, ot, n, h, path);
      for (std::size_t i = 0; i < n; ++i) {
        INFO("path " << simd_path_name(path) << " " << dtype_name(ot) << " input bits 0x" << std::hex << bits(p[i]));
        if (ot == DType::bf16) {
          REQUIRE(out16[i] == f32_to_bf16_bits(p[i]));
        } else if (ot == DType::f16) {
          REQUIRE(out16[i] == f32_to_f16_bits(p[i]));
        } else if (std::isnan(p[i])) {
          REQUIRE(std::isnan(out32[i]));
        } else {
          REQUIRE(bits(out32[i]) == bits(p[i]));
        }
      }
    }
  }
}

TEST_CASE("results do not depend on the thread count", "[host_optimizer]") {
  const std::size_t n = 5 * 32768 + 77;
  const Grad g(DType::bf16, make_grad_values(n, 11));
  for (SimdPath path : available_paths()) {
    State ref = make_state(n, 21, 2);
    State base = ref;
    AdamHyper h;
    h.weight_decay = 0.1f;
    h.step = 3;
    adam_step(ref.p.data(), ref.m.data(), ref.v.data(), g.data(), g.type, ref.out.data(), DType::bf16, n, h, path, 1);
    for (int threads : {0, 2, 3, 4, 7}) {
      State s = base;
      adam_step(s.p.data(), s.m.data(), s.v.data(), g.data(), g.type, s.out.data(), DType::bf16, n, h, path, threads);
      INFO("path " << simd_path_name(path) << " threads " << threads);
      REQUIRE(std::memcmp(s.p.data(), ref.p.data(), n * 4) == 0);
      REQUIRE(std::memcmp(s.m.data(), ref.m.data(), n * 4) == 0);
      REQUIRE(std::memcmp(s.v.data(), ref.v.data(), n * 4) == 0);
      REQUIRE(s.out == ref.out);
    }
  }
  // SGD too.
  std::vector<float> p1 = random_values(n, 5, -1, 1), b1(n, 0.0f);
  std::vector<float> p2 = p1, b2 = b1;
  SgdHyper sh;
  sh.momentum = 0.9f;
  sh.weight_decay = 1e-3f;
  sh.first_step = true;
  sgd_step(p1.data(), b1.data(), g.data(), g.type, nullptr, DType::f32, n, sh, 1);
  sgd_step(p2.data(), b2.data(), g.data(), g.type, nullptr, DType::f32, n, sh, 3);
  REQUIRE(std::memcmp(p1.data(), p2.data(), n * 4) == 0);
  REQUIRE(std::memcmp(b1.data(), b2.data(), n * 4) == 0);
}

TEST_CASE("bad arguments are reported", "[host_optimizer]") {
  std::vector<float> p(4, 1.0f), m(4), v(4), g(4);
  AdamHyper h;
  h.step = 0;
  REQUIRE_THROWS_AS(adam_step(p.data(), m.data(), v.data(), g.data(), DType::f32, nullptr, DType::f32, 4, h),
                    zero::Error);
  h.step = 1;
  REQUIRE_THROWS_WITH(adam_step(p.data(), nullptr, v.data(), g.data(), DType::f32, nullptr, DType::f32, 4, h),
                      Catch::Contains("m and v"));
  h.beta1 = 1.0f;
  REQUIRE_THROWS_WITH(adam_step(p.data(), m.data(), v.data(), g.data(), DType::f32, nullptr, DType::f32, 4, h),
                      Catch::Contains("betas"));
  h.beta1 = 0.9f;
  REQUIRE_THROWS_WITH(
      adam_step(p.data(), m.data(), v.data(), g.data(), static_cast<DType>(9), nullptr, DType::f32, 4, h),
      Catch::Contains("gradient type"));
  SgdHyper sh;
  sh.momentum = 0.5f;
  REQUIRE_THROWS_WITH(sgd_step(p.data(), nullptr, g.data(), DType::f32, nullptr, DType::f32, 4, sh),
                      Catch::Contains("momentum buffer"));
  // n == 0 is a no-op even with null pointers.
  REQUIRE_NOTHROW(adam_step(nullptr, nullptr, nullptr, nullptr, DType::f32, nullptr, DType::f32, 0, h));
  for (SimdPath path : {SimdPath::avx2, SimdPath::avx512}) {
    if (!simd_path_supported(path)) {
      REQUIRE_THROWS_WITH(
          adam_step(p.data(), m.data(), v.data(), g.data(), DType::f32, nullptr, DType::f32, 4, h, path),
          Catch::Contains("not supported by this CPU"));
    }
  }
}
