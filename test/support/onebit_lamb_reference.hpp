// OneBitLamb's double-precision reference, written from DeepSpeed's OneBitLamb
// (deepspeed/runtime/fp16/onebit/lamb.py) and the paper (Li et al. 2021), for the tests that
// train it on onebit_run.hpp's layout (test_onebit_lamb, test_onebit_lamb_resume): the warm-up's
// Lamb and trust-ratio average, the scaling coefficients, the exchange with worker and server
// error feedback simulated for a world size (one sign bit per element and one RMS scale per slice
// of each unit, as libzero cuts the message), the fresh variance and the bounded factor.
#pragma once

#include <algorithm>
#include <cmath>
#include <span>
#include <string>
#include <vector>

#include "onebit_run.hpp"

namespace zero::test::onebit {

constexpr int kFreeze = 6, kMicro = 4;
constexpr double kLr = 0.01, kB1 = 0.9, kB2 = 0.95, kEps = 1e-8, kWd = 0.1;
constexpr double kMaxCoeff = 10.0, kMinCoeff = 0.01, kCoeffBeta = 0.8;
constexpr double kFactorMax = 4.0, kFactorMin = 0.5, kFactorThreshold = 0.1;

inline Config make_config(const std::string& optimizer, int stage) {
  std::string y = "train_micro_batch_size_per_gpu: " + std::to_string(kMicro) + "\ngradient_accumulation_steps: 1\n";
  y += "zero_optimization:\n  stage: " + std::to_string(stage) + "\n";
  y += "optimizer:\n  type: " + optimizer + "\n  params:\n    lr: 0.01\n    betas: [0.9, 0.95]\n    eps: 1.0e-8\n";
  y += "    weight_decay: 0.1\n";
  if (optimizer != "OneBitAdam") y += "    bias_correction: false\n";  // (OneBitAdam never corrects)
  if (optimizer.starts_with("OneBit")) y += "    freeze_step: " + std::to_string(kFreeze) + "\n";
  if (optimizer == "OneBitLamb") y += "    coeff_beta: 0.8\n";
  Config cfg = parse_config(y, "test_onebit_lamb");
  cfg.resolve(ctx().world_size());
  return cfg;
}

// The reference: every unit flat (the alignment between tensors included: no gradient, and a
// momentum that only the exchange moves, as in the engine), everything double.
struct LambReference {
  struct Tensor {
    int unit;
    std::size_t begin, end;
    bool decay;
    double coeff_freeze = 0.0, last_factor = 1.0, scaling = 1.0;
  };
  int world;
  Layout l = layout();
  std::vector<Tensor> tensors;
  std::vector<std::vector<double>> w, m, v, fresh, shared;     // per unit (shared: scaled, padded)
  std::vector<std::vector<std::vector<double>>> worker_error;  // per rank, per unit (padded)
  std::vector<std::vector<std::vector<double>>> server_error;  // per owner, per unit (its slice)
  bool started = false;                                        // the compressed steps

  explicit LambReference(int ranks) : world(ranks) {
    for (int u = 0; u < l.num_units(); ++u) {
      const UnitInfo& ui = l.unit(u);
      std::vector<float> init(static_cast<std::size_t>(ui.numel), 0.0f);
      for (const ParamInfo& p : ui.params) {
        init_value(p, std::span<float>(init.data() + p.offset, static_cast<std::size_t>(p.numel)));
        tensors.push_back(
            {u, static_cast<std::size_t>(p.offset), static_cast<std::size_t>(p.offset + p.numel), p.decay});
      }
      w.emplace_back(init.begin(), init.end());
      m.emplace_back(init.size(), 0.0), v.emplace_back(init.size(), 0.0), fresh.emplace_back(init.size(), 0.0);
      shared.emplace_back(static_cast<std::size_t>(l.slice_numel(u, world) * world), 0.0);
    }
    zero_errors();
  }

  // A resume at `ranks` ranks where the exchange's per-rank state is not kept (another world
  // size): zero errors, and the shared momentum from m and the scaling coefficients.
  void regrid(int ranks) {
    world = ranks;
    for (int u = 0; u < l.num_units(); ++u)
      shared[static_cast<std::size_t>(u)].assign(static_cast<std::size_t>(l.slice_numel(u, world) * world), 0.0);
    for (const Tensor& x : tensors)
      for (std::size_t i = x.begin; i < x.end; ++i)
        shared[static_cast<std::size_t>(x.unit)][i] = m[static_cast<std::size_t>(x.unit)][i] * x.scaling;
    zero_errors();
  }

  void zero_errors() {
    worker_error.assign(static_cast<std::size_t>(world), {});
    server_error.assign(static_cast<std::size_t>(world), {});
    for (int r = 0; r < world; ++r)
      for (int u = 0; u < l.num_units(); ++u) {
        worker_error[static_cast<std::size_t>(r)].emplace_back(shared[static_cast<std::size_t>(u)].size(), 0.0);
        server_error[static_cast<std::size_t>(r)].emplace_back(static_cast<std::size_t>(l.slice_numel(u, world)), 0.0);
      }
  }

  // Rank r's gradient of step s (its micro-batch mean at the weights the engine computes with).
  std::vector<double> grad(int u, int r, int s) const {
    const auto& wu = w[static_cast<std::size_t>(u)];
    std::vector<float> wf(wu.begin(), wu.end());
    const std::vector<float> g = micro_grad(u, wf, s, 0, r, world, 1, kMicro);
    std::vector<double> out(g.size(), 0.0);
    for (const Tensor& t : tensors)
      if (t.unit == u)
        for (std::size_t i = t.begin; i < t.end; ++i) out[i] = g[i];
    return out;
  }

  // x: n values; sign bit x >= 0, scale their RMS; x keeps the error, returns the decoded values.
  static std::vector<double> compress(std::vector<double>& x) {
    double ss = 0.0;
    for (double a : x) ss += a * a;
    const double scale = x.empty() ? 0.0 : std::sqrt(ss / static_cast<double>(x.size()));
    std::vector<double> d(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
      d[i] = x[i] >= 0.0 ? scale : -scale;
      x[i] -= d[i];
    }
    return d;
  }

  void step(int s) {
    const int t = s + 1;
    const int U = l.num_units();
    if (t <= kFreeze) {
      for (int u = 0; u < U; ++u) {
        std::vector<double> g(w[static_cast<std::size_t>(u)].size(), 0.0);
        for (int r = 0; r < world; ++r) {
          const std::vector<double> gr = grad(u, r, s);
          for (std::size_t i = 0; i < g.size(); ++i) g[i] += gr[i] / world;
        }
        auto &mu = m[static_cast<std::size_t>(u)], &vu = v[static_cast<std::size_t>(u)];
        for (std::size_t i = 0; i < g.size(); ++i) {
          mu[i] = kB1 * mu[i] + (1 - kB1) * g[i];
          vu[i] = kB2 * vu[i] + (1 - kB2) * g[i] * g[i];
        }
      }
      for (Tensor& x : tensors) {
        auto &wu = w[static_cast<std::size_t>(x.unit)], &mu = m[static_cast<std::size_t>(x.unit)],
             &vu = v[static_cast<std::size_t>(x.unit)];
        const double wd = x.decay ? kWd : 0.0;
        std::vector<double> upd;
        double wn = 0.0, un = 0.0;
        for (std::size_t i = x.begin; i < x.end; ++i) {
          upd.push_back(mu[i] / (std::sqrt(vu[i]) + kEps) + wd * wu[i]);
          wn += wu[i] * wu[i], un += upd.back() * upd.back();
        }
        double coeff = 1.0;
        if (wn > 0.0 && un > 0.0) coeff = std::clamp(std::sqrt(wn) / std::sqrt(un), kMinCoeff, kMaxCoeff);
        if (coeff != 1.0) x.coeff_freeze = kCoeffBeta * x.coeff_freeze + (1 - kCoeffBeta) * coeff;
        for (std::size_t i = x.begin; i < x.end; ++i) wu[i] -= kLr * coeff * upd[i - x.begin];
      }
      if (t == kFreeze) fresh = v;
      return;
    }
    if (!started) {  // the scaling coefficients, and the shared momentum from the exact one
      started = true;
      std::vector<double> rms;
      for (const Tensor& x : tensors) {
        double ss = 0.0;
        for (std::size_t i = x.begin; i < x.end; ++i)
          ss += m[static_cast<std::size_t>(x.unit)][i] * m[static_cast<std::size_t>(x.unit)][i];
        rms.push_back(std::sqrt(ss / static_cast<double>(x.end - x.begin)));
      }
      double united = 0.0;
      for (double a : rms) united += a / static_cast<double>(rms.size());
      for (std::size_t k = 0; k < tensors.size(); ++k) tensors[k].scaling = united / rms[k];
      for (int u = 0; u < U; ++u)
        std::fill(shared[static_cast<std::size_t>(u)].begin(), shared[static_cast<std::size_t>(u)].end(), 0.0);
      for (const Tensor& x : tensors)
        for (std::size_t i = x.begin; i < x.end; ++i)
          shared[static_cast<std::size_t>(x.unit)][i] = m[static_cast<std::size_t>(x.unit)][i] * x.scaling;
    }
    const std::vector<std::vector<double>> last = m;
    for (int u = 0; u < U; ++u) {
      const std::size_t uz = static_cast<std::size_t>(u), N = w[uz].size();
      const std::size_t S = static_cast<std::size_t>(l.slice_numel(u, world));
      std::vector<double> coeff(N, 1.0);
      for (const Tensor& x : tensors)
        if (x.unit == u)
          for (std::size_t i = x.begin; i < x.end; ++i) coeff[i] = x.scaling;
      // Workers: momentum of the own gradient plus the error, compressed per slice.
      std::vector<std::vector<double>> decoded(static_cast<std::size_t>(world), std::vector<double>(N, 0.0));
      for (int r = 0; r < world; ++r) {
        const std::vector<double> g = grad(u, r, s);
        std::vector<double>& e = worker_error[static_cast<std::size_t>(r)][uz];
        std::vector<double> x(N);
        for (std::size_t i = 0; i < N; ++i) x[i] = kB1 * shared[uz][i] + (1 - kB1) * g[i] * coeff[i];
        if (world == 1) {
          decoded[0] = x;
          break;
        }
        for (std::size_t c = 0; c * S < N; ++c) {
          const std::size_t b = c * S, n = std::min(S, N - b);
          std::vector<double> part(n);
          for (std::size_t i = 0; i < n; ++i) part[i] = x[b + i] + e[b + i];
          const std::vector<double> d = compress(part);
          for (std::size_t i = 0; i < n; ++i) e[b + i] = part[i], decoded[static_cast<std::size_t>(r)][b + i] = d[i];
        }
      }
      // Servers: the average of the workers' messages plus the error, compressed again.
      std::fill(shared[uz].begin(), shared[uz].end(), 0.0);
      for (std::size_t c = 0; c * S < N; ++c) {
        const std::size_t b = c * S, n = std::min(S, N - b);
        if (world == 1) {
          for (std::size_t i = 0; i < n; ++i) shared[uz][b + i] = decoded[0][b + i];
          continue;
        }
        std::vector<double>& e = server_error[c][uz];
        std::vector<double> part(n);
        for (std::size_t i = 0; i < n; ++i) {
          double sum = 0.0;
          for (int r = 0; r < world; ++r) sum += decoded[static_cast<std::size_t>(r)][b + i];
          part[i] = sum / world + e[i];
        }
        const std::vector<double> d = compress(part);
        for (std::size_t i = 0; i < n; ++i) e[i] = part[i], shared[uz][b + i] = d[i];
      }
    }
    for (Tensor& x : tensors) {
      const std::size_t uz = static_cast<std::size_t>(x.unit);
      auto &wu = w[uz], &mu = m[uz], &vu = v[uz], &fu = fresh[uz];
      const double wd = x.decay ? kWd : 0.0;
      double factor = 0.0, un = 0.0, pn = 0.0;
      std::vector<double> upd;
      for (std::size_t i = x.begin; i < x.end; ++i) {
        mu[i] = shared[uz][i] / x.scaling;
        const double r = (mu[i] - last[uz][i] * kB1) / (1 - kB1);
        fu[i] = kB2 * fu[i] + (1 - kB2) * r * r;
        const double denom = std::sqrt(vu[i]) + kEps, prelim = mu[i] / denom;
        upd.push_back(prelim + wd * wu[i]);
        un += upd.back() * upd.back(), pn += prelim * prelim;
        factor = std::max(factor, denom / (std::sqrt(fu[i]) + kEps));
      }
      if (wd > 0.0) {
        const double ratio = std::min(1.0, std::sqrt(pn) / std::sqrt(un));
        factor = factor * ratio + (1.0 - ratio);
      }
      factor = std::clamp(factor, kFactorMin, kFactorMax);
      factor = std::min(factor, x.last_factor * (1.0 + kFactorThreshold));
      factor = std::max(factor, x.last_factor * (1.0 - kFactorThreshold));
      x.last_factor = factor;
      const double coeff = x.coeff_freeze * factor;
      for (std::size_t i = x.begin; i < x.end; ++i) wu[i] -= kLr * coeff * upd[i - x.begin];
    }
  }
};

}  // namespace zero::test::onebit
