// A small model split over a tensor x pipeline grid, for the model-parallel tests: each rank
// holds its part (matrices cut by rows over the tensor ranks, small vectors replicated; units
// divided among pipeline parts) and the engine runs over the data-parallel group. The
// per-element gradients depend only on the element's value, its global index and the sample,
// so the split model's gradients are exactly the unsplit model's, part by part, and a global
// batch of 8 samples is the same whatever the data-parallel size.
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "engine_model.hpp"
#include "zero/config.hpp"
#include "zero/context.hpp"
#include "zero/engine.hpp"
#include "zero/groups.hpp"
#include "zero/layout.hpp"

namespace zero::test::split {

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
inline const std::vector<USpec> kModel = {
    {"embed", {{"w", 8, 6, false}, {"b", 5, 1, true}}},
    {"mlp", {{"w", 12, 10, false}, {"b", 3, 1, true}}},
    {"big", {{"w", 200, 1, false}, {"g", 1, 1, true}}},
};
inline constexpr int kGlobalBatch = 8;

inline int pipeline_part_of(std::size_t unit, int P) {
  return static_cast<int>(unit * static_cast<std::size_t>(P) / kModel.size());
}

// This rank's part: its pipeline part's units, its tensor rank's rows of the split parameters
// (declared split along axis 0, so checkpoint tools can put them back together).
// tied: the last pipeline part also holds a copy of embed.w (as GPT's last part holds the tied
// wte), the same unit and parameter name, its norm counted in the first part only.
inline Layout part_layout(int T, int P, GridCoord c, bool tied = false) {
  Layout l;
  for (std::size_t u = 0; u < kModel.size(); ++u) {
    if (pipeline_part_of(u, P) != c.pipeline) continue;
    std::vector<std::pair<std::string, Layout::Shape>> ps;
    for (const auto& p : kModel[u].params) ps.push_back({p.name, {p.replicated ? p.rows : p.rows / T, p.cols}});
    const int id = l.add_unit(kModel[u].name, ps);
    for (const auto& p : kModel[u].params) {
      if (p.replicated)
        l.set_replicated(id, p.name);
      else if (T > 1)
        l.set_split(id, p.name, 0);
    }
  }
  if (tied && P > 1 && c.pipeline == P - 1) {
    const PSpec& w = kModel[0].params[0];
    const int id = l.add_unit(kModel[0].name, {{w.name, {w.rows / T, w.cols}}});
    if (T > 1) l.set_split(id, w.name, 0);
    l.set_norm_counted_elsewhere(id, w.name);
  }
  return l;
}

inline int model_unit(const std::string& name) {
  for (std::size_t u = 0; u < kModel.size(); ++u)
    if (name == kModel[u].name) return static_cast<int>(u);
  return -1;
}
// Global element index of element i of this rank's part of parameter p.
inline std::int64_t global_index(const ParamInfo& p, int t, std::int64_t i) {
  return p.replicated ? i : static_cast<std::int64_t>(t) * p.numel + i;
}
inline std::uint64_t seed_of(const ParamInfo& p) {
  std::uint64_t s = 7;
  for (char ch : p.unit + "." + p.name) s = s * 131 + static_cast<unsigned char>(ch);
  return s;
}

// AdamW with clipping (active: the norm decides every update), 8 samples per step over D ranks.
inline std::string config_text(int stage, int data_size, bool fp16 = false) {
  std::string y = "train_micro_batch_size_per_gpu: " + std::to_string(kGlobalBatch / data_size) +
                  "\ngradient_clipping: 0.5\noptimizer:\n  type: AdamW\n  params:\n    lr: 0.01\n"
                  "zero_optimization:\n  stage: " +
                  std::to_string(stage) + "\n  stage3_param_persistence_threshold: 0\n";
  if (fp16) y += "fp16:\n  enabled: true\n  initial_scale_power: 4\n  hysteresis: 1\n";
  return y;
}

// The whole model's initial values, part by part.
inline void init_part(Engine& e, GridCoord c) {
  e.init_params([&](const ParamInfo& p, std::span<float> v) {
    for (std::size_t i = 0; i < v.size(); ++i)
      v[i] = 0.5f *
             hash_unit(seed_of(p), static_cast<std::uint64_t>(global_index(p, c.tensor, static_cast<std::int64_t>(i))));
  });
}

// Global step s on this rank's part; returns the step's gradient norm. poison: this rank puts
// an infinity into its first unit's first gradient.
inline double train_step(Engine& e, const ProcessGroups& g, int s, bool poison = false) {
  const GridCoord c = g.coord();
  const int D = g.data_size(), micro = kGlobalBatch / D;
  const int n = e.layout().num_units();
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
      if (poison && mu == 0 && k == 0) gt.set(0, std::numeric_limits<float>::infinity());
    }
    e.reduce(u);
  }
  return e.step().grad_norm;
}

// A grid: tensor and pipeline sizes (the data-parallel size is what the world leaves), and the
// ZeRO stage the engine runs at.
struct Grid {
  int tensor, pipeline, stage;
  std::string name() const { return "tp" + std::to_string(tensor) + "_pp" + std::to_string(pipeline); }
};

// An engine on `g`'s grid with the model's initial values (tied: as part_layout's).
struct Job {
  ProcessGroups groups;
  Engine engine;
  Job(Context& ctx, const Grid& g, bool tied = false)
      : groups(ctx, {.tensor = g.tensor, .pipeline = g.pipeline}),
        engine(
            ctx,
            [&] {
              Config c = parse_config(config_text(g.stage, groups.data_size()), "split_model");
              c.resolve(groups.data_size());
              return c;
            }(),
            part_layout(g.tensor, g.pipeline, groups.coord(), tied), groups) {
    init_part(engine, groups.coord());
  }
  std::vector<double> train(int from, int to) {
    std::vector<double> norms;
    for (int s = from; s < to; ++s) norms.push_back(train_step(engine, groups, s));
    return norms;
  }
  std::vector<float> master() {
    std::vector<float> all;
    for (int u = 0; u < engine.layout().num_units(); ++u) {
      auto m = engine.full_master(u);
      all.insert(all.end(), m.begin(), m.end());
    }
    return all;
  }
};

}  // namespace zero::test::split
