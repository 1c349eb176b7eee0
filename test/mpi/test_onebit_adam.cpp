// OneBitAdam (DeepSpeed's 1-bit Adam) on the engine, at stages 1 and 2:
//   - its freeze_step warm-up steps are Adam without bias correction, bit for bit (AdamW with
//     bias_correction: false, which is DeepSpeed's 1-bit Adam update);
//   - after the warm-up the compressed momentum exchange keeps training on course: the update
//     from the end of the warm-up points the way the exact optimizer's does, and stages 1 and 2
//     give the same bits;
//   - on two simulated nodes (ZERO_RANKS_PER_NODE=2) the inter-node bytes of the exchange are at
//     least 8x fewer than those of the exact optimizer's gradient reduce-scatter, by the
//     communicators' counters.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "engine_model.hpp"
#include "zero/context.hpp"
#include "zero/engine.hpp"

using namespace zero;
using namespace zero::test;

namespace {

Context& ctx() { return *Context::current(); }

constexpr int kFreeze = 5;

// Units of a few hundred elements (a 1-bit scale per slice needs more than a handful of values).
Layout onebit_layout() {
  Layout l;
  l.add_unit("a", {{"w", {29, 23}}, {"b", {29}}});
  l.add_unit("b", {{"w", {31, 17}}, {"g", {17}}});
  l.add_unit("c", {{"w", {400}}});
  l.decay_matrices_only();
  return l;
}

Config make_config(const std::string& optimizer, int stage) {
  const int micro = 4;
  std::string y = "train_micro_batch_size_per_gpu: " + std::to_string(micro) + "\ngradient_accumulation_steps: 1\n";
  y += "zero_optimization:\n  stage: " + std::to_string(stage) + "\n";
  y += "optimizer:\n  type: " + optimizer + "\n  params:\n    lr: 0.01\n    betas: [0.9, 0.95]\n    eps: 1.0e-8\n";
  y += "    weight_decay: 0.1\n";
  if (optimizer == "OneBitAdam")
    y += "    freeze_step: " + std::to_string(kFreeze) + "\n";
  else
    y += "    bias_correction: false\n";
  Config cfg = parse_config(y, "test_onebit_adam");
  cfg.resolve(ctx().world_size());
  return cfg;
}

struct Run {
  std::vector<std::vector<std::vector<float>>> master;  // after each step: per unit
  std::vector<TrafficBytes> sent;                       // per step
};

Run run(const std::string& optimizer, int stage, int steps) {
  Engine e(ctx(), make_config(optimizer, stage), onebit_layout());
  e.init_params(init_value);
  Run r;
  for (int s = 0; s < steps; ++s) {
    const TrafficBytes before = e.traffic();
    train(e, ctx().rank(), ctx().world_size(), s, 1);
    r.sent.push_back(e.traffic() - before);
    std::vector<std::vector<float>> m;
    for (int u = 0; u < e.layout().num_units(); ++u) m.push_back(e.full_master(u));
    r.master.push_back(std::move(m));
  }
  return r;
}

bool same_bits(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  for (std::size_t u = 0; u < a.size(); ++u)
    if (a[u].size() != b[u].size() || std::memcmp(a[u].data(), b[u].data(), a[u].size() * sizeof(float)) != 0)
      return false;
  return true;
}

// The cosine between two runs' updates from step `from` to step `to` (indices into master).
double update_cosine(const Run& x, const Run& y, int from, int to) {
  double dot = 0, nx = 0, ny = 0;
  for (std::size_t u = 0; u < x.master[0].size(); ++u)
    for (std::size_t i = 0; i < x.master[0][u].size(); ++i) {
      const double a = static_cast<double>(x.master[static_cast<std::size_t>(to)][u][i]) -
                       x.master[static_cast<std::size_t>(from)][u][i];
      const double b = static_cast<double>(y.master[static_cast<std::size_t>(to)][u][i]) -
                       y.master[static_cast<std::size_t>(from)][u][i];
      dot += a * b, nx += a * a, ny += b * b;
    }
  return dot / std::sqrt(nx * ny);
}

}  // namespace

TEST_CASE("OneBitAdam: exact warm-up, compressed steps on course, 8x fewer inter-node bytes", "[optim][onebit]") {
  const int world = ctx().world_size(), steps = 3 * kFreeze;
  const Run exact = run("AdamW", 1, steps);
  Run first;
  for (int stage : {1, 2}) {
    INFO("stage " << stage << ", " << world << " rank(s)");
    const Run onebit = run("OneBitAdam", stage, steps);
    // The warm-up is Adam without bias correction, bit for bit.
    for (int s = 0; s < kFreeze; ++s) {
      INFO("warm-up step " << s + 1);
      CHECK(same_bits(onebit.master[static_cast<std::size_t>(s)], exact.master[static_cast<std::size_t>(s)]));
    }
    // The compressed steps leave the exact trajectory but follow its direction.
    CHECK_FALSE(same_bits(onebit.master.back(), exact.master.back()));
    const double cosine = update_cosine(onebit, exact, kFreeze - 1, steps - 1);
    // Measured 0.968 at 1 rank (no exchange: the frozen variance alone), 0.893 at 2 and 0.906 at 4;
    // an exchange that lost the sign, the scale or the average would point elsewhere.
    CHECK(cosine > 0.8);
    if (stage == 1)
      first = onebit;
    else
      CHECK(same_bits(onebit.master.back(), first.master.back()));
    // Inter-node bytes of a compressed step against an exact one: the difference is the exact
    // reduce-scatter less the exchange. Each unit's reduce-scatter, on a rank whose ring
    // successor is on the other node, sends (world - 1) slices of fp32 across (zero/comm.hpp).
    const TrafficBytes a = exact.sent.back(), b = onebit.sent.back();
    if (ctx().is_root())
      std::printf(
          "  %d rank(s), stage %d: update cosine to AdamW %.4f; last step's bytes inter-node %lld (exact %lld), "
          "intra-node %lld (exact %lld)\n",
          world, stage, cosine, static_cast<long long>(b.inter_node), static_cast<long long>(a.inter_node),
          static_cast<long long>(b.intra_node), static_cast<long long>(a.intra_node));
    if (a.inter_node > 0) {  // the ranks whose ring successor is on the other node
      const Layout l = onebit_layout();
      std::int64_t rs = 0;
      for (int u = 0; u < l.num_units(); ++u) rs += static_cast<std::int64_t>(world - 1) * l.slice_numel(u, world) * 4;
      const std::int64_t exchange = b.inter_node - (a.inter_node - rs);
      INFO("exact reduce-scatter " << rs << " bytes across, the exchange " << exchange);
      CHECK(exchange > 0);
      CHECK(exchange * 8 <= rs);
    }
  }
}
