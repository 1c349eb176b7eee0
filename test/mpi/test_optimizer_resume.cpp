// The optimizers beyond Adam resume at another world size and stage. A process cannot change its
// world size, so two ctest entries share ZERO_OPT_CKPT_DIR:
//   [save]  at N ranks: 5 steps of each optimizer at stage S(N), saved to <optimizer>_n<N>/;
//   [load]  at M ranks: each of those loaded at another stage, 5 more steps, against 10 steps
//           run here without interruption: within fp32 rounding (the partials of the whole-tensor
//           statistics and Muon's owners change with the world size; the state re-split must not).
// Resuming at the same world size and stage is bit-exact (test_gpt_optimizers).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint_common.hpp"
#include "engine_model.hpp"
#include "zero/checkpoint.hpp"
#include "zero/context.hpp"
#include "zero/engine.hpp"

using namespace zero;
using namespace zero::test;

namespace {

Context& world() { return *Context::current(); }

constexpr int kGlobalBatch = 12;  // 1 to 4 ranks
const char* const kOptimizers[] = {"Lamb", "Lion", "Adafactor", "Muon"};

Config make_config(const std::string& type, int stage) {
  std::string y = "train_micro_batch_size_per_gpu: " + std::to_string(kGlobalBatch / world().world_size()) +
                  "\ngradient_accumulation_steps: 1\n";
  y += "zero_optimization:\n  stage: " + std::to_string(stage) + "\n  stage3_param_persistence_threshold: 0\n";
  y += "optimizer:\n  type: " + type + "\n  params:\n    lr: 0.01\n    weight_decay: 0.1\n";
  if (type == "Adafactor") y += "    beta1: 0.9\n    scale_parameter: true\n";
  Config cfg = parse_config(y, "test_optimizer_resume");
  cfg.resolve(world().world_size());
  return cfg;
}

std::string dir() { return cktest::dir_from_env("ZERO_OPT_CKPT_DIR"); }
int save_stage(int n) { return n == 1 ? 0 : 2; }
int load_stage(int m) { return m == 2 ? 3 : 1; }

std::vector<std::vector<float>> masters(Engine& e) {
  std::vector<std::vector<float>> m;
  for (int u = 0; u < e.layout().num_units(); ++u) m.push_back(e.full_master(u));
  return m;
}

}  // namespace

TEST_CASE("save each optimizer at N ranks", "[.][save]") {
  const int n = world().world_size();
  for (const char* type : kOptimizers) {
    Engine e(world(), make_config(type, save_stage(n)), make_cut_matrix_layout());
    e.init_params(init_value);
    train(e, world().rank(), n, 0, 5);
    const std::string root = dir() + "/" + type + "_n" + std::to_string(n);
    if (world().is_root()) std::filesystem::remove_all(root);  // a previous run's
    world().comm().barrier();
    save_checkpoint(e, root);
  }
}

TEST_CASE("load at M ranks and another stage what N ranks saved", "[.][load]") {
  const int m = world().world_size();
  for (const char* type : kOptimizers) {
    Engine whole(world(), make_config(type, load_stage(m)), make_cut_matrix_layout());
    whole.init_params(init_value);
    train(whole, world().rank(), m, 0, 10);
    const std::vector<std::vector<float>> want = masters(whole);
    for (int n : {1, 3}) {
      INFO(type << ": saved by " << n << " ranks at stage " << save_stage(n) << ", loaded by " << m << " at stage "
                << load_stage(m));
      Engine e(world(), make_config(type, load_stage(m)), make_cut_matrix_layout());
      load_checkpoint(e, dir() + "/" + type + "_n" + std::to_string(n));
      REQUIRE(e.global_step() == 5);
      train(e, world().rank(), m, 5, 5);
      const std::vector<std::vector<float>> got = masters(e);
      double d = 0, w = 0;
      for (std::size_t u = 0; u < want.size(); ++u)
        for (std::size_t i = 0; i < want[u].size(); ++i) {
          d += (static_cast<double>(got[u][i]) - want[u][i]) * (static_cast<double>(got[u][i]) - want[u][i]);
          w += static_cast<double>(want[u][i]) * want[u][i];
        }
      INFO("||resumed - uninterrupted|| / ||uninterrupted|| = " << std::sqrt(d / w));
      if (world().is_root())
        std::printf("  %s saved at %d rank(s), stage %d, resumed at %d, stage %d: %.1e relative to uninterrupted\n",
                    type, n, save_stage(n), m, load_stage(m), std::sqrt(d / w));
      CHECK(std::sqrt(d / w) <= 1e-5);
    }
  }
}
