// Optimizers with whole-tensor statistics (Lamb, Adafactor, Muon) on a layout whose matrices the
// partition cuts at uneven places: at 1-4 ranks the slices (multiples of 64 elements) begin and
// end inside matrix rows, and a small offload sub-group cuts them again. Every world size and
// stage must give the single-process update of test/support/optimizer_reference.hpp (double
// precision, written from the papers' equations) within fp32 rounding; at one world size the
// stages must agree bit for bit, and so must offloaded and resident state.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "engine_model.hpp"
#include "optimizer_reference.hpp"
#include "zero/context.hpp"
#include "zero/engine.hpp"

using namespace zero;
using namespace zero::test;

namespace {

Context& ctx() { return *Context::current(); }

constexpr int kGlobalBatch = 12;  // divisible by 1, 2, 3 and 4 ranks: the same batch at each
constexpr int kSteps = 6;

struct Opt {
  std::string label, yaml;
  optref::Hyper h;
};

std::vector<Opt> optimizers() {
  std::vector<Opt> v;
  Opt lamb{"Lamb", "  type: Lamb\n  params:\n    lr: 0.01\n    weight_decay: 0.1\n", {}};
  lamb.h.kind = optref::Kind::lamb;
  lamb.h.lr = 0.01;
  lamb.h.weight_decay = 0.1;
  v.push_back(lamb);
  Opt af{"Adafactor",
         "  type: Adafactor\n  params:\n    lr: 0.01\n    beta1: 0.9\n    scale_parameter: true\n"
         "    weight_decay: 0.1\n",
         {}};
  af.h.kind = optref::Kind::adafactor;
  af.h.lr = 0.01;
  af.h.af_beta1 = 0.9;
  af.h.scale_parameter = true;
  af.h.weight_decay = 0.1;
  v.push_back(af);
  Opt muon{"Muon", "  type: Muon\n  params:\n    lr: 0.01\n    weight_decay: 0.1\n    betas: [0.9, 0.95]\n", {}};
  muon.h.kind = optref::Kind::muon;
  muon.h.lr = 0.01;
  muon.h.weight_decay = 0.1;
  muon.h.beta1 = 0.9;
  muon.h.beta2 = 0.95;
  v.push_back(muon);
  return v;
}

Config make_config(const Opt& o, int stage, bool offload) {
  // One micro-step: stages 2 and 3 reduce every micro-step's gradient, stages 0 and 1 the sum of
  // them, so with several the gradients (not the optimizers) would differ in their last bits.
  const int micro = kGlobalBatch / ctx().world_size();
  std::string y = "train_micro_batch_size_per_gpu: " + std::to_string(micro) + "\ngradient_accumulation_steps: 1\n";
  y += "zero_optimization:\n  stage: " + std::to_string(stage) + "\n  stage3_param_persistence_threshold: 0\n";
  if (offload) y += "  sub_group_size: 100\n  offload_optimizer:\n    device: cpu\n";
  y += "optimizer:\n" + o.yaml;
  Config cfg = parse_config(y, "test_optimizer_split");
  cfg.resolve(ctx().world_size());
  return cfg;
}

std::vector<std::vector<float>> run_engine(const Opt& o, int stage, bool offload) {
  Engine e(ctx(), make_config(o, stage, offload), make_cut_matrix_layout());
  e.init_params(init_value);
  train(e, ctx().rank(), ctx().world_size(), 0, kSteps);
  std::vector<std::vector<float>> out;
  for (int u = 0; u < e.layout().num_units(); ++u) out.push_back(e.full_master(u));
  return out;
}

// One process: the mean gradient of the whole global batch (engine_model.hpp's samples), then
// the reference optimizer per tensor, in double.
std::vector<std::vector<double>> run_reference(const Opt& o) {
  const Layout l = make_cut_matrix_layout();
  std::vector<std::vector<double>> w;
  std::vector<std::vector<optref::TensorState>> st;
  for (const UnitInfo& ui : l.units()) {
    std::vector<float> init(static_cast<std::size_t>(ui.numel));
    std::vector<optref::TensorState> s;
    for (const ParamInfo& p : ui.params) {
      init_value(p, std::span<float>(init.data() + p.offset, static_cast<std::size_t>(p.numel)));
      optref::TensorState t;
      t.name = p.name;
      t.shape = p.shape;
      t.decay = p.decay;
      t.embedding = p.embedding;
      s.push_back(t);
    }
    w.emplace_back(init.begin(), init.end());
    st.push_back(std::move(s));
  }
  for (int s = 0; s < kSteps; ++s)
    for (std::size_t u = 0; u < w.size(); ++u) {
      const UnitInfo& ui = l.unit(static_cast<int>(u));
      std::vector<double> g(w[u].size(), 0.0);
      for (std::int64_t k = 0; k < kGlobalBatch; ++k)
        for (std::size_t i = 0; i < g.size(); ++i)
          g[i] += sample_grad(static_cast<int>(u), static_cast<std::int64_t>(i), s * kGlobalBatch + k,
                              static_cast<float>(w[u][i]));
      for (double& x : g) x /= kGlobalBatch;
      for (std::size_t k = 0; k < ui.params.size(); ++k) {
        const ParamInfo& p = ui.params[k];
        const auto b = static_cast<std::ptrdiff_t>(p.offset), e = b + static_cast<std::ptrdiff_t>(p.numel);
        std::vector<double> x(w[u].begin() + b, w[u].begin() + e), gp(g.begin() + b, g.begin() + e);
        optref::step(o.h, st[u][k], x, gp, s + 1);
        std::copy(x.begin(), x.end(), w[u].begin() + b);
      }
    }
  return w;
}

// The largest per-tensor relative distance ||got - want|| / ||want||.
double worst_tensor_error(const std::vector<std::vector<float>>& got, const std::vector<std::vector<double>>& want) {
  const Layout l = make_cut_matrix_layout();
  double worst = 0.0;
  for (std::size_t u = 0; u < want.size(); ++u)
    for (const ParamInfo& p : l.unit(static_cast<int>(u)).params) {
      double d = 0.0, n = 0.0;
      for (std::int64_t i = p.offset; i < p.offset + p.numel; ++i) {
        const double a = got[u][static_cast<std::size_t>(i)], b = want[u][static_cast<std::size_t>(i)];
        d += (a - b) * (a - b);
        n += b * b;
      }
      INFO("unit " << u << " " << p.name << ": " << std::sqrt(d) << " of " << std::sqrt(n));
      worst = std::max(worst, std::sqrt(d / n));
    }
  return worst;
}

// Elements that differ in any bit.
std::size_t differing(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  std::size_t n = 0;
  for (std::size_t u = 0; u < a.size(); ++u)
    for (std::size_t i = 0; i < a[u].size(); ++i) n += std::memcmp(&a[u][i], &b[u][i], sizeof(float)) != 0;
  return n;
}

}  // namespace

TEST_CASE("whole-tensor optimizers give one process's update on unevenly cut matrices", "[optim][split]") {
  for (const Opt& o : optimizers()) {
    INFO(o.label << " at " << ctx().world_size() << " rank(s)");
    const std::vector<std::vector<double>> want = run_reference(o);
    std::vector<std::vector<float>> first;
    for (int stage = 0; stage <= 3; ++stage) {
      INFO("stage " << stage);
      const std::vector<std::vector<float>> got = run_engine(o, stage, false);
      const double err = worst_tensor_error(got, want);
      CHECK(err <= 1e-5);
      if (stage == 0)
        first = got;
      else
        CHECK(differing(got, first) == 0);  // bit for bit across stages at one world size
      if (ctx().is_root())
        std::printf("  %s, %d rank(s), stage %d: largest per-tensor deviation from the reference %.1e\n",
                    o.label.c_str(), ctx().world_size(), stage, err);
    }
    if (ctx().world_size() > 1) {
      // Sub-groups of 100 elements cut the slices again; state in host memory.
      CHECK(differing(run_engine(o, 2, true), run_engine(o, 2, false)) == 0);
    }
  }
}
