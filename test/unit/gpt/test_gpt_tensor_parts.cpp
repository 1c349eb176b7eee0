// The pieces of the GPT model's tensor parallelism, on one process: the vocabulary-parallel
// cross-entropy (Ops::cross_entropy_part_*, with the tensor group's all-reduces done by hand)
// against the whole-row softmax_cross_entropy, the vocabulary-parallel embedding against the
// whole one, how each parameter is cut (tensor_parallel_layout, take_part) against the
// Megatron layout written out index by index, and the in-process tensor group that the GPU
// model test runs its CUDA parts in (gpt_tensor_group.hpp) against the whole model.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gpt/gpt_config.hpp"
#include "gpt/gpt_model.hpp"
#include "gpt_model_compare.hpp"
#include "gpt_tensor_group.hpp"
#include "gpt/ops.hpp"
#include "gpt/tensor_parallel.hpp"
#include "zero/layout.hpp"

using namespace zero::gpt;

namespace {

Act* A(std::vector<float>& v) { return reinterpret_cast<Act*>(v.data()); }
const Act* A(const std::vector<float>& v) { return reinterpret_cast<const Act*>(v.data()); }

std::vector<float> random_values(std::size_t n, std::uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Each of T ranks' part of the logits [N, Vp]: the ids [t Vl, (t + 1) Vl) of every row.
std::vector<std::vector<float>> vocab_parts(const std::vector<float>& logits, int N, int Vp, int T) {
  const int Vl = Vp / T;
  std::vector<std::vector<float>> part(static_cast<std::size_t>(T));
  for (int t = 0; t < T; ++t) {
    auto& p = part[static_cast<std::size_t>(t)];
    for (int n = 0; n < N; ++n)
      p.insert(p.end(), logits.begin() + n * Vp + t * Vl, logits.begin() + n * Vp + (t + 1) * Vl);
  }
  return part;
}

// The group's row maxima and sums: each part's pass, with the all-reduces (max, then sum) done
// by hand between them.
struct GroupSums {
  std::vector<float> mx, sums;
};
GroupSums group_sums(Ops& ops, const std::vector<std::vector<float>>& part, const std::vector<std::int32_t>& targets,
                     int N, int V) {
  const int T = static_cast<int>(part.size()), Vl = static_cast<int>(part[0].size()) / N;
  GroupSums g{std::vector<float>(N, -std::numeric_limits<float>::infinity()), std::vector<float>(2 * N, 0.0f)};
  std::vector<float> m(N), s(2 * N);
  for (int t = 0; t < T; ++t) {
    ops.cross_entropy_part_max(m.data(), A(part[static_cast<std::size_t>(t)]), N, Vl, t * Vl, V);
    for (int n = 0; n < N; ++n) g.mx[n] = std::max(g.mx[n], m[n]);
  }
  for (int t = 0; t < T; ++t) {
    ops.cross_entropy_part_sums(s.data(), A(part[static_cast<std::size_t>(t)]), g.mx.data(), targets.data(), N, Vl,
                                t * Vl, V);
    for (int i = 0; i < 2 * N; ++i) g.sums[i] += s[i];
  }
  return g;
}

}  // namespace

TEST_CASE("vocabulary-parallel cross-entropy equals the whole-row one", "[gpt][tensor_parallel]") {
  auto ops = make_host_ops();
  // (V, T): 300 pads to 384 (the last part holds ids past V); 130 pads to 256, and at T = 4
  // the last part (ids 192-255) has no real id at all.
  for (auto [V, T] : std::vector<std::pair<int, int>>{{300, 2}, {300, 4}, {130, 4}, {256, 1}}) {
    INFO("V = " << V << ", T = " << T);
    const int N = 7, Vp = (V + 127) / 128 * 128, Vl = Vp / T;
    std::vector<float> logits = random_values(static_cast<std::size_t>(N) * Vp, 17 + V + T, 3.0f);
    std::vector<std::int32_t> targets = {0, V - 1, 5, Vl - 1 < V ? Vl - 1 : 3, Vl < V ? Vl : 1, V / 2, 77};
    const float dloss = 0.25f;
    std::vector<float> want_loss(N), want_d(logits.size());
    ops->softmax_cross_entropy(want_loss.data(), A(want_d), A(logits), targets.data(), N, V, Vp, dloss);

    std::vector<std::vector<float>> part = vocab_parts(logits, N, Vp, T);
    const GroupSums g = group_sums(*ops, part, targets, N, V);
    for (int t = 0; t < T; ++t) {
      std::vector<float> loss(N);
      auto& p = part[static_cast<std::size_t>(t)];
      // The gradient in place of the logits, as the model asks for it.
      ops->cross_entropy_part_finish(loss.data(), A(p), A(p), g.mx.data(), g.sums.data(), targets.data(), N, Vl, t * Vl,
                                     V, dloss);
      for (int n = 0; n < N; ++n) {
        INFO("rank " << t << ", row " << n);
        CHECK(loss[n] == Approx(want_loss[n]).epsilon(1e-6));
        for (int j = 0; j < Vl; ++j) {
          const float w = want_d[static_cast<std::size_t>(n * Vp + t * Vl + j)];
          CHECK(std::abs(p[static_cast<std::size_t>(n * Vl + j)] - w) <= 1e-7f + 1e-5f * std::abs(w));
          if (t * Vl + j >= V) CHECK(p[static_cast<std::size_t>(n * Vl + j)] == 0.0f);  // padding
        }
      }
    }
  }
}

TEST_CASE("a target outside the vocabulary gives a NaN loss, whole-row and by parts", "[gpt][tensor_parallel]") {
  // V = 130 pads to 256: at T = 2, id 200 is padding on part 1 (no part holds it as a real id),
  // 256 is past the padded vocabulary and -1 below it. Row 1's target is valid and stays finite.
  auto ops = make_host_ops();
  const int V = 130, Vp = 256, T = 2, Vl = Vp / T;
  for (const std::int32_t bad : {-1, V, 200, Vp}) {
    INFO("target " << bad);
    const int N = 2;
    const std::vector<std::int32_t> targets = {bad, 5};
    std::vector<float> logits = random_values(static_cast<std::size_t>(N) * Vp, 31, 1.0f);
    std::vector<float> whole(N);
    ops->softmax_cross_entropy(whole.data(), nullptr, A(logits), targets.data(), N, V, Vp, 1.0f);
    CHECK(std::isnan(whole[0]));
    CHECK(std::isfinite(whole[1]));

    std::vector<std::vector<float>> part = vocab_parts(logits, N, Vp, T);
    const GroupSums g = group_sums(*ops, part, targets, N, V);
    for (int t = 0; t < T; ++t) {
      INFO("rank " << t);
      std::vector<float> loss(N);
      auto& p = part[static_cast<std::size_t>(t)];
      ops->cross_entropy_part_finish(loss.data(), A(p), A(p), g.mx.data(), g.sums.data(), targets.data(), N, Vl, t * Vl,
                                     V, 1.0f);
      CHECK(std::isnan(loss[0]));
      CHECK(loss[1] == Approx(whole[1]).epsilon(1e-6));
    }
  }
}

TEST_CASE("the vocabulary-parallel embedding sums to the whole one", "[gpt][tensor_parallel]") {
  auto ops = make_host_ops();
  const int B = 2, T = 5, C = 8, Vp = 256, TP = 4, Vl = Vp / TP;
  std::vector<float> wte = random_values(static_cast<std::size_t>(Vp) * C, 3, 1.0f);
  std::vector<float> wpe = random_values(static_cast<std::size_t>(T) * C, 4, 1.0f);
  std::vector<std::int32_t> tokens = {0, 63, 64, 200, 255, 130, 130, 7, 191, 192};
  std::vector<float> whole(static_cast<std::size_t>(B) * T * C), sum(whole.size(), 0.0f), out(whole.size());
  ops->encoder_forward(A(whole), tokens.data(), A(wte), A(wpe), B, T, C);
  std::vector<float> dout = random_values(whole.size(), 5, 1.0f);
  std::vector<float> dwte(wte.size(), 0.0f), dwpe(wpe.size(), 0.0f);
  ops->encoder_backward(A(dwte), A(dwpe), A(dout), tokens.data(), B, T, C);
  for (int t = 0; t < TP; ++t) {
    const std::vector<float> rows(wte.begin() + t * Vl * C, wte.begin() + (t + 1) * Vl * C);
    // Rank 0 adds the positions; the others pass null.
    ops->encoder_forward_part(A(out), tokens.data(), A(rows), t == 0 ? A(wpe) : nullptr, B, T, C, t * Vl, Vl);
    for (std::size_t i = 0; i < out.size(); ++i) sum[i] += out[i];
    std::vector<float> g(rows.size(), 0.0f), gp(wpe.size(), 0.0f);
    ops->encoder_backward_part(A(g), A(gp), A(dout), tokens.data(), B, T, C, t * Vl, Vl);
    INFO("rank " << t);
    CHECK(std::equal(g.begin(), g.end(), dwte.begin() + t * Vl * C));
    CHECK(gp == dwpe);  // wpe is replicated: every rank has its whole gradient
  }
  for (std::size_t i = 0; i < whole.size(); ++i) CHECK(sum[i] == Approx(whole[i]).epsilon(1e-6));
}

TEST_CASE("each parameter is cut as Megatron cuts it, and the parts make the whole", "[gpt][tensor_parallel]") {
  GptConfig c;  // tiny: n_embd 128, n_head 4, vocabulary 256
  const int T = 2, C = c.n_embd;
  const zero::Layout whole = build_layout(c);
  const zero::Layout part = tensor_parallel_layout(c, T);
  REQUIRE(part.num_units() == whole.num_units());
  auto param = [&](const zero::Layout& l, const std::string& unit, const std::string& name) {
    const zero::UnitInfo& u = l.unit(l.find_unit(unit));
    return u.params[static_cast<std::size_t>(u.find_param(name))];
  };
  const zero::ParamInfo qkv = param(part, "h.1", "h.1.attn.c_attn.weight");
  CHECK(qkv.shape == std::vector<std::int64_t>{C, 3 * C / T});
  CHECK((qkv.split_axis == 1 && qkv.split_blocks == 3 && !qkv.replicated));
  CHECK(param(part, "h.1", "h.1.attn.c_attn.bias").split_axis == 0);
  CHECK(param(part, "h.1", "h.1.attn.c_proj.weight").shape == std::vector<std::int64_t>{C / T, C});
  CHECK(param(part, "h.1", "h.1.attn.c_proj.bias").replicated);
  CHECK(param(part, "h.1", "h.1.mlp.c_fc.weight").shape == std::vector<std::int64_t>{C, 4 * C / T});
  CHECK(param(part, "h.1", "h.1.mlp.c_fc.bias").split_axis == 0);
  CHECK(param(part, "h.1", "h.1.mlp.c_proj.weight").shape == std::vector<std::int64_t>{4 * C / T, C});
  CHECK(param(part, "h.1", "h.1.mlp.c_proj.bias").replicated);
  CHECK(param(part, "h.1", "h.1.ln_2.weight").replicated);
  CHECK(param(part, "embeddings", "wpe.weight").replicated);
  CHECK(param(part, "embeddings", "wte.weight").shape == std::vector<std::int64_t>{c.padded_vocab_size() / T, C});
  CHECK(param(part, "ln_f", "ln_f.bias").replicated);
  // Weight decay as without tensor parallelism.
  CHECK(param(part, "h.1", "h.1.mlp.c_fc.weight").decay);
  CHECK(!param(part, "h.1", "h.1.mlp.c_fc.bias").decay);

  // The fused QKV: rank t's column j of block b (q, k, v) is the whole's column b C + t C/T + j,
  // so each rank holds whole heads of each of q, k and v.
  std::vector<float> w(static_cast<std::size_t>(C) * 3 * C);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i);
  for (int t = 0; t < T; ++t) {
    std::vector<float> p(static_cast<std::size_t>(qkv.numel));
    take_part(w, qkv, T, t, p);
    const int local = 3 * C / T, per = C / T;
    for (int r = 0; r < C; r += 37)
      for (int j = 0; j < local; ++j) {
        const int b = j / per, col = b * C + t * per + j % per;
        REQUIRE(p[static_cast<std::size_t>(r * local + j)] == w[static_cast<std::size_t>(r * 3 * C + col)]);
      }
  }
  // Row-parallel: rank t holds rows [t C/T, (t+1) C/T) whole.
  const zero::ParamInfo proj = param(part, "h.0", "h.0.attn.c_proj.weight");
  std::vector<float> pw(static_cast<std::size_t>(C) * C), pp(static_cast<std::size_t>(proj.numel));
  for (std::size_t i = 0; i < pw.size(); ++i) pw[i] = static_cast<float>(i);
  take_part(pw, proj, T, 1, pp);
  CHECK(std::equal(pp.begin(), pp.end(), pw.begin() + C / T * C));
  CHECK(whole_shape(proj, T) == std::vector<std::int64_t>{C, C});
  // A model the grid cannot cut.
  CHECK_THROWS_WITH(tensor_parallel_layout(c, 8), Catch::Contains("n_head = 4"));
}

TEST_CASE("the all-reduces through a device communicator give the host path's bits", "[gpt][tensor_parallel]") {
  // TensorParallel::device (backend: cuda's path: the fp32 scratch reserved with the model, the
  // Ops' conversions, an asynchronous all-reduce) on HostOps, against the host path.
  namespace cmp = zero::gpt::compare;
  const GptConfig cfg = cmp::config_of({2, 4, 64, 16, 130, true});
  HostParams params(cfg);
  params.init(7);
  const cmp::Batch batch = cmp::random_batch(cfg, cmp::kBatch, 8);
  const auto host = test::tensor_group_step(cfg, 2, params, batch, [] { return make_host_ops(); });
  const auto device = test::tensor_group_step(
      cfg, 2, params, batch, [] { return make_host_ops(); }, true);
  for (int t = 0; t < 2; ++t) {
    INFO("tensor rank " << t);
    const auto& a = host[static_cast<std::size_t>(t)];
    const auto& b = device[static_cast<std::size_t>(t)];
    CHECK(b.loss == a.loss);
    REQUIRE(b.grads.size() == a.grads.size());
    for (std::size_t u = 0; u < a.grads.size(); ++u) CHECK(b.grads[u] == a.grads[u]);
  }
}

TEST_CASE("an in-process tensor group of T models computes the whole model", "[gpt][tensor_parallel]") {
  // On HostOps (fp32) every member's loss is the whole model's and its gradients are its part of
  // the whole's, up to the order of fp32 sums (the partial products before each all-reduce):
  // relative differences of about 1e-6, far below what a part cut or placed wrongly moves
  // (all of it). The 130-id vocabulary pads to 256: at T = 4 part 2 holds two real ids and
  // part 3 none.
  namespace cmp = zero::gpt::compare;
  struct Case {
    cmp::ModelCase m;
    int T;
  };
  for (const Case c : {Case{{2, 4, 64, 16, 256, false}, 2}, Case{{2, 4, 64, 16, 130, true}, 4}}) {
    const GptConfig cfg = cmp::config_of(c.m);
    INFO(cmp::describe(c.m) << ", T = " << c.T);
    HostParams params(cfg);
    params.init(5);
    const cmp::Batch batch = cmp::random_batch(cfg, cmp::kBatch, 6);
    auto ops = make_host_ops();
    const cmp::HostStep whole = cmp::host_step(*ops, cfg, params, batch);
    const std::vector<test::PartStep> parts =
        test::tensor_group_step(cfg, c.T, params, batch, [] { return make_host_ops(); });
    const zero::Layout part = tensor_parallel_layout(cfg, c.T);
    for (int t = 0; t < c.T; ++t) {
      INFO("tensor rank " << t);
      const test::PartStep& r = parts[static_cast<std::size_t>(t)];
      CHECK(std::abs(r.loss - whole.loss) <= 1e-5 * whole.loss);
      const auto want = test::take_parts(cfg, cmp::units_of(whole.grads), part, c.T, t);
      for (const auto& x : cmp::agreement_per_tensor(test::unit_specs(part), r.grads, want)) {
        INFO(x.name << ": |g_whole part| " << x.a.norm << ", rel " << x.a.rel);
        CHECK(x.a.rel <= 1e-4);
      }
    }
  }
}
