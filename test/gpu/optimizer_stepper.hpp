// Steps a per-tensor optimizer (optim/optimizer.hpp) the way the engine does at stage 0 on one
// process, with `world` partition slices: every pass visits each unit's slices in order, each
// slice's part of each tensor in two runs cut at a third (sub-groups), then end_pass. The state
// lives in host memory (run() with a null backend: the host kernels) or in a backend's memory
// (the device kernels), so the two paths can be stepped side by side from the same start.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "backend/backend.hpp"
#include "gpu_test_util.hpp"
#include "optim/optimizer.hpp"

namespace zero::gputest {

class OptimizerStepper {
 public:
  // dev null: host memory. The initial master and state come from the seeds, the same on both.
  OptimizerStepper(const Layout& layout, const OptimizerConfig& cfg, int world, DType grad_type, Backend* dev)
      : layout_(layout), world_(world), gt_(grad_type), dev_(dev) {
    OptimizerEnv env;
    env.layout = &layout_;
    for (int u = 0; u < layout_.num_units(); ++u) env.slice.push_back(layout_.slice_numel(u, world));
    env.world = world;
    env.stage = 0;
    opt_ = make_optimizer(cfg, env);
    for (int u = 0; u < layout_.num_units(); ++u) {
      const std::size_t n = static_cast<std::size_t>(layout_.padded_numel(u, world));
      master_.push_back(random_floats(n, 700 + static_cast<std::uint64_t>(u), 0.3f, false));
      std::vector<std::vector<float>> s;
      for (int k = 0; k < opt_->moments(); ++k) s.emplace_back(n, 0.0f);
      state_.push_back(std::move(s));
      grad_.emplace_back(n * dtype_size(gt_), 0);
      out_.emplace_back(n * dtype_size(DType::bf16), 0);
      if (!dev_) continue;
      dmaster_.push_back(upload(*dev_, master_.back()));
      std::vector<Buffer> ds;
      for (const auto& v : state_.back()) ds.push_back(upload(*dev_, v));
      dstate_.push_back(std::move(ds));
      dgrad_.push_back(upload(*dev_, grad_.back()));
      dout_.push_back(upload(*dev_, out_.back()));
    }
  }

  Optimizer& optimizer() { return *opt_; }

  // One update with gradients from `seed` (the same on both paths).
  void step(std::int64_t t, double lr, float grad_scale, std::uint64_t seed) {
    for (int u = 0; u < layout_.num_units(); ++u) {
      auto& g = grad_[static_cast<std::size_t>(u)];
      g = to_dtype(random_floats(g.size() / dtype_size(gt_), seed * 31 + static_cast<std::uint64_t>(u), 1.0f, false),
                   gt_);
      if (dev_) dgrad_[static_cast<std::size_t>(u)] = upload(*dev_, g);
    }
    opt_->begin_step(StepHyper{lr, t, grad_scale});
    for (int pass = 0; pass < opt_->passes(); ++pass) {
      visit(pass);
      if (pass + 1 < opt_->passes()) opt_->end_pass(pass);
    }
  }

  // Unit u's master, state k and compute-dtype (bf16) parameters, from wherever they live.
  std::vector<float> master(int u) const { return fetch(u, master_, dmaster_); }
  std::vector<float> state(int u, int k) const {
    const std::size_t n = master_[static_cast<std::size_t>(u)].size();
    if (!dev_) return state_[static_cast<std::size_t>(u)][static_cast<std::size_t>(k)];
    return download<float>(*dev_, dstate_[static_cast<std::size_t>(u)][static_cast<std::size_t>(k)], n);
  }
  std::vector<char> params(int u) const {
    const std::size_t b = out_[static_cast<std::size_t>(u)].size();
    return dev_ ? download<char>(*dev_, dout_[static_cast<std::size_t>(u)], b) : out_[static_cast<std::size_t>(u)];
  }

 private:
  std::vector<float> fetch(int u, const std::vector<std::vector<float>>& host, const std::vector<Buffer>& d) const {
    const std::size_t n = host[static_cast<std::size_t>(u)].size();
    return dev_ ? download<float>(*dev_, d[static_cast<std::size_t>(u)], n) : host[static_cast<std::size_t>(u)];
  }

  void visit(int pass) {
    const bool last = pass + 1 == opt_->passes();
    const std::vector<int> first = tensor_offsets(layout_);
    for (int u = 0; u < layout_.num_units(); ++u) {
      const auto uu = static_cast<std::size_t>(u);
      const std::int64_t slice = layout_.slice_numel(u, world_);
      const auto& params = layout_.unit(u).params;
      for (int s = 0; s < world_; ++s)
        for (std::size_t p = 0; p < params.size(); ++p) {
          const ParamInfo& info = params[p];
          const std::int64_t lo = std::max(info.offset, s * slice);
          const std::int64_t hi = std::min(info.offset + info.numel, (s + 1) * slice);
          if (lo >= hi) continue;
          const std::int64_t cut = lo + (hi - lo) / 3;
          for (const auto& [a, b] : {std::pair{lo, cut}, std::pair{cut, hi}}) {
            if (a == b) continue;
            OptimRun r;
            r.unit = u;
            r.param = &info;
            r.tensor = first[uu] + static_cast<int>(p);
            r.at = a - info.offset;
            r.own_at = a;
            r.n = b - a;
            r.slice = s;
            r.decay = info.shape.size() >= 2;
            const auto at = static_cast<std::size_t>(a);
            r.grad_type = gt_;
            r.param_type = DType::bf16;
            if (dev_) {
              r.master = dmaster_[uu].as<float>() + at;
              for (int k = 0; k < opt_->moments(); ++k)
                r.state[k] = dstate_[uu][static_cast<std::size_t>(k)].as<float>() + at;
              r.grad = dgrad_[uu].as<char>() + at * dtype_size(gt_);
              r.param_out = last ? dout_[uu].as<char>() + at * 2 : nullptr;
            } else {
              r.master = master_[uu].data() + at;
              for (int k = 0; k < opt_->moments(); ++k)
                r.state[k] = state_[uu][static_cast<std::size_t>(k)].data() + at;
              r.grad = grad_[uu].data() + at * dtype_size(gt_);
              r.param_out = last ? out_[uu].data() + at * 2 : nullptr;
            }
            opt_->run(pass, r, dev_);
          }
        }
    }
  }

  const Layout& layout_;
  int world_;
  DType gt_;
  Backend* dev_;
  std::unique_ptr<Optimizer> opt_;
  std::vector<std::vector<float>> master_;
  std::vector<std::vector<std::vector<float>>> state_;
  std::vector<std::vector<char>> grad_, out_;
  std::vector<Buffer> dmaster_, dgrad_, dout_;
  std::vector<std::vector<Buffer>> dstate_;
};

}  // namespace zero::gputest
