// The gradient average over ranks in bf16 is unbiased: the collectives sum, and 1/world is
// applied in fp32. An average that multiplies by 1/world rounded to bf16 (as NCCL's ncclAvg
// does) is off by +0.195% at 3 ranks for every element alike; here every rank's gradient and
// their sum are exact in bf16, so the engine's fp32 master after one plain SGD step must equal
// the exact average to fp32 precision at every world size (run at 1, 2, 3 and 4 ranks).
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "zero/context.hpp"
#include "zero/engine.hpp"

using namespace zero;

namespace {

Context& ctx() { return *Context::current(); }

// Small integers: exact in bf16, and so are their sums over up to 4 ranks (at most 70).
float rank_grad(int rank, std::int64_t i) { return static_cast<float>((rank + 1) * (1 + i % 7)); }

}  // namespace

TEST_CASE("bf16 gradients average without bias at every world size and stage") {
  const int world = ctx().world_size();
  for (int stage = 0; stage <= 3; ++stage) {
    std::string y = "train_micro_batch_size_per_gpu: 1\ngradient_accumulation_steps: 1\nbf16:\n  enabled: true\n";
    y += "zero_optimization:\n  stage: " + std::to_string(stage) + "\n";
    y += "optimizer:\n  type: SGD\n  params:\n    lr: 1.0\n    momentum: 0.0\n    weight_decay: 0.0\n";
    Config cfg = parse_config(y, "test_engine_average");
    cfg.resolve(world);
    Layout l;
    l.add_unit("a", {{"w", {29}}});
    l.add_unit("b", {{"w", {5, 3}}, {"b", {4}}});
    Engine e(ctx(), cfg, l);
    e.init_params([](const ParamInfo&, std::span<float> out) {
      for (auto& x : out) x = 0.0f;
    });
    for (int u = 0; u < l.num_units(); ++u) e.gather(u);
    for (int u = l.num_units() - 1; u >= 0; --u) {
      auto p = e.gather(u);
      auto g = e.grads(u);
      const float scale = e.loss_scale();
      for (std::size_t k = 0; k < l.unit(u).params.size(); ++k) {
        auto t = g[static_cast<int>(k)];
        for (std::int64_t i = 0; i < t.numel; ++i) t.add(i, scale * rank_grad(ctx().rank(), t.info->offset + i));
      }
      e.reduce(u);
    }
    StepResult r = e.step();
    REQUIRE_FALSE(r.skipped);
    for (int u = 0; u < l.num_units(); ++u) {
      const std::vector<float> master = e.full_master(u);
      for (std::size_t i = 0; i < master.size(); ++i) {
        // The exact average of (rank + 1) * c over the ranks is c * (world + 1) / 2.
        const double c = 1.0 + static_cast<double>(i % 7);
        const double exact = -c * (world + 1) / 2.0;
        INFO("stage " << stage << " unit " << u << " element " << i << " at " << world << " ranks");
        REQUIRE(std::abs(master[i] - exact) <= 1e-6 * std::abs(exact));
      }
    }
  }
}
