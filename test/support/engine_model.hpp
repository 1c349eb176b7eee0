// A small deterministic "model" for engine tests: units of odd sizes whose per-sample gradient
// is a nonlinear function of the parameters, so several steps of training exercise the whole
// loop, and an independent single-process reference that applies the same global batch.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "zero/config.hpp"
#include "zero/dtype.hpp"
#include "zero/engine.hpp"
#include "zero/layout.hpp"

namespace zero::test {

// Unit sizes 38, 38, 13, 16, 1 + 200: none divisible by 3 or 4, so padding is exercised.
inline Layout make_layout() {
  Layout l;
  l.add_unit("embed", {{"w", {7, 5}}, {"b", {3}}});
  l.add_unit("layer0", {{"w", {11, 3}}, {"b", {5}}});
  l.add_unit("layer1", {{"w", {13}}});
  l.add_unit("head", {{"w", {4, 4}}});
  l.add_unit("big", {{"w", {200}}, {"s", {1}}});
  return l;
}

// The same units with weight decay on some parameters only: the GPT-2 rule (1-D parameters
// undecayed), then big.w decayed again, so decayed and undecayed runs alternate inside units
// and the rank slice boundaries at 2-4 ranks cut through both kinds.
inline Layout make_mixed_decay_layout() {
  Layout l = make_layout();
  l.decay_matrices_only();
  l.set_decay(l.find_unit("big"), "w", true);
  return l;
}

// Matrices the partition cuts inside their rows at 1-4 ranks (37 x 23 and 19 x 29: no row a
// multiple of the 64-element slice alignment), a bias and a gain, and an embedding (which Muon
// leaves to AdamW); weight decay on the 2-D parameters. For optimizers with whole-tensor
// statistics.
inline Layout make_cut_matrix_layout() {
  Layout l;
  l.add_unit("a", {{"b", {5}}, {"w", {37, 23}}, {"g", {3}}});
  const int b = l.add_unit("b", {{"w", {19, 29}}, {"e", {11, 6}}});
  l.set_embedding(b, "e");
  l.decay_matrices_only();
  return l;
}

// How far apart two models' weights (units of values) are: the largest |a - b|, and the
// largest |a|, for checks of the form "within x% of a's largest weight".
struct WeightDifference {
  float worst = 0.0f, largest = 0.0f;
};
inline WeightDifference weight_difference(const std::vector<std::vector<float>>& a,
                                          const std::vector<std::vector<float>>& b) {
  WeightDifference d;
  for (std::size_t u = 0; u < a.size(); ++u)
    for (std::size_t i = 0; i < a[u].size(); ++i) {
      d.largest = std::max(d.largest, std::abs(a[u][i]));
      d.worst = std::max(d.worst, std::abs(b[u][i] - a[u][i]));
    }
  return d;
}

// Deterministic values in [-1, 1) from two integers.
inline float hash_unit(std::uint64_t a, std::uint64_t b) {
  std::uint64_t x = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull);
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return static_cast<float>(static_cast<double>(x >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

inline void init_value(const ParamInfo& p, std::span<float> out) {
  std::uint64_t seed = 0;
  for (char c : p.name) seed = seed * 131 + static_cast<unsigned char>(c);
  for (std::size_t i = 0; i < out.size(); ++i)
    out[i] = 0.5f * hash_unit(seed + static_cast<std::uint64_t>(p.offset), i);
}

// Per-sample gradient of element i of unit u for parameter value w.
inline float sample_grad(int unit, std::int64_t i, std::int64_t sample, float w) {
  float x = hash_unit(static_cast<std::uint64_t>(sample) * 1000 + static_cast<std::uint64_t>(unit),
                      static_cast<std::uint64_t>(i));
  return (1.0f + 0.25f * static_cast<float>(unit)) * (w - x) + 0.1f * w * w * w;
}

// The global batch of one step: micro-batch k of rank r holds samples
// step*B + (k*world + r)*micro + j, j < micro, with B = world*gas*micro.
inline std::int64_t sample_id(std::int64_t step, int k, int r, int j, int world, int gas, int micro) {
  std::int64_t B = static_cast<std::int64_t>(world) * gas * micro;
  return step * B + (static_cast<std::int64_t>(k) * world + r) * micro + j;
}

// Mean gradient over a micro-batch, in fp32, for full unit values w (compute dtype, widened).
inline std::vector<float> micro_grad(int unit, const std::vector<float>& w, std::int64_t step, int k, int r, int world,
                                     int gas, int micro) {
  std::vector<float> g(w.size(), 0.0f);
  for (int j = 0; j < micro; ++j) {
    std::int64_t s = sample_id(step, k, r, j, world, gas, micro);
    for (std::size_t i = 0; i < w.size(); ++i) g[i] += sample_grad(unit, static_cast<std::int64_t>(i), s, w[i]);
  }
  for (auto& v : g) v /= static_cast<float>(micro);
  return g;
}

// The independent reference of the engine tests: full-precision Adam(W) over full units, with
// the hyper-parameters the tests configure (lr 0.01, betas 0.9/0.95, eps 1e-8, weight decay 0.1
// on the parameters the layout marks as decayed).
struct ReferenceAdam {
  std::vector<std::vector<double>> w, m, v;
  std::vector<std::vector<bool>> decayed;

  explicit ReferenceAdam(const Layout& l) {
    for (const auto& ui : l.units()) {
      std::vector<float> init(static_cast<std::size_t>(ui.numel));
      std::vector<bool> d(init.size());
      for (const auto& p : ui.params) {
        init_value(p, std::span<float>(init.data() + p.offset, static_cast<std::size_t>(p.numel)));
        for (std::int64_t i = 0; i < p.numel; ++i) d[static_cast<std::size_t>(p.offset + i)] = p.decay;
      }
      decayed.push_back(std::move(d));
      w.emplace_back(init.begin(), init.end());
      m.emplace_back(init.size(), 0.0);
      v.emplace_back(init.size(), 0.0);
    }
  }

  // Update number t (1-based) with the mean gradient g; AdamW decays decoupled, Adam adds L2.
  void update(const std::vector<std::vector<double>>& g, int t, bool decoupled) {
    const double lr = 0.01, b1 = 0.9, b2 = 0.95, eps = 1e-8;
    for (std::size_t u = 0; u < w.size(); ++u)
      for (std::size_t i = 0; i < w[u].size(); ++i) {
        const double wd = decayed[u][i] ? 0.1 : 0.0;
        double gi = g[u][i];
        if (decoupled)
          w[u][i] *= 1.0 - lr * wd;
        else
          gi += wd * w[u][i];
        m[u][i] = b1 * m[u][i] + (1 - b1) * gi;
        v[u][i] = b2 * v[u][i] + (1 - b2) * gi * gi;
        double denom = std::sqrt(v[u][i]) / std::sqrt(1 - std::pow(b2, t)) + eps;
        w[u][i] -= lr / (1 - std::pow(b1, t)) * m[u][i] / denom;
      }
  }
};

// The backward of unit u in micro-step k of step s: gather, add the loss-scaled mean gradient of
// this rank's micro-batch into grads(u), reduce. `divide`: a loop that divides its loss seed
// itself (gradient_average: ranks or none).
inline void backward_unit(Engine& e, int u, std::int64_t s, int k, int rank, int world, int gas, int micro,
                          float divide = 1.0f) {
  auto p = e.gather(u);
  auto g = e.grads(u);
  const UnitInfo& ui = e.layout().unit(u);
  std::vector<float> w(static_cast<std::size_t>(ui.numel));
  for (const auto& pi : ui.params)
    for (std::int64_t i = 0; i < pi.numel; ++i) w[static_cast<std::size_t>(pi.offset + i)] = p[pi.name].get(i);
  auto mg = micro_grad(u, w, s, k, rank, world, gas, micro);
  const float scale = e.loss_scale() / divide;
  for (int pi = 0; pi < static_cast<int>(ui.params.size()); ++pi) {
    auto t = g[pi];
    for (std::int64_t i = 0; i < t.numel; ++i) t.add(i, scale * mg[static_cast<std::size_t>(t.info->offset + i)]);
  }
  e.reduce(u);
}

// The micro-steps of step s, up to step(): per micro-step a forward of gathers, then a backward
// that gathers, adds the loss-scaled micro-batch gradient and reduces, last unit first.
inline void accumulate(Engine& e, int rank, int world, std::int64_t s, float divide = 1.0f) {
  const int gas = static_cast<int>(e.config().gradient_accumulation_steps);
  const int micro = static_cast<int>(e.config().train_micro_batch_size_per_gpu);
  const int n = e.layout().num_units();
  for (int k = 0; k < gas; ++k) {
    for (int u = 0; u < n; ++u) e.gather(u);  // forward (handles released at once)
    for (int u = n - 1; u >= 0; --u) backward_unit(e, u, s, k, rank, world, gas, micro, divide);
  }
}

// Trains `steps` steps (accumulate, then step()).
inline void train(Engine& e, int rank, int world, int first_step, int steps,
                  std::vector<StepResult>* results = nullptr) {
  for (int s = first_step; s < first_step + steps; ++s) {
    accumulate(e, rank, world, s);
    StepResult r = e.step();
    if (results) results->push_back(r);
  }
}

}  // namespace zero::test
