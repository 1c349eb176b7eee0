// The CUDA kernels' per-element arithmetic (examples/gpt/cuda/gpt_math.cuh), run on the host in
// fp32 and compared with the fp64 reference the trainer's CPU path is (host_kernels.hpp).
//
// The header is written for both compilers, so these are the formulas the GPU executes, minus
// the device's own libm (tanhf, expf, rsqrtf there are within 2 ulp of the host's). Tolerances:
// a few fp32 rounding steps (2^-24 relative each) on the magnitude of the terms involved, with
// room to spare; a wrong term or sign is off by orders of magnitude more.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gpt/cuda/gpt_math.cuh"
#include "gpt/host_kernels.hpp"

namespace h = zero::gpt::host;
namespace m = zero::gpt::cuda::math;

namespace {

std::vector<double> normals(std::size_t n, std::uint64_t seed, double scale) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> d(0.0, scale);
  std::vector<double> v(n);
  // Values a float holds exactly, so the fp32 and fp64 computations start from the same inputs.
  for (auto& x : v) x = static_cast<float>(d(rng));
  return v;
}

}  // namespace

TEST_CASE("gelu and its derivative match the fp64 host kernels", "[gpt][math]") {
  std::vector<double> x;
  for (int i = -1600; i <= 1600; ++i) x.push_back(static_cast<float>(i / 200.0));  // [-8, 8]
  std::vector<double> y(x.size()), g(x.size(), 0.0), ones(x.size(), 1.0);
  h::gelu_forward(y.data(), x.data(), x.size());
  h::gelu_backward(g.data(), x.data(), ones.data(), x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float xf = static_cast<float>(x[i]);
    INFO("x = " << x[i]);
    // 0.5 x (1 + tanh u) cancels for negative x: the absolute error scales with |x|.
    CHECK(std::abs(m::gelu(xf) - y[i]) <= 0x1p-20 * (1.0 + std::abs(x[i])));
    // The derivative's terms grow like x^2 (the cubic's derivative times x).
    CHECK(std::abs(m::gelu_grad(xf) - g[i]) <= 0x1p-20 * (1.0 + x[i] * x[i]));
  }
  // The formula, not only agreement: GELU(0) = 0, GELU'(0) = 1/2, GELU(x) -> x for large x.
  CHECK(m::gelu(0.0f) == 0.0f);
  CHECK(m::gelu_grad(0.0f) == 0.5f);
  CHECK(m::gelu(8.0f) == Approx(8.0f).epsilon(1e-6));
}

TEST_CASE("layernorm_dinp over a row matches the fp64 host backward", "[gpt][math]") {
  for (const int C : {1, 7, 40, 768}) {
    INFO("C = " << C);
    const auto x = normals(C, 10 + C, 2.0);
    const auto w = normals(C, 20 + C, 1.0);
    const auto b = normals(C, 30 + C, 1.0);
    const auto dy = normals(C, 40 + C, 1.0);
    std::vector<double> out(C), dinp(C, 0.0), dw(C, 0.0), db(C, 0.0);
    double mean = 0, rstd = 0;
    h::layernorm_forward(out.data(), &mean, &rstd, x.data(), w.data(), b.data(), 1, C);

    // The kernels' statistics: two fp32 passes, then rstd from the variance.
    float sum = 0;
    for (int c = 0; c < C; ++c) sum += static_cast<float>(x[c]);
    const float mf = sum / static_cast<float>(C);
    float sq = 0;
    for (int c = 0; c < C; ++c) {
      const float d = static_cast<float>(x[c]) - mf;
      sq += d * d;
    }
    const float sf = m::layernorm_rstd(sq / static_cast<float>(C));
    CHECK(std::abs(mf - mean) <= 0x1p-18 * (1.0 + std::abs(mean)));
    CHECK(std::abs(sf - rstd) <= 0x1p-16 * rstd);

    // The backward from the same (float) statistics on both sides.
    const double md = mf, sd = sf;
    h::layernorm_backward(dinp.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), &md, &sd, 1, C);
    float sum_dn = 0, sum_dn_xhat = 0;
    for (int c = 0; c < C; ++c) {
      const float dn = static_cast<float>(dy[c]) * static_cast<float>(w[c]);
      sum_dn += dn;
      sum_dn_xhat += dn * ((static_cast<float>(x[c]) - mf) * sf);
    }
    const float mean_dn = sum_dn / static_cast<float>(C);
    const float mean_dn_xhat = sum_dn_xhat / static_cast<float>(C);
    for (int c = 0; c < C; ++c) {
      const float xhat = (static_cast<float>(x[c]) - mf) * sf;
      const float got =
          m::layernorm_dinp(static_cast<float>(dy[c]), static_cast<float>(w[c]), xhat, mean_dn, mean_dn_xhat, sf);
      // Terms of size rstd (|dy w| + |mean_dn| + |xhat mean_dn_xhat|); the row sums add about
      // C rounding steps to the means.
      const double scale = sd * (std::abs(dy[c] * w[c]) + std::abs(mean_dn) + std::abs(xhat * mean_dn_xhat) + 1.0);
      INFO("c = " << c);
      CHECK(std::abs(got - dinp[c]) <= 0x1p-24 * (C + 8) * scale);
    }
  }
}

TEST_CASE("online softmax statistics merge to the row's log-sum-exp", "[gpt][math]") {
  const int V = 1000;
  auto l = normals(V, 7, 4.0);
  l[3] = -std::numeric_limits<double>::infinity();  // probability 0, must not poison the sum
  l[500] = 30.0;                                    // one dominant logit
  double mx = -INFINITY;
  for (double v : l) mx = std::max(mx, v);
  double s = 0;
  for (double v : l) s += std::exp(v - mx);
  const double lse = mx + std::log(s);

  m::SoftmaxStats seq = m::softmax_stats_empty();
  for (double v : l) seq = m::softmax_stats_add(seq, static_cast<float>(v));
  CHECK(std::abs(m::softmax_stats_lse(seq) - lse) <= 1e-6 * std::abs(lse));

  // The kernels' split: thread t takes t, t + 32, ...; then a butterfly over 32 partials.
  std::vector<m::SoftmaxStats> part(32, m::softmax_stats_empty());
  for (int i = 0; i < V; ++i) part[i % 32] = m::softmax_stats_add(part[i % 32], static_cast<float>(l[i]));
  for (int offset = 16; offset > 0; offset >>= 1) {
    std::vector<m::SoftmaxStats> next(32);
    for (int t = 0; t < 32; ++t) next[t] = m::softmax_stats_merge(part[t], part[t ^ offset]);
    part = next;
  }
  for (int t = 1; t < 32; ++t) {  // every lane holds the same bits, as the kernels rely on
    CHECK(part[t].max == part[0].max);
    CHECK(part[t].sum == part[0].sum);
  }
  CHECK(std::abs(m::softmax_stats_lse(part[0]) - lse) <= 1e-6 * std::abs(lse));

  // The empty set is an identity on either side, and lanes that saw only -inf stay empty.
  const m::SoftmaxStats e = m::softmax_stats_empty();
  const m::SoftmaxStats a = m::softmax_stats_merge(e, seq), b = m::softmax_stats_merge(seq, e);
  CHECK((a.max == seq.max && a.sum == seq.sum && b.max == seq.max && b.sum == seq.sum));
  const m::SoftmaxStats only_inf = m::softmax_stats_add(e, -INFINITY);
  CHECK((only_inf.sum == 0.0f && std::isinf(only_inf.max)));
  CHECK(std::isnan(m::softmax_stats_add(seq, NAN).sum));
}

TEST_CASE("cross_entropy_dlogit matches the fp64 host softmax cross-entropy", "[gpt][math]") {
  const int V = 300, Vp = 304, target = 17;
  auto l = normals(Vp, 8, 3.0);
  std::vector<double> d(Vp, 123.0);
  double loss = 0;
  const double dloss = 1.0 / 64;
  h::softmax_cross_entropy(&loss, d.data(), l.data(), &target, 1, V, Vp, dloss);
  m::SoftmaxStats st = m::softmax_stats_empty();
  for (int v = 0; v < V; ++v) st = m::softmax_stats_add(st, static_cast<float>(l[v]));
  const float lse = m::softmax_stats_lse(st);
  CHECK(std::abs((lse - static_cast<float>(l[target])) - loss) <= 1e-6 * (1.0 + std::abs(lse)));
  double total = 0;
  for (int v = 0; v < V; ++v) {
    const float g = m::cross_entropy_dlogit(static_cast<float>(l[v]), lse, v == target, static_cast<float>(dloss));
    INFO("v = " << v);
    // exp of (l - lse) with lse off by ~1e-6 absolute: relative error ~1e-6 in the probability.
    CHECK(std::abs(g - d[v]) <= 0x1p-18 * dloss);
    total += g;
  }
  CHECK(std::abs(total) <= 1e-5 * dloss);  // probabilities sum to one, minus the one-hot
}

TEST_CASE("column reductions split rows into fixed blocks", "[gpt][math]") {
  for (const int n : {1, 63, 64, 65, 1000, 65536, 65537, 1 << 20, 5'000'000, std::numeric_limits<int>::max()}) {
    INFO("n = " << n);
    const int r = m::column_reduce_rows_per_block(n);
    const int g = m::column_reduce_blocks(n);
    CHECK(r >= 64);
    CHECK(g >= 1);
    CHECK(g <= 1024);
    // Blocks cover every row and none is empty.
    CHECK(static_cast<long long>(g) * r >= n);
    CHECK(static_cast<long long>(g - 1) * r < n);
  }
}
