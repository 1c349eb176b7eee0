// Reference results and per-element error bounds for the flash-style attention kernels, shared
// by the host test of their tile arithmetic (test/unit/gpt/test_gpt_attention_math.cpp) and the
// GPU test of the kernels (test/gpu/test_gpt_attention.cpp).
//
// Inputs are bf16-representable floats. The reference is the host kernels' double
// instantiation (which stores the probabilities), the row log-sum-exp is computed here in
// double. The bounds follow the bf16 roundings the kernels make, each bounded by the unit
// u = 2^-7 (twice bf16's unit roundoff 2^-8: 8 significant bits, round to nearest; the factor 2
// is the margin for the fp32 arithmetic around each rounding), plus e, a bound on
// the relative error of an fp32 score q.k and of what is built from it (exp2f, lse):
//   e = 2^-16 (1 + max |q.k| scale summed in absolute values), 128 fp32 roundings of the
//   largest score, which covers head sizes up to 128 whatever order the products are summed.
// Forward, row i, column d (a = probabilities):
//   out:  (u + e) sum_j a_ij |v_jd|   (P rounded to bf16 before P.V)
//         + u |out_id|                (the output rounded to bf16)
//   lse:  e (1 + |lse_i|)
// Backward: dP_ij = dO_i . v_j, D_i = dO_i . out_i, dS_ij = a_ij (dP_ij - D_i) scale.
//   The kernel's D comes from the bf16 output: |dD_i| <= sum_d |dO_id| tol(out_id) + e sum_d
//   |dO_id out_id|. A rebuilt probability is off by e relative, dP by e sum_d |dO_id v_jd|, and
//   dS is rounded to bf16 (u), so
//   |d dS_ij| <= scale a_ij (|dD_i| + (u + e)(|dP_ij - D_i| + sum_d |dO_id v_jd|)) + u |dS_ij|
//   dQ_id: sum_j |d dS_ij| |k_jd|;  dK_jd: sum_i |d dS_ij| |q_id|;
//   dV_jd: (u + e) sum_i a_ij |dO_id| (P^T rounded to bf16);
//   and every gradient element + u |dqkv0 + grad| for the final rounding into bf16.
// A small absolute 1e-6 keeps exact zeros from demanding exact zeros.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gpt/host_kernels.hpp"
#include "zero/dtype.hpp"

namespace zero::gpt::attention_test {

// Round to the nearest bf16 (ties to even).
inline float round_bf16(float x) { return round_to(DType::bf16, x); }

// bf16-representable floats as bf16 bits, and back.
inline std::vector<std::uint16_t> to_bits(const std::vector<float>& v) {
  std::vector<std::uint16_t> b(v.size());
  for (std::size_t k = 0; k < v.size(); ++k) b[k] = f32_to_bf16_bits(v[k]);
  return b;
}
inline std::vector<float> from_bits(const std::vector<std::uint16_t>& b) {
  std::vector<float> v(b.size());
  for (std::size_t k = 0; k < b.size(); ++k) v[k] = bf16_bits_to_f32(b[k]);
  return v;
}

inline std::vector<float> random_bf16(std::size_t n, std::uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = round_bf16(normal(rng));
  return v;
}

struct Case {
  int B, T, C, NH;
  std::vector<float> qkv;    // [B,T,3C]
  std::vector<float> dout;   // [B,T,C]
  std::vector<float> dqkv0;  // [B,T,3C], what the gradient is added to
  int hs() const { return C / NH; }
  zero::gpt::AttentionShape shape() const { return {.B = B, .T = T, .NH = NH, .NKV = NH, .hs = hs()}; }
};

// q and k scaled by q_scale (larger: sharper softmax).
inline Case make_case(int B, int T, int C, int NH, std::uint64_t seed, float q_scale = 1.0f) {
  Case c{B, T, C, NH, {}, {}, {}};
  const std::size_t n3 = static_cast<std::size_t>(B) * T * 3 * C;
  c.qkv = random_bf16(n3, seed, 1.0f);
  for (std::size_t r = 0; r < static_cast<std::size_t>(B) * T; ++r)
    for (int col = 0; col < 2 * C; ++col) {
      float& x = c.qkv[r * 3 * C + col];
      x = round_bf16(x * q_scale);
    }
  c.dout = random_bf16(static_cast<std::size_t>(B) * T * C, seed + 1, 1.0f);
  c.dqkv0 = random_bf16(n3, seed + 2, 0.5f);
  return c;
}

// The shapes both kernel tests run (test/gpu/test_gpt_attention.cpp on the GPU,
// test/unit/gpt/test_gpt_attention_kernels.cpp on the host emulator): tiles full, partial and
// of one row, a sharp softmax, GPT-2's head size and head count, head sizes 32 and 128.
struct KernelCase {
  const char* name;
  int B, T, C, NH;
  std::uint64_t seed;
  float q_scale;
};
inline constexpr KernelCase kKernelCases[] = {
    {"one full tile, head size 64", 2, 64, 128, 2, 11, 1.0f},
    {"T = 1", 2, 1, 128, 2, 12, 1.0f},
    {"T = 100, not a tile multiple", 2, 100, 128, 2, 13, 1.0f},
    {"T = 65, one valid row and key in the last tile", 2, 65, 128, 2, 19, 1.0f},
    {"T = 100, sharp softmax", 1, 100, 128, 2, 14, 3.0f},
    {"T = 256, GPT-2 head size 64", 2, 256, 256, 4, 15, 1.0f},
    {"GPT-2 small heads: NH = 12, C = 768, T = 128", 1, 128, 768, 12, 16, 1.0f},
    {"head size 32", 2, 100, 128, 4, 17, 1.0f},
    {"head size 128, T = 130", 1, 130, 256, 2, 18, 1.0f},
};

struct Expect {
  std::vector<double> out, out_tol;    // [B,T,C]
  std::vector<double> lse, lse_tol;    // [B,NH,T]
  std::vector<double> dqkv, dqkv_tol;  // [B,T,3C], dqkv0 + gradient
};

inline Expect expect(const Case& c) {
  const int B = c.B, T = c.T, C = c.C, NH = c.NH, hs = c.hs();
  const std::size_t C3 = 3 * static_cast<std::size_t>(C);
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  const std::vector<double> qkv(c.qkv.begin(), c.qkv.end());
  const std::vector<double> dout(c.dout.begin(), c.dout.end());
  Expect e;
  e.out.assign(static_cast<std::size_t>(B) * T * C, 0.0);
  std::vector<double> att(static_cast<std::size_t>(B) * NH * T * T, 0.0);
  host::attention_forward<double>(e.out.data(), att.data(), qkv.data(), c.shape());
  e.dqkv.assign(c.dqkv0.begin(), c.dqkv0.end());
  std::vector<double> datt(att.size(), 0.0);
  host::attention_backward<double>(e.dqkv.data(), datt.data(), dout.data(), qkv.data(), att.data(), c.shape());

  auto q = [&](int b, int t) { return &qkv[(static_cast<std::size_t>(b) * T + t) * C3]; };
  // The score bound e over the whole case.
  double max_abs_score = 0;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int i = 0; i < T; ++i)
        for (int j = 0; j <= i; ++j) {
          double s = 0;
          for (int d = 0; d < hs; ++d) s += std::abs(q(b, i)[h * hs + d] * q(b, j)[C + h * hs + d]);
          max_abs_score = std::max(max_abs_score, s * scale);
        }
  const double u = std::ldexp(1.0, -7);
  const double es = std::ldexp(1.0, -16) * (1.0 + max_abs_score);
  const double abs_floor = 1e-6;

  e.lse.assign(static_cast<std::size_t>(B) * NH * T, 0.0);
  e.lse_tol.assign(e.lse.size(), 0.0);
  e.out_tol.assign(e.out.size(), 0.0);
  e.dqkv_tol.assign(e.dqkv.size(), 0.0);
  std::vector<double> s(T), dp(T), dp_abs(T);
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      for (int i = 0; i < T; ++i) {
        const double* qi = q(b, i) + h * hs;
        const double* a = &att[((static_cast<std::size_t>(b) * NH + h) * T + i) * T];
        const std::size_t orow = (static_cast<std::size_t>(b) * T + i) * C + h * hs;
        const double* dyi = &dout[orow];
        // lse in double, shifted by the maximum.
        double mx = -INFINITY;
        for (int j = 0; j <= i; ++j) {
          double dot = 0;
          for (int d = 0; d < hs; ++d) dot += qi[d] * q(b, j)[C + h * hs + d];
          s[j] = dot * scale;
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (int j = 0; j <= i; ++j) sum += std::exp(s[j] - mx);
        const std::size_t li = (static_cast<std::size_t>(b) * NH + h) * T + i;
        e.lse[li] = mx + std::log(sum);
        e.lse_tol[li] = es * (1.0 + std::abs(e.lse[li])) + abs_floor;

        double D = 0, dD = 0;
        for (int d = 0; d < hs; ++d) {
          double av = 0;
          for (int j = 0; j <= i; ++j) av += a[j] * std::abs(q(b, j)[2 * C + h * hs + d]);
          e.out_tol[orow + d] = (u + es) * av + u * std::abs(e.out[orow + d]) + abs_floor;
          D += dyi[d] * e.out[orow + d];
          dD += std::abs(dyi[d]) * e.out_tol[orow + d] + es * std::abs(dyi[d] * e.out[orow + d]);
        }
        for (int j = 0; j <= i; ++j) {
          const double* vj = q(b, j) + 2 * C + h * hs;
          double x = 0, xa = 0;
          for (int d = 0; d < hs; ++d) {
            x += dyi[d] * vj[d];
            xa += std::abs(dyi[d] * vj[d]);
          }
          dp[j] = x;
          dp_abs[j] = xa;
        }
        double* dq_tol = &e.dqkv_tol[(static_cast<std::size_t>(b) * T + i) * C3 + h * hs];
        for (int j = 0; j <= i; ++j) {
          const double ds = a[j] * (dp[j] - D) * scale;
          const double eds = scale * a[j] * (dD + (u + es) * (std::abs(dp[j] - D) + dp_abs[j])) + u * std::abs(ds);
          const double* kj = q(b, j) + C + h * hs;
          double* dk_tol = &e.dqkv_tol[(static_cast<std::size_t>(b) * T + j) * C3 + C + h * hs];
          double* dv_tol = dk_tol + C;
          for (int d = 0; d < hs; ++d) {
            dq_tol[d] += eds * std::abs(kj[d]);
            dk_tol[d] += eds * std::abs(qi[d]);
            dv_tol[d] += (u + es) * a[j] * std::abs(dyi[d]);
          }
        }
      }
    }
  }
  for (std::size_t k = 0; k < e.dqkv.size(); ++k) e.dqkv_tol[k] += u * std::abs(e.dqkv[k]) + abs_floor;
  return e;
}

// Elements outside their bound: count, and the first one described.
struct Check {
  std::size_t bad = 0;
  std::string first;
  double worst_ratio = 0;  // max |got - want| / tol: how close to failing
};

template <class Got>
Check check(const std::vector<Got>& got, const std::vector<double>& want, const std::vector<double>& tol,
            const std::string& what) {
  Check r;
  for (std::size_t k = 0; k < want.size(); ++k) {
    const double g = static_cast<double>(got[k]);
    const double err = std::abs(g - want[k]);
    const double ratio = std::isfinite(g) ? err / tol[k] : INFINITY;
    r.worst_ratio = std::max(r.worst_ratio, ratio);
    if (!(ratio <= 1.0)) {
      if (r.bad++ == 0) {
        std::ostringstream os;
        os << what << "[" << k << "]: got " << g << ", want " << want[k] << " +- " << tol[k];
        r.first = os.str();
      }
    }
  }
  return r;
}

}  // namespace zero::gpt::attention_test
