// The engine under model parallelism: each rank holds its part of a model split over a tensor
// group (matrices split by rows, small vectors replicated) and over pipeline stages (units
// divided among them), and the engine runs over the data-parallel group. Against the same
// model unsplit over all ranks as data parallel (same global batch, same initial values):
// per-step gradient norms and the trained master weights agree within fp32 reduction-order
// error at stages 0-3, with clipping active so that a wrong norm (a replicated parameter
// counted twice, a part missing) would show. The per-element gradients depend only on the
// element's value, its global index and the sample, so the split model's gradients are exactly
// the unsplit model's, part by part.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "engine_model.hpp"
#include "zero/checkpoint.hpp"
#include "zero/context.hpp"
#include "zero/engine.hpp"
#include "zero/error.hpp"
#include "zero/groups.hpp"

using namespace zero;
using zero::test::hash_unit;
using zero::test::sample_grad;
using zero::test::sample_id;

namespace {

std::string fmt_config(int stage, int micro, bool fp16);

// The whole model: unit -> parameters {name, rows, cols, replicated}. Split parameters divide
// by rows over tensor ranks 1, 2 and 4.
struct PSpec {
  const char* name;
  std::int64_t rows, cols;
  bool replicated;
};
struct USpec {
  const char* name;
  std::vector<PSpec> params;
};
const std::vector<USpec> kModel = {
    {"embed", {{"w", 8, 6, false}, {"b", 5, 1, true}}},
    {"mlp", {{"w", 12, 10, false}, {"b", 3, 1, true}}},
    {"big", {{"w", 200, 1, false}, {"g", 1, 1, true}}},
};
int stage_of(std::size_t unit, int P) { return static_cast<int>(unit * static_cast<std::size_t>(P) / kModel.size()); }

// This rank's part: its pipeline stage's units, its tensor rank's rows of the split parameters.
// tied: the last stage also holds a copy of embed.w (as GPT's last stage holds the tied wte),
// the same unit and parameter name, its norm counted on the first stage only.
Layout part_layout(int T, int P, GridCoord c, bool tied = false) {
  Layout l;
  for (std::size_t u = 0; u < kModel.size(); ++u) {
    if (stage_of(u, P) != c.pipeline) continue;
    std::vector<std::pair<std::string, Layout::Shape>> ps;
    for (const auto& p : kModel[u].params) ps.push_back({p.name, {p.replicated ? p.rows : p.rows / T, p.cols}});
    const int id = l.add_unit(kModel[u].name, ps);
    for (const auto& p : kModel[u].params)
      if (p.replicated) l.set_replicated(id, p.name);
  }
  if (tied && P > 1 && c.pipeline == P - 1) {
    const PSpec& w = kModel[0].params[0];
    const int id = l.add_unit(kModel[0].name, {{w.name, {w.rows / T, w.cols}}});
    l.set_norm_counted_elsewhere(id, w.name);
  }
  return l;
}

int model_unit(const std::string& name) {
  for (std::size_t u = 0; u < kModel.size(); ++u)
    if (name == kModel[u].name) return static_cast<int>(u);
  return -1;
}
// Global element index of element i of this rank's part of parameter p.
std::int64_t global_index(const ParamInfo& p, int t, std::int64_t i) {
  return p.replicated ? i : static_cast<std::int64_t>(t) * p.numel + i;
}
std::uint64_t seed_of(const ParamInfo& p) {
  std::uint64_t s = 7;
  for (char ch : p.unit + "." + p.name) s = s * 131 + static_cast<unsigned char>(ch);
  return s;
}

struct Run {
  std::vector<double> norms;
  std::vector<std::vector<float>> master;  // per local unit, this rank's part
};

Run train(Context& ctx, int T, int P, int stage, int steps, bool fp16 = false, int poison_rank = -1,
          bool tied = false) {
  ProcessGroups g(ctx, {.tensor = T, .pipeline = P});
  const int D = g.data_size();
  const int micro = 8 / D;  // global batch 8 whatever the grid
  Config cfg = parse_config(fmt_config(stage, micro, fp16), "test_model_parallel");
  cfg.resolve(D);
  const GridCoord c = g.coord();
  Engine e(ctx, cfg, part_layout(T, P, c, tied), g);
  e.init_params([&](const ParamInfo& p, std::span<float> v) {
    for (std::size_t i = 0; i < v.size(); ++i)
      v[i] = 0.5f * hash_unit(seed_of(p), static_cast<std::uint64_t>(global_index(p, c.tensor, static_cast<std::int64_t>(i))));
  });
  Run run;
  const int n = e.layout().num_units();
  for (int s = 0; s < steps; ++s) {
    for (int u = 0; u < n; ++u) e.gather(u);
    for (int u = n - 1; u >= 0; --u) {
      auto p = e.gather(u);
      auto gr = e.grads(u);
      const UnitInfo& ui = e.layout().unit(u);
      const int mu = model_unit(ui.name);
      for (int k = 0; k < static_cast<int>(ui.params.size()); ++k) {
        const ParamInfo& pi = ui.params[static_cast<std::size_t>(k)];
        auto w = p[k];
        auto gt = gr[k];
        for (std::int64_t i = 0; i < pi.numel; ++i) {
          const std::int64_t gi = global_index(pi, c.tensor, i) + 10000 * k;
          float acc = 0.0f;
          for (int j = 0; j < micro; ++j) acc += sample_grad(mu, gi, sample_id(s, 0, c.data, j, D, 1, micro), w.get(i));
          gt.add(i, e.loss_scale() * acc / static_cast<float>(micro));
        }
        if (s == 1 && ctx.rank() == poison_rank && mu == 0 && k == 0) gt.set(0, std::numeric_limits<float>::infinity());
      }
      e.reduce(u);
    }
    run.norms.push_back(e.step().grad_norm);
  }
  for (int u = 0; u < n; ++u) run.master.push_back(e.full_master(u));
  return run;
}

std::string fmt_config(int stage, int micro, bool fp16) {
  std::string y = "train_micro_batch_size_per_gpu: " + std::to_string(micro) +
                  "\ngradient_clipping: 0.5\noptimizer:\n  type: AdamW\n  params:\n    lr: 0.01\n"
                  "zero_optimization:\n  stage: " + std::to_string(stage) +
                  "\n  stage3_param_persistence_threshold: 0\n";
  if (fp16) y += "fp16:\n  enabled: true\n  initial_scale_power: 4\n  hysteresis: 1\n";
  return y;
}

}  // namespace

TEST_CASE("tensor and pipeline parts of a model train as the whole model does under data parallelism") {
  Context& ctx = *Context::current();
  const int world = ctx.world_size();
  // Pipeline stages need a unit each: at most 3 (kModel's units).
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
            const float b = ref.master[static_cast<std::size_t>(mu)][static_cast<std::size_t>(
                wp.offset + global_index(pp, g.coord().tensor, i))];
            INFO(pp.unit << "." << pp.name << "[" << i << "]: " << a << " vs " << b);
            REQUIRE(std::abs(a - b) <= 1e-5f * std::max(1.0f, std::abs(b)));
          }
        }
      }
    }
  }
}

TEST_CASE("a tied copy on the last pipeline stage counts once in the norm and trains as the original") {
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
      // The copy (the last unit of the last stage) equals the whole model's embed.w, part by part.
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

TEST_CASE("checkpoints of a split model are refused clearly") {
  Context& ctx = *Context::current();
  if (ctx.world_size() < 2) return;
  ProcessGroups g(ctx, {.tensor = ctx.world_size()});
  Config cfg = parse_config(fmt_config(1, 8, false), "test_model_parallel");
  cfg.resolve(1);
  Engine e(ctx, cfg, part_layout(ctx.world_size(), 1, g.coord()), g);
  e.init_params([](const ParamInfo&, std::span<float> v) { std::fill(v.begin(), v.end(), 0.0f); });
  REQUIRE_THROWS_WITH(save_checkpoint(e, "unused-root", {}), Catch::Contains("split over ranks"));
}
