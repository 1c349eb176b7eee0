// Gradient checks of every GPT layer's backward against centred finite differences.
//
// The kernels are templates (host_kernels.hpp); here they run in double precision, where a
// centred difference with step 1e-5 is accurate to ~1e-9, so the tolerance can be tight (1e-6
// relative) and a wrong term in any backward shows up unmistakably. HostOps runs the same code
// in float; the last test checks that the float path agrees with the double one.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "gpt/host_kernels.hpp"
#include "gpt/ops.hpp"

namespace h = zero::gpt::host;

namespace {

using Vec = std::vector<double>;

Vec random_vec(std::size_t n, std::mt19937_64& rng, double scale = 1.0) {
  std::normal_distribution<double> d(0.0, scale);
  Vec v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// d objective / d x[i] for every i, by centred differences.
Vec numeric_grad(Vec& x, const std::function<double()>& objective, double eps = 1e-5) {
  Vec g(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double keep = x[i];
    x[i] = keep + eps;
    const double up = objective();
    x[i] = keep - eps;
    const double down = objective();
    x[i] = keep;
    g[i] = (up - down) / (2 * eps);
  }
  return g;
}

void require_close(const Vec& analytic, const Vec& numeric, const char* what, double tol = 1e-6) {
  REQUIRE(analytic.size() == numeric.size());
  double worst = 0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < analytic.size(); ++i) {
    const double err = std::abs(analytic[i] - numeric[i]) / (1.0 + std::abs(numeric[i]));
    if (err > worst) {
      worst = err;
      at = i;
    }
  }
  INFO(what << ": worst relative error " << worst << " at " << at << " (analytic " << analytic[at] << ", numeric "
            << numeric[at] << ")");
  CHECK(worst <= tol);
}

// Gradients are added into what is already there: start from `base` and subtract it after.
Vec minus(const Vec& a, const Vec& base) {
  Vec r(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) r[i] = a[i] - base[i];
  return r;
}

// Multi-head attention of C / NH dimensions per head (GPT-2's): as many key/value heads as heads.
zero::gpt::AttentionShape mha(int B, int T, int C, int NH) {
  return {.B = B, .T = T, .NH = NH, .NKV = NH, .hs = C / NH};
}

}  // namespace

TEST_CASE("layernorm backward matches finite differences", "[gpt][layers]") {
  std::mt19937_64 rng(1);
  const int N = 3, C = 8;
  Vec x = random_vec(N * C, rng), w = random_vec(C, rng), b = random_vec(C, rng);
  const Vec r = random_vec(N * C, rng);  // objective = sum(out * r)
  Vec out(N * C), mean(N), rstd(N);
  auto objective = [&] {
    h::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
    return dot(out, r);
  };
  objective();
  const Vec base_x = random_vec(N * C, rng), base_w = random_vec(C, rng), base_b = random_vec(C, rng);
  Vec dx = base_x, dw = base_w, db = base_b;
  h::layernorm_backward(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(), mean.data(), rstd.data(), N, C);
  require_close(minus(dx, base_x), numeric_grad(x, objective), "d input");
  require_close(minus(dw, base_w), numeric_grad(w, objective), "d weight");
  require_close(minus(db, base_b), numeric_grad(b, objective), "d bias");
}

TEST_CASE("matmul backward matches finite differences", "[gpt][layers]") {
  std::mt19937_64 rng(2);
  const int N = 4, C = 5, OC = 7;
  Vec x = random_vec(N * C, rng), w = random_vec(C * OC, rng), b = random_vec(OC, rng);
  const Vec r = random_vec(N * OC, rng);
  Vec out(N * OC);
  auto objective = [&] {
    h::matmul_forward(out.data(), x.data(), w.data(), b.data(), N, C, OC);
    return dot(out, r);
  };
  objective();
  const Vec base_x = random_vec(N * C, rng), base_w = random_vec(C * OC, rng), base_b = random_vec(OC, rng);
  Vec dx = base_x, dw = base_w, db = base_b;
  h::matmul_backward(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(), N, C, OC);
  require_close(minus(dx, base_x), numeric_grad(x, objective), "d input");
  require_close(minus(dw, base_w), numeric_grad(w, objective), "d weight");
  require_close(minus(db, base_b), numeric_grad(b, objective), "d bias");

  SECTION("without a bias and without an input gradient") {
    Vec dw2(C * OC, 0.0);
    h::matmul_backward<double>(nullptr, dw2.data(), nullptr, r.data(), x.data(), w.data(), N, C, OC);
    require_close(dw2, minus(dw, base_w), "d weight alone", 1e-12);
  }
}

TEST_CASE("causal attention backward matches finite differences", "[gpt][layers]") {
  std::mt19937_64 rng(3);
  const int B = 2, T = 5, C = 8, NH = 2;
  Vec qkv = random_vec(B * T * 3 * C, rng);
  const Vec r = random_vec(B * T * C, rng);
  Vec out(B * T * C), att(B * NH * T * T), datt(B * NH * T * T);
  auto objective = [&] {
    h::attention_forward(out.data(), att.data(), qkv.data(), mha(B, T, C, NH));
    return dot(out, r);
  };
  objective();
  // Probabilities: rows sum to 1, nothing above the diagonal.
  for (int bh = 0; bh < B * NH; ++bh)
    for (int t = 0; t < T; ++t) {
      double s = 0;
      for (int t2 = 0; t2 < T; ++t2) {
        const double a = att[static_cast<std::size_t>((bh * T + t) * T + t2)];
        if (t2 > t) CHECK(a == 0.0);
        s += a;
      }
      CHECK(s == Approx(1.0).epsilon(1e-12));
    }
  const Vec base = random_vec(qkv.size(), rng);
  Vec dqkv = base;
  h::attention_backward(dqkv.data(), datt.data(), r.data(), qkv.data(), att.data(), mha(B, T, C, NH));
  require_close(minus(dqkv, base), numeric_grad(qkv, objective), "d qkv");

  SECTION("a position never sees the future") {
    // Changing the last token's q, k, v leaves every earlier output unchanged.
    Vec before = out;
    for (int i = 0; i < 3 * C; ++i) qkv[static_cast<std::size_t>((T - 1) * 3 * C + i)] += 0.5;
    objective();
    for (int t = 0; t < T - 1; ++t)
      for (int c = 0; c < C; ++c)
        CHECK(out[static_cast<std::size_t>(t * C + c)] == before[static_cast<std::size_t>(t * C + c)]);
  }
}

TEST_CASE("gelu backward matches finite differences", "[gpt][layers]") {
  Vec x(41);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = -5.0 + 0.25 * static_cast<double>(i);
  std::mt19937_64 rng(4);
  const Vec r = random_vec(x.size(), rng);
  Vec out(x.size());
  auto objective = [&] {
    h::gelu_forward(out.data(), x.data(), x.size());
    return dot(out, r);
  };
  objective();
  CHECK(out[20] == 0.0);                        // gelu(0) = 0
  CHECK(out[40] == Approx(5.0).epsilon(1e-6));  // ~identity for large x
  const Vec base = random_vec(x.size(), rng);
  Vec dx = base;
  h::gelu_backward(dx.data(), x.data(), r.data(), x.size());
  require_close(minus(dx, base), numeric_grad(x, objective), "d input");
}

TEST_CASE("softmax cross-entropy with a padded vocabulary", "[gpt][layers]") {
  std::mt19937_64 rng(5);
  const int N = 4, V = 5, Vp = 8;
  Vec logits = random_vec(N * Vp, rng, 2.0);
  const std::vector<std::int32_t> targets = {0, 4, 2, 4};
  const double dloss = 0.7;
  Vec losses(N);
  auto objective = [&] {
    h::softmax_cross_entropy<double>(losses.data(), nullptr, logits.data(), targets.data(), N, V, Vp, 0.0);
    double s = 0;
    for (double l : losses) s += l;
    return dloss * s;
  };
  objective();
  // Reference loss, written out for row 0.
  double z = 0;
  for (int v = 0; v < V; ++v) z += std::exp(logits[static_cast<std::size_t>(v)]);
  CHECK(losses[0] == Approx(std::log(z) - logits[0]).epsilon(1e-12));

  Vec dlogits(N * Vp, 42.0);  // overwritten, not added: it is the seed of the backward
  h::softmax_cross_entropy(losses.data(), dlogits.data(), logits.data(), targets.data(), N, V, Vp, dloss);
  require_close(dlogits, numeric_grad(logits, objective), "d logits");
  for (int n = 0; n < N; ++n)
    for (int v = V; v < Vp; ++v) CHECK(dlogits[static_cast<std::size_t>(n * Vp + v)] == 0.0);

  SECTION("padded logits never affect the loss") {
    const double before = objective();
    for (int n = 0; n < N; ++n)
      for (int v = V; v < Vp; ++v) logits[static_cast<std::size_t>(n * Vp + v)] = 1e3;
    CHECK(objective() == before);
  }
  SECTION("in place: the gradient may overwrite the logits") {
    Vec inplace = logits;
    h::softmax_cross_entropy(losses.data(), inplace.data(), inplace.data(), targets.data(), N, V, Vp, dloss);
    require_close(inplace, dlogits, "in place", 1e-14);
  }
}

TEST_CASE("embedding backward matches finite differences", "[gpt][layers]") {
  std::mt19937_64 rng(6);
  const int B = 2, T = 3, C = 4, V = 5;
  Vec wte = random_vec(V * C, rng), wpe = random_vec(T * C, rng);
  const std::vector<std::int32_t> tokens = {1, 3, 1, 4, 1, 0};  // repeats accumulate
  const Vec r = random_vec(B * T * C, rng);
  Vec out(B * T * C);
  auto objective = [&] {
    h::encoder_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
    return dot(out, r);
  };
  objective();
  const Vec base_e = random_vec(wte.size(), rng), base_p = random_vec(wpe.size(), rng);
  Vec dwte = base_e, dwpe = base_p;
  h::encoder_backward(dwte.data(), dwpe.data(), r.data(), tokens.data(), B, T, C);
  require_close(minus(dwte, base_e), numeric_grad(wte, objective), "d wte");
  require_close(minus(dwpe, base_p), numeric_grad(wpe, objective), "d wpe");
  // Token 2 never occurs: its row gets nothing.
  for (int c = 0; c < C; ++c)
    CHECK(dwte[static_cast<std::size_t>(2 * C + c)] == base_e[static_cast<std::size_t>(2 * C + c)]);
}

TEST_CASE("tied LM head backward matches finite differences", "[gpt][layers]") {
  std::mt19937_64 rng(7);
  const int N = 3, C = 4, Vp = 6;
  Vec x = random_vec(N * C, rng), wte = random_vec(Vp * C, rng);
  const Vec r = random_vec(N * Vp, rng);
  Vec logits(N * Vp);
  auto objective = [&] {
    h::logits_forward(logits.data(), x.data(), wte.data(), N, C, Vp);
    return dot(logits, r);
  };
  objective();
  const Vec base_x = random_vec(x.size(), rng), base_w = random_vec(wte.size(), rng);
  Vec dx = base_x, dw = base_w;
  h::logits_backward(dx.data(), dw.data(), r.data(), x.data(), wte.data(), N, C, Vp);
  require_close(minus(dx, base_x), numeric_grad(x, objective), "d x");
  require_close(minus(dw, base_w), numeric_grad(wte, objective), "d wte");
}

TEST_CASE("residual forward adds", "[gpt][layers]") {
  const Vec a = {1, 2, 3}, b = {10, 20, 30};
  Vec out(3);
  h::residual_forward(out.data(), a.data(), b.data(), 3);
  CHECK(out == Vec{11, 22, 33});
}

TEST_CASE("HostOps (fp32) agrees with the double-precision kernels", "[gpt][layers]") {
  auto ops = zero::gpt::make_host_ops();
  std::mt19937_64 rng(8);
  const int B = 2, T = 16, C = 32, NH = 4, N = B * T;
  const Vec x = random_vec(N * C, rng), w = random_vec(C * 3 * C, rng, 0.2), bias = random_vec(3 * C, rng),
            g = random_vec(C, rng), beta = random_vec(C, rng);
  auto to_f = [](const Vec& v) { return std::vector<float>(v.begin(), v.end()); };

  // layernorm -> matmul to qkv -> attention, in both precisions.
  Vec ln(N * C), mean(N), rstd(N), qkv(N * 3 * C), y(N * C), att(B * NH * T * T);
  h::layernorm_forward(ln.data(), mean.data(), rstd.data(), x.data(), g.data(), beta.data(), N, C);
  h::matmul_forward(qkv.data(), ln.data(), w.data(), bias.data(), N, C, 3 * C);
  h::attention_forward(y.data(), att.data(), qkv.data(), mha(B, T, C, NH));

  auto xf = to_f(x), wf = to_f(w), bf = to_f(bias), gf = to_f(g), betaf = to_f(beta);
  std::vector<float> lnf(N * C), meanf(N), rstdf(N), qkvf(N * 3 * C), yf(N * C), attf(B * NH * T * T);
  auto A = [](std::vector<float>& v) { return reinterpret_cast<zero::gpt::Act*>(v.data()); };
  ops->layernorm_forward(A(lnf), meanf.data(), rstdf.data(), A(xf), A(gf), A(betaf), N, C);
  ops->matmul_forward(A(qkvf), A(lnf), A(wf), A(bf), N, C, 3 * C);
  REQUIRE(ops->attention_stats_floats(B, T, NH) == attf.size());
  ops->attention_forward(A(yf), attf.data(), A(qkvf), mha(B, T, C, NH));
  double worst = 0;
  for (std::size_t i = 0; i < y.size(); ++i) worst = std::max(worst, std::abs(y[i] - yf[i]) / (1.0 + std::abs(y[i])));
  // fp32 rounding through three layers of width 32: a few ulps of 1.
  CHECK(worst < 1e-5);
}
