// Shared by the checkpoint tests: a model with globally unique parameter names (so it exports
// to safetensors), a training loop that also computes the loss, and an independent
// double-precision reference whose global batch does not depend on the world size.
//
// The batch of step s is samples s*B .. s*B+B-1 (B = 12): with gradient_accumulation_steps 1
// and micro = B / world, rank r's micro-batch is samples s*B + r*micro + j, so runs at world
// sizes 1, 2, 3 and 4 train on the same data and a checkpoint moved between them continues
// the same run.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <span>
#include <filesystem>
#include <string>
#include <vector>

#include "engine_model.hpp"
#include "zero/checkpoint.hpp"
#include "zero/comm.hpp"
#include "zero/context.hpp"
#include "zero/engine.hpp"
#include "zero/error.hpp"

namespace zero::test::cktest {

constexpr int kGlobalBatch = 12;

inline Context& ctx() { return *Context::current(); }

// Same sizes as engine_model's layout (38, 38, 13, 16, 201: padding at every world size).
inline Layout make_ckpt_layout() {
  Layout l;
  l.add_unit("embed", {{"embed.w", {7, 5}}, {"embed.b", {3}}});
  l.add_unit("layer0", {{"layer0.w", {11, 3}}, {"layer0.b", {5}}});
  l.add_unit("layer1", {{"layer1.w", {13}}});
  l.add_unit("head", {{"head.w", {4, 4}}});
  l.add_unit("big", {{"big.w", {200}}, {"big.s", {1}}});
  return l;
}

struct Case {
  int stage = 0;
  DType dtype = DType::f32;
  std::string offload = "none";  // none | cpu | nvme
  int gas = 1;
  std::string optimizer = "AdamW";
  bool dynamic_fp16 = false;  // small window: the scale grows until it overflows, steps are skipped
  bool scheduler = false;
  bool mixed_decay = false;  // weight decay on the 2-D parameters only (Layout::decay_matrices_only)
  int mics = -1;             // zero_optimization.mics_shard_size
  std::string nvme_dir;

  std::string name() const {
    return "stage " + std::to_string(stage) + " " + std::string(dtype_name(dtype)) + " offload " + offload +
           (gas > 1 ? " gas " + std::to_string(gas) : "") + (optimizer != "AdamW" ? " " + optimizer : "") +
           (scheduler ? " WarmupLR" : "") + (mixed_decay ? " mixed-decay" : "") +
           (mics != -1 ? " mics_shard_size " + std::to_string(mics) : "");
  }
};

inline Config make_config(const Case& c, int world) {
  std::string y;
  int micro = kGlobalBatch / (world * c.gas);
  y += "train_micro_batch_size_per_gpu: " + std::to_string(micro) + "\n";
  y += "gradient_accumulation_steps: " + std::to_string(c.gas) + "\n";
  y += "zero_optimization:\n  stage: " + std::to_string(c.stage) + "\n";
  y += "  stage3_param_persistence_threshold: 20\n";  // "head" and "layer1" stay whole at stage 3
  y += "  sub_group_size: 50\n";                      // offload steps in several chunks
  if (c.mics != -1) y += "  mics_shard_size: " + std::to_string(c.mics) + "\n";
  if (c.offload != "none") {
    y += "  offload_optimizer:\n    device: " + c.offload + "\n";
    if (c.offload == "nvme") y += "    nvme_path: " + c.nvme_dir + "\n";
  }
  if (c.dtype == DType::bf16) y += "bf16:\n  enabled: true\n";
  if (c.dtype == DType::f16)
    y += std::string("fp16:\n  enabled: true\n  initial_scale_power: 14\n") +
         (c.dynamic_fp16 ? "  loss_scale_window: 2\n  hysteresis: 1\n" : "");
  y += "optimizer:\n  type: " + c.optimizer + "\n  params:\n    lr: 0.01\n";
  if (c.optimizer == "SGD")
    y += "    momentum: 0.9\n    weight_decay: 0.01\n";
  else
    y += "    betas: [0.9, 0.95]\n    eps: 1.0e-8\n    weight_decay: 0.1\n";
  if (c.scheduler)
    y += "scheduler:\n  type: WarmupLR\n  params:\n    warmup_min_lr: 0.001\n    warmup_max_lr: 0.01\n"
         "    warmup_num_steps: 8\n    warmup_type: linear\n";
  Config cfg = parse_config(y, "test_checkpoint");
  cfg.resolve(world);
  return cfg;
}

// Loss of one sample on one unit: its gradient is engine_model's sample_grad.
inline double sample_loss(int unit, std::int64_t i, std::int64_t sample, float w) {
  double x = hash_unit(static_cast<std::uint64_t>(sample) * 1000 + static_cast<std::uint64_t>(unit),
                       static_cast<std::uint64_t>(i));
  double a = 1.0 + 0.25 * unit, wd = w;
  return 0.5 * a * (wd - x) * (wd - x) + 0.025 * wd * wd * wd * wd;
}

// One optimizer step of the test model; returns the global mean loss (same on every rank).
inline double train_step(Engine& e, const Case& c, int* skipped = nullptr) {
  Context& cx = ctx();
  int world = cx.world_size(), rank = cx.rank();
  int micro = kGlobalBatch / (world * c.gas);
  int n = e.layout().num_units();
  std::int64_t step = e.global_step();
  double loss = 0.0;
  for (int k = 0; k < c.gas; ++k) {
    for (int u = 0; u < n; ++u) {  // forward: the loss
      auto p = e.gather(u);
      const UnitInfo& ui = e.layout().unit(u);
      for (int j = 0; j < micro; ++j) {
        std::int64_t s = sample_id(step, k, rank, j, world, c.gas, micro);
        for (const auto& pi : ui.params)
          for (std::int64_t i = 0; i < pi.numel; ++i) loss += sample_loss(u, pi.offset + i, s, p[pi.name].get(i));
      }
    }
    for (int u = n - 1; u >= 0; --u) backward_unit(e, u, step, k, rank, world, c.gas, micro);
  }
  StepResult r = e.step();
  if (skipped && r.skipped) ++*skipped;
  return cx.comm().all_reduce_scalar(loss, ReduceOp::sum) / (kGlobalBatch * c.gas);
}

// Full fp32 master and full compute params (widened) of every unit: collective.
struct Snapshot {
  std::vector<std::vector<float>> master, params;
  std::int64_t step = 0;
};
inline Snapshot snapshot(Engine& e) {
  Snapshot s;
  for (int u = 0; u < e.layout().num_units(); ++u) {
    s.master.push_back(e.full_master(u));
    s.params.push_back(e.full_params(u));
  }
  s.step = e.global_step();
  return s;
}

// Bitwise equality, with the first difference reported.
inline void require_bitwise(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b,
                            const char* what) {
  REQUIRE(a.size() == b.size());
  for (std::size_t u = 0; u < a.size(); ++u) {
    REQUIRE(a[u].size() == b[u].size());
    for (std::size_t i = 0; i < a[u].size(); ++i)
      if (std::bit_cast<std::uint32_t>(a[u][i]) != std::bit_cast<std::uint32_t>(b[u][i])) {
        INFO(what << ": unit " << u << " element " << i << ": " << a[u][i] << " vs " << b[u][i]);
        REQUIRE(false);
      }
  }
}

// Double-precision AdamW on the world-independent global batch (fp32 compute, no clipping).
inline std::vector<std::vector<double>> reference(int steps) {
  ReferenceAdam ref(make_ckpt_layout());
  for (int s = 0; s < steps; ++s) {
    std::vector<std::vector<double>> g(ref.w.size());
    for (std::size_t u = 0; u < ref.w.size(); ++u) {
      std::vector<float> wc(ref.w[u].begin(), ref.w[u].end());  // rounded to fp32, as the engine computes
      g[u].assign(wc.size(), 0.0);
      for (int n = 0; n < kGlobalBatch; ++n) {
        std::int64_t sample = static_cast<std::int64_t>(s) * kGlobalBatch + n;
        for (std::size_t i = 0; i < wc.size(); ++i)
          g[u][i] += sample_grad(static_cast<int>(u), static_cast<std::int64_t>(i), sample, wc[i]);
      }
      for (auto& x : g[u]) x /= kGlobalBatch;
    }
    ref.update(g, s + 1, true);
  }
  return ref.w;
}

// The engine's parity tolerance: fp32 within 1e-6 relative, magnitudes floored at 0.25 (see
// test_engine.cpp: deviations come from rounding gradients, so they are absolute near zero).
inline void require_near_reference(const std::vector<std::vector<float>>& got,
                                   const std::vector<std::vector<double>>& ref) {
  REQUIRE(got.size() == ref.size());
  for (std::size_t u = 0; u < ref.size(); ++u)
    for (std::size_t i = 0; i < ref[u].size(); ++i) {
      double tol = 1e-6 * std::max(std::abs(ref[u][i]), 0.25);
      double err = std::abs(static_cast<double>(got[u][i]) - ref[u][i]);
      if (err > tol) {
        INFO("unit " << u << " element " << i << ": engine " << got[u][i] << " reference " << ref[u][i]);
        REQUIRE(err <= tol);
      }
    }
}

// The directory that ctest shares between the entries of a multi-entry checkpoint test (an
// environment variable set in test/mpi/CMakeLists.txt).
inline std::string dir_from_env(const char* var) {
  const char* d = std::getenv(var);
  INFO(var << " names the directory the test's ctest entries share");
  REQUIRE(d != nullptr);
  return d;
}

// A directory every rank sees, made by rank 0 (the ranks share this machine's filesystem).
inline std::string shared_temp_dir(const char* tag) {
  char buf[256] = {};
  if (ctx().rank() == 0) {
    std::string t = (std::filesystem::temp_directory_path() / (std::string("zero_") + tag + "_XXXXXX")).string();
    std::snprintf(buf, sizeof buf, "%s", t.c_str());
    REQUIRE(::mkdtemp(buf) != nullptr);
  }
  ctx().comm().broadcast(buf, sizeof buf, 0);
  return buf;
}

inline void remove_dir(const std::string& d) {
  ctx().comm().barrier();
  if (ctx().rank() == 0) std::filesystem::remove_all(d);
}

}  // namespace zero::test::cktest
