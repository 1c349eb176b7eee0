// The engine under model parallelism (the model of split_model.hpp): against the same model
// unsplit over all ranks as data parallel (same global batch, same initial values), per-step
// gradient norms and the trained master weights agree within fp32 reduction-order error at
// stages 0-3, with clipping active so that a wrong norm (a replicated parameter counted twice,
// a part missing) would show.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "split_model.hpp"
#include "zero/context.hpp"
#include "zero/engine.hpp"
#include "zero/error.hpp"
#include "zero/groups.hpp"

using namespace zero;
using namespace zero::test::split;

namespace {

struct Run {
  std::vector<double> norms;
  std::vector<std::vector<float>> master;  // per local unit, this rank's part
};

Run train_on(Context& ctx, ProcessGroups& g, int stage, int steps, bool fp16 = false, int poison_rank = -1,
             bool tied = false) {
  const int T = g.tensor_size(), P = g.pipeline_size();
  Config cfg = parse_config(config_text(stage, g.data_size(), fp16), "test_model_parallel");
  cfg.resolve(g.data_size());
  Engine e(ctx, cfg, part_layout(T, P, g.coord(), tied), g);
  init_part(e, g.coord());
  Run run;
  for (int s = 0; s < steps; ++s) run.norms.push_back(train_step(e, g, s, s == 1 && ctx.rank() == poison_rank));
  for (int u = 0; u < e.layout().num_units(); ++u) run.master.push_back(e.full_master(u));
  return run;
}

Run train(Context& ctx, int T, int P, int stage, int steps, bool fp16 = false, int poison_rank = -1,
          bool tied = false) {
  ProcessGroups g(ctx, {.tensor = T, .pipeline = P});
  return train_on(ctx, g, stage, steps, fp16, poison_rank, tied);
}

}  // namespace

TEST_CASE("tensor and pipeline parts of a model train as the whole model does under data parallelism") {
  Context& ctx = *Context::current();
  const int world = ctx.world_size();
  // Pipeline parts need a unit each: at most 3 (kModel's units).
  std::vector<std::pair<int, int>> grids = {{world, 1}, {1, 2}};
  if (world == 4) grids.push_back({2, 2});
  for (int stage = 0; stage <= 3; ++stage) {
    const Run ref = train(ctx, 1, 1, stage, 6);
    for (auto [T, P] : grids) {
      INFO("stage " << stage << ", TP " << T << " x PP " << P << " x DP " << world / (T * P));
      const Run mp = train(ctx, T, P, stage, 6);
      REQUIRE(mp.norms.size() == ref.norms.size());
      for (std::size_t s = 0; s < ref.norms.size(); ++s) {
        INFO("step " << s << ": norm " << mp.norms[s] << " vs " << ref.norms[s]);
        REQUIRE(ref.norms[s] > 0.5);  // clipping is active: the norm decides every update
        REQUIRE(std::abs(mp.norms[s] - ref.norms[s]) <= 1e-5 * ref.norms[s]);
      }
      // This rank's part of every unit equals the same elements of the whole model.
      ProcessGroups g(ctx, {.tensor = T, .pipeline = P});
      const Layout part = part_layout(T, P, g.coord());
      for (int u = 0; u < part.num_units(); ++u) {
        const int mu = model_unit(part.unit(u).name);
        const Layout whole = part_layout(1, 1, {});
        for (std::size_t k = 0; k < part.unit(u).params.size(); ++k) {
          const ParamInfo& pp = part.unit(u).params[k];
          const ParamInfo& wp = whole.unit(mu).params[k];
          for (std::int64_t i = 0; i < pp.numel; ++i) {
            const float a = mp.master[static_cast<std::size_t>(u)][static_cast<std::size_t>(pp.offset + i)];
            const float b = ref.master[static_cast<std::size_t>(mu)]
                                      [static_cast<std::size_t>(wp.offset + global_index(pp, g.coord().tensor, i))];
            INFO(pp.unit << "." << pp.name << "[" << i << "]: " << a << " vs " << b);
            REQUIRE(std::abs(a - b) <= 1e-5f * std::max(1.0f, std::abs(b)));
          }
        }
      }
    }
  }
}

TEST_CASE("a tied copy in the last pipeline part counts once in the norm and trains as the original") {
  // The copy gets the same gradient as the original (as after GPT's tied-gradient all-reduce),
  // so counted twice the norm would be too large and clipping would change every update.
  Context& ctx = *Context::current();
  const int world = ctx.world_size();
  std::vector<std::pair<int, int>> grids = {{1, 2}};
  if (world == 4) grids.push_back({2, 2});
  for (int stage = 0; stage <= 3; ++stage) {
    const Run ref = train(ctx, 1, 1, stage, 4);
    for (auto [T, P] : grids) {
      INFO("stage " << stage << ", TP " << T << " x PP " << P << " with a tied copy");
      const Run mp = train(ctx, T, P, stage, 4, false, -1, /*tied=*/true);
      for (std::size_t s = 0; s < ref.norms.size(); ++s) {
        INFO("step " << s << ": norm " << mp.norms[s] << " vs " << ref.norms[s]);
        REQUIRE(std::abs(mp.norms[s] - ref.norms[s]) <= 1e-5 * ref.norms[s]);
      }
      ProcessGroups g(ctx, {.tensor = T, .pipeline = P});
      if (g.coord().pipeline != P - 1) continue;
      // The copy (the last unit of the last pipeline part) equals the whole model's embed.w, part by part.
      const Layout part = part_layout(T, P, g.coord(), true);
      const ParamInfo& pp = part.unit(part.num_units() - 1).params[0];
      REQUIRE(pp.norm_counted_elsewhere);
      for (std::int64_t i = 0; i < pp.numel; ++i) {
        const float a = mp.master.back()[static_cast<std::size_t>(i)];
        const float b = ref.master[0][static_cast<std::size_t>(global_index(pp, g.coord().tensor, i))];
        REQUIRE(std::abs(a - b) <= 1e-5f * std::max(1.0f, std::abs(b)));
      }
    }
  }
}

TEST_CASE("an overflow in one rank's part makes every rank of every group skip") {
  Context& ctx = *Context::current();
  const int world = ctx.world_size();
  if (world < 2) return;
  const Run r = train(ctx, world, 1, 2, 3, /*fp16=*/true, /*poison_rank=*/world - 1);
  REQUIRE(std::isfinite(r.norms[0]));
  REQUIRE_FALSE(std::isfinite(r.norms[1]));  // every rank reports the skipped step
  REQUIRE(std::isfinite(r.norms[2]));
}

TEST_CASE("explicit groups in another rank order train as Megatron's grid does") {
  Context& ctx = *Context::current();
  if (ctx.world_size() != 4) return;
  const int r = ctx.rank();
  // TP 2 x DP 2 with the data-parallel ranks adjacent: tensor pairs {0, 2}, {1, 3}.
  ProcessGroups g(ctx, ExplicitGroups{.tensor = r % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3},
                                      .data = r < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3},
                                      .pipeline = {r}});
  const Run ref = train(ctx, 2, 1, 2, 4);
  const Run mine = train_on(ctx, g, 2, 4);
  // The same parts see the same samples: the norms match the Megatron-ordered run's.
  for (std::size_t s = 0; s < ref.norms.size(); ++s)
    REQUIRE(std::abs(mine.norms[s] - ref.norms[s]) <= 1e-6 * ref.norms[s]);
}

TEST_CASE("backend: cuda runs the engine over the data-parallel group of a grid") {
  // The CUDA backend is built over groups->data(): here (no device, or a build without CUDA) the
  // only error left is the backend's own, never a refusal of tensor or pipeline parallelism.
  Context& ctx = *Context::current();
  if (ctx.world_size() % 2 != 0) return;
  ProcessGroups g(ctx, {.tensor = 2, .pipeline = 1});
  Config cfg = parse_config(config_text(1, g.data_size(), false), "test_model_parallel");
  cfg.resolve(g.data_size());
  cfg.backend = BackendKind::cuda;
  try {
    Engine e(ctx, cfg, part_layout(2, 1, g.coord(), false), g);
  } catch (const Error& e) {
    CHECK_THAT(std::string(e.what()), Catch::Contains("backend: cuda") && !Catch::Contains("tensor or pipeline"));
  }
}
