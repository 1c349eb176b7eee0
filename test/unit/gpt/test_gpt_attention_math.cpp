// The flash attention kernels' arithmetic (examples/gpt/cuda/attention_math.cuh), run on the
// host: the causal tile ranges against brute force, the online softmax against a direct
// log-sum-exp, and a replay of the kernels' tile loops (same tile order and ranges, the same
// functions, fp32 arithmetic, bf16 rounding of P, dS and the results where the kernels round)
// against the double reference, within the bounds the GPU test uses (attention_reference.hpp).
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <vector>

#include "attention_reference.hpp"
#include "gpt/cuda/attention_math.cuh"

namespace attn = zero::gpt::cuda::attn;
namespace at = zero::gpt::attention_test;

namespace {

// True when some (i, j) in the tile pair is attended.
bool tile_pair_live(int qt, int kt, int q_rows, int k_rows, int T) {
  for (int i = qt * q_rows; i < (qt + 1) * q_rows; ++i)
    for (int j = kt * k_rows; j < (kt + 1) * k_rows; ++j)
      if (attn::attends(i, j, T)) return true;
  return false;
}

struct Emulated {
  std::vector<float> out, lse, dqkv;
};

// Deliberate errors the bounds must catch, one per class of mistake a kernel could make:
// the mask one key too wide (j <= i + 1), the scale 1/hs instead of 1/sqrt(hs), the lse left
// in log2 (the forward forgetting the ln 2; the backward then rebuilds wrong probabilities),
// and the output accumulator not rescaled when a later tile raises the row maximum.
enum class Bug { none, mask_off_by_one, scale_no_sqrt, lse_log2, no_output_rescale };

// What the kernels compute, tile by tile, with `bug` injected.
Emulated emulate(const at::Case& c, int q_rows, int k_rows, Bug bug = Bug::none) {
  const int B = c.B, T = c.T, C = c.C, NH = c.NH, hs = c.hs();
  const std::size_t C3 = 3 * static_cast<std::size_t>(C);
  const float scale =
      bug == Bug::scale_no_sqrt ? 1.0f / static_cast<float>(hs) : 1.0f / std::sqrt(static_cast<float>(hs));
  const float scale_log2 = scale * attn::kLog2e;
  const bool mask_bug = bug == Bug::mask_off_by_one;
  auto attends = [&](int i, int j) { return mask_bug ? (j <= i + 1 && j < T && i < T) : attn::attends(i, j, T); };
  auto row = [&](int b, int t) { return &c.qkv[(static_cast<std::size_t>(b) * T + t) * C3]; };
  auto score = [&](int b, int h, int i, int j) {
    float s = 0;
    for (int d = 0; d < hs; ++d) s += row(b, i)[h * hs + d] * row(b, j)[C + h * hs + d];
    return s;
  };
  Emulated r;
  r.out.assign(static_cast<std::size_t>(B) * T * C, 0.0f);
  r.lse.assign(static_cast<std::size_t>(B) * NH * T, 0.0f);
  r.dqkv = c.dqkv0;
  std::vector<float> acc_q(r.dqkv.size(), 0.0f), acc_kv(r.dqkv.size(), 0.0f);
  const int n_qt = attn::tile_count(T, q_rows), n_kt = attn::tile_count(T, k_rows);

  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const std::size_t bh = static_cast<std::size_t>(b) * NH + h;
      // Forward.
      for (int qt = 0; qt < n_qt; ++qt) {
        for (int i = qt * q_rows; i < std::min(T, (qt + 1) * q_rows); ++i) {
          attn::OnlineSoftmax st = attn::online_init();
          std::vector<float> o(hs, 0.0f);
          for (int kt = 0; kt < attn::causal_key_tiles(qt, q_rows, k_rows, T); ++kt) {
            std::vector<float> s2(k_rows);
            float tile_max = -INFINITY;
            for (int c2 = 0; c2 < k_rows; ++c2) {
              const int j = kt * k_rows + c2;
              s2[c2] = attends(i, j) ? score(b, h, i, j) * scale_log2 : -INFINITY;
              tile_max = std::max(tile_max, s2[c2]);
            }
            const float alpha = attn::online_rescale(st, tile_max);
            float tile_sum = 0;
            if (bug != Bug::no_output_rescale)
              for (auto& x : o) x *= alpha;
            for (int c2 = 0; c2 < k_rows; ++c2) {
              const float p = attn::online_prob(st, s2[c2]);
              tile_sum += p;
              if (p == 0.0f) continue;  // also keeps rows past T (zeros in the kernel) out
              const float pb = at::round_bf16(p);
              const float* v = row(b, kt * k_rows + c2) + 2 * C + h * hs;
              for (int d = 0; d < hs; ++d) o[d] += pb * v[d];
            }
            st.sum += tile_sum;
          }
          for (int d = 0; d < hs; ++d)
            r.out[(static_cast<std::size_t>(b) * T + i) * C + h * hs + d] = at::round_bf16(o[d] / st.sum);
          r.lse[bh * T + i] = bug == Bug::lse_log2 ? attn::online_lse(st) / attn::kLn2 : attn::online_lse(st);
        }
      }
      // Backward: D from the bf16 output.
      std::vector<float> D(T);
      for (int i = 0; i < T; ++i) {
        float x = 0;
        for (int d = 0; d < hs; ++d) {
          const std::size_t k = (static_cast<std::size_t>(b) * T + i) * C + h * hs + d;
          x += c.dout[k] * r.out[k];
        }
        D[i] = x;
      }
      auto dp_of = [&](int i, int j) {
        float x = 0;
        for (int d = 0; d < hs; ++d)
          x += c.dout[(static_cast<std::size_t>(b) * T + i) * C + h * hs + d] * row(b, j)[2 * C + h * hs + d];
        return x;
      };
      auto p_of = [&](int i, int j) {
        const float lse = r.lse[bh * T + i];
        return attends(i, j) ? attn::prob_from_lse(score(b, h, i, j) * scale_log2, lse) : 0.0f;
      };
      // dK, dV: key tiles outer, query tiles from the first live one.
      for (int kt = 0; kt < n_kt; ++kt) {
        for (int qt = attn::causal_first_query_tile(kt, q_rows, k_rows); qt < n_qt; ++qt) {
          for (int j = kt * k_rows; j < std::min(T, (kt + 1) * k_rows); ++j) {
            for (int i = qt * q_rows; i < std::min(T, (qt + 1) * q_rows); ++i) {
              const float p = p_of(i, j);
              if (p == 0.0f) continue;
              const float ds = at::round_bf16(attn::score_grad(p, dp_of(i, j), D[i], scale));
              const float pb = at::round_bf16(p);
              float* dk = &acc_kv[(static_cast<std::size_t>(b) * T + j) * C3 + C + h * hs];
              for (int d = 0; d < hs; ++d) {
                dk[d] += ds * row(b, i)[h * hs + d];
                dk[C + d] += pb * c.dout[(static_cast<std::size_t>(b) * T + i) * C + h * hs + d];
              }
            }
          }
        }
      }
      // dQ: query tiles outer, key tiles up to the diagonal.
      for (int qt = 0; qt < n_qt; ++qt) {
        for (int kt = 0; kt < attn::causal_key_tiles(qt, q_rows, k_rows, T); ++kt) {
          for (int i = qt * q_rows; i < std::min(T, (qt + 1) * q_rows); ++i) {
            for (int j = kt * k_rows; j < std::min(T, (kt + 1) * k_rows); ++j) {
              const float p = p_of(i, j);
              if (p == 0.0f) continue;
              const float ds = at::round_bf16(attn::score_grad(p, dp_of(i, j), D[i], scale));
              float* dq = &acc_q[(static_cast<std::size_t>(b) * T + i) * C3 + h * hs];
              for (int d = 0; d < hs; ++d) dq[d] += ds * row(b, j)[C + h * hs + d];
            }
          }
        }
      }
    }
  }
  for (std::size_t k = 0; k < r.dqkv.size(); ++k)
    r.dqkv[k] = at::round_bf16(r.dqkv[k] + acc_q[k] + acc_kv[k]);  // one owner per element
  return r;
}

}  // namespace

TEST_CASE("causal tile ranges hold exactly the live tile pairs", "[attention]") {
  const int tiles[][2] = {{64, 64}, {32, 16}, {16, 32}, {16, 16}};
  for (const auto& t : tiles) {
    const int qr = t[0], kr = t[1];
    for (int T : {1, 2, 15, 16, 17, 31, 63, 64, 65, 100, 128, 130}) {
      INFO("q_rows " << qr << " k_rows " << kr << " T " << T);
      const int n_qt = attn::tile_count(T, qr), n_kt = attn::tile_count(T, kr);
      REQUIRE((n_qt - 1) * qr < T);
      REQUIRE(n_qt * qr >= T);
      for (int qt = 0; qt < n_qt; ++qt) {
        const int nk = attn::causal_key_tiles(qt, qr, kr, T);
        REQUIRE(nk >= 1);
        REQUIRE(nk <= n_kt);
        for (int kt = 0; kt < n_kt; ++kt) REQUIRE(tile_pair_live(qt, kt, qr, kr, T) == (kt < nk));
      }
      for (int kt = 0; kt < n_kt; ++kt) {
        const int first = attn::causal_first_query_tile(kt, qr, kr);
        for (int qt = 0; qt < n_qt; ++qt) REQUIRE(tile_pair_live(qt, kt, qr, kr, T) == (qt >= first));
      }
    }
  }
}

TEST_CASE("online softmax equals the direct log-sum-exp, in any tiling", "[attention]") {
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  for (int n : {1, 5, 64, 200}) {
    std::vector<float> s2(n);
    for (auto& x : s2) x = normal(rng);
    if (n > 3) s2[2] = -INFINITY;  // a masked key inside the row
    double mx = -INFINITY, sum = 0;
    for (float x : s2) mx = std::max(mx, double(x));
    for (float x : s2) sum += std::exp2(double(x) - mx);
    const double want = (mx + std::log2(sum)) * std::log(2.0);
    for (int tile : {1, 3, 16, 64}) {
      attn::OnlineSoftmax st = attn::online_init();
      std::vector<attn::OnlineSoftmax> parts;
      for (int c0 = 0; c0 < n; c0 += tile) {
        float tmax = -INFINITY;
        for (int c = c0; c < std::min(n, c0 + tile); ++c) tmax = std::max(tmax, s2[c]);
        attn::online_rescale(st, tmax);
        attn::OnlineSoftmax part = attn::online_init();
        attn::online_rescale(part, tmax);
        float tsum = 0;
        for (int c = c0; c < std::min(n, c0 + tile); ++c) tsum += attn::online_prob(st, s2[c]);
        st.sum += tsum;
        for (int c = c0; c < std::min(n, c0 + tile); ++c) part.sum += attn::online_prob(part, s2[c]);
        parts.push_back(part);
      }
      INFO("n " << n << " tile " << tile);
      CHECK(std::abs(attn::online_lse(st) - want) <= 1e-5 * (1 + std::abs(want)));
      // The per-tile states merged in any grouping give the same row.
      attn::OnlineSoftmax merged = attn::online_init();
      for (const auto& p : parts) merged = attn::online_merge(merged, p);
      CHECK(std::abs(attn::online_lse(merged) - want) <= 1e-5 * (1 + std::abs(want)));
    }
  }
  // A row with no key yet: rescaling never produces NaN, and masked keys give exactly 0.
  attn::OnlineSoftmax st = attn::online_init();
  CHECK(attn::online_rescale(st, -INFINITY) == 0.0f);
  CHECK(attn::online_prob(st, -INFINITY) == 0.0f);
  CHECK(st.sum == 0.0f);
  const attn::OnlineSoftmax empty = attn::online_merge(attn::online_init(), attn::online_init());
  CHECK(empty.max == -INFINITY);
  CHECK(empty.sum == 0.0f);
}

TEST_CASE("the kernels' tile loops match the double reference within the stated bounds", "[attention]") {
  struct Shape {
    int B, T, C, NH;
    float q_scale;
  };
  // With the kernels' 64 x 64 tiles: T = 65 leaves one valid row (and key) in the last tile,
  // T = 128 is two full tiles (no tail at all).
  const Shape shapes[] = {{2, 64, 128, 2, 1.0f},  {2, 1, 128, 2, 1.0f}, {1, 100, 128, 2, 1.0f}, {1, 100, 128, 4, 3.0f},
                          {1, 130, 256, 2, 1.0f}, {1, 65, 64, 1, 1.0f}, {1, 128, 128, 4, 1.0f}};
  const int tiles[][2] = {{64, 64}, {32, 16}, {16, 32}};
  std::uint64_t seed = 100;
  for (const auto& s : shapes) {
    const at::Case c = at::make_case(s.B, s.T, s.C, s.NH, seed += 10, s.q_scale);
    const at::Expect e = at::expect(c);
    for (const auto& t : tiles) {
      INFO("B " << s.B << " T " << s.T << " C " << s.C << " NH " << s.NH << " q_scale " << s.q_scale << " tiles "
                << t[0] << "x" << t[1]);
      const Emulated r = emulate(c, t[0], t[1]);
      const auto out = at::check(r.out, e.out, e.out_tol, "out");
      const auto lse = at::check(r.lse, e.lse, e.lse_tol, "lse");
      const auto dqkv = at::check(r.dqkv, e.dqkv, e.dqkv_tol, "dqkv");
      INFO(out.first << lse.first << dqkv.first);
      INFO("worst error / bound: out " << out.worst_ratio << " lse " << lse.worst_ratio << " dqkv "
                                       << dqkv.worst_ratio);
      CHECK(out.bad == 0);
      CHECK(lse.bad == 0);
      CHECK(dqkv.bad == 0);
    }
  }
}

TEST_CASE("the bounds catch a mask off by one key", "[attention]") {
  const at::Case c = at::make_case(1, 40, 128, 2, 5);
  const at::Expect e = at::expect(c);
  const Emulated r = emulate(c, 16, 16, Bug::mask_off_by_one);
  CHECK(at::check(r.out, e.out, e.out_tol, "out").bad > 0);
  CHECK(at::check(r.lse, e.lse, e.lse_tol, "lse").bad > 0);
  CHECK(at::check(r.dqkv, e.dqkv, e.dqkv_tol, "dqkv").bad > 0);
}

// The GPU test shares these bounds: each wrong constant or skipped step must fail them, or that
// test could pass a kernel with the same mistake.
TEST_CASE("the bounds catch a wrong scale, a log2 lse and a skipped rescale", "[attention]") {
  const at::Case c = at::make_case(1, 40, 128, 2, 6);
  const at::Expect e = at::expect(c);
  SECTION("scale 1/hs") {
    const Emulated r = emulate(c, 16, 16, Bug::scale_no_sqrt);
    CHECK(at::check(r.out, e.out, e.out_tol, "out").bad > 0);
    CHECK(at::check(r.lse, e.lse, e.lse_tol, "lse").bad > 0);
    CHECK(at::check(r.dqkv, e.dqkv, e.dqkv_tol, "dqkv").bad > 0);
  }
  SECTION("lse in log2") {
    const Emulated r = emulate(c, 16, 16, Bug::lse_log2);
    CHECK(at::check(r.out, e.out, e.out_tol, "out").bad == 0);  // the forward output is right
    CHECK(at::check(r.lse, e.lse, e.lse_tol, "lse").bad > 0);
    CHECK(at::check(r.dqkv, e.dqkv, e.dqkv_tol, "dqkv").bad > 0);
  }
  SECTION("output not rescaled") {
    const Emulated r = emulate(c, 16, 16, Bug::no_output_rescale);
    CHECK(at::check(r.out, e.out, e.out_tol, "out").bad > 0);
    CHECK(at::check(r.lse, e.lse, e.lse_tol, "lse").bad == 0);  // the sum is still rescaled
  }
}
