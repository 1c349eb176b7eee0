// autotune at the test's world size (ctest: 2 ranks) on the host backend: candidates the planner
// rules out are not run, a candidate whose micro-batch does not divide the global batch fails
// with the config's message, every other one is timed, the fastest wins, and the winner's config
// file loads back with the winner's settings.
// with_grids builds the grid candidates; autotune() without an engine factory fails a grid
// candidate that needs groups and refuses one whose sizes do not divide the ranks.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "zero/plan/autotune.hpp"
#include "zero/context.hpp"
#include "zero/engine.hpp"
#include "zero/plan/plan.hpp"

using namespace zero;

namespace {

// One optimizer step of a loop with the engine's contract: forward gathers, backward adds a
// gradient into every unit and reduces it.
void train_step(Engine& e) {
  const int n = e.layout().num_units();
  for (int k = 0; k < e.config().gradient_accumulation_steps; ++k) {
    for (int u = 0; u < n; ++u) e.gather(u);
    for (int u = n - 1; u >= 0; --u) {
      auto p = e.gather(u);
      auto g = e.grads(u);
      for (const auto& info : e.layout().unit(u).params) {
        TensorRef gr = g[info.name];
        TensorRef pr = p[info.name];
        for (std::int64_t i = 0; i < gr.numel; ++i) gr.add(i, 0.01f * pr.get(i) + 0.001f);
      }
      e.reduce(u);
    }
  }
  e.step();
}

void init(const ParamInfo& p, std::span<float> out) {
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = 0.02f * static_cast<float>((i * 7 + p.numel) % 13) - 0.1f;
}

}  // namespace

TEST_CASE("autotune runs what fits and keeps the fastest", "[autotune][mpi]") {
  Context& ctx = *Context::current();
  const int world = ctx.world_size();
  const plan::GptShape shape{"", 2, 2, 64, 32, 256};
  std::string y = "train_batch_size: " + std::to_string(4 * world) + "\ntrain_micro_batch_size_per_gpu: 2\n";
  y += "zero_optimization:\n  stage: 0\nbf16:\n  enabled: true\n";
  y += "optimizer:\n  type: AdamW\n  params:\n    lr: 0.001\n";
  const Config base = parse_config(y, "test_autotune");

  // A GPU just large enough for stage 2 at micro-batch 2: bigger micro-batches or less sharding
  // need more, so the planner rules some candidates out.
  plan::Cluster cluster;
  cluster.gpu = plan::gpu_preset("A100-80GB");
  cluster.gpus = world;
  plan::Settings s2;
  s2.stage = 2;
  s2.micro_batch = 2;
  cluster.gpu.memory_bytes = static_cast<double>(plan::make_plan(shape, cluster, s2).memory.gpu_bytes);

  auto candidates = tune_grid({0, 2, 3}, {1, 2, 4});
  candidates.push_back(TuneCandidate{2, 3, {}, {}, {}, {}, {}, {}, {}, {}, {}});  // 3 does not divide 4 per rank
  const auto dir = std::filesystem::temp_directory_path() / ("zero_autotune_np" + std::to_string(world));
  std::filesystem::create_directories(dir);
  TuneOptions opt;
  opt.warmup_steps = 1;
  opt.timed_steps = 2;
  opt.fits = plan_fits(shape, cluster);
  opt.config_out = (dir / "best.yaml").string();
  opt.table_out = (dir / "trials.txt").string();
  TuneResult r = autotune(ctx, base, plan::gpt_layout(shape), init, train_step, candidates, opt);

  REQUIRE(r.trials.size() == candidates.size());
  int timed = 0, unfit = 0;
  for (std::size_t i = 0; i + 1 < r.trials.size(); ++i) {
    const TuneTrial& t = r.trials[i];
    plan::Settings s;
    s.stage = *t.candidate.stage;
    s.micro_batch = static_cast<int>(*t.candidate.micro_batch);
    s.grad_accum = 4 / s.micro_batch;
    // The trials run on the host backend, which accumulates bf16 gradients in bf16 (a plan on
    // its own assumes the CUDA backend's fp32 with accumulation).
    s.grad_accum_dtype = GradAccumDType::bf16;
    // As the trials' configs have it: the base config's default for its stage 0 (off), which a
    // candidate's stage does not change. With accumulation it would keep a micro-step's last
    // bucket in flight into the next, which the plan counts.
    s.overlap_comm = false;
    const bool fits = plan::make_plan(shape, cluster, s).fits;
    INFO(t.candidate.label() << ": " << t.note);
    CHECK((t.outcome == TuneTrial::Outcome::timed) == fits);
    CHECK((t.outcome == TuneTrial::Outcome::does_not_fit) == !fits);
    if (fits) {
      ++timed;
      CHECK(t.step_s > 0);
      CHECK(t.samples_per_s == Approx(4.0 * world / t.step_s));
      CHECK(r.best_trial.step_s <= t.step_s);
    } else {
      ++unfit;
      CHECK_THAT(t.note, Catch::Contains("GPU memory"));
    }
  }
  CHECK(timed >= 2);
  CHECK(unfit >= 2);
  CHECK(r.trials.back().outcome == TuneTrial::Outcome::failed);
  CHECK_THAT(r.trials.back().note, Catch::Contains("do not divide"));

  REQUIRE(r.found);
  CHECK(r.trials[static_cast<std::size_t>(r.best_index)].step_s == r.best_trial.step_s);
  CHECK(r.best.zero_optimization.stage == *r.best_trial.candidate.stage);
  CHECK(r.best.train_micro_batch_size_per_gpu == *r.best_trial.candidate.micro_batch);
  Config loaded = load_config(opt.config_out);
  CHECK(loaded.zero_optimization.stage == r.best.zero_optimization.stage);
  CHECK(loaded.train_micro_batch_size_per_gpu == r.best.train_micro_batch_size_per_gpu);
  CHECK(loaded.train_batch_size == 4 * world);
  std::ifstream table(opt.table_out);
  std::stringstream text;
  text << table.rdbuf();
  for (const auto& t : r.trials) CHECK_THAT(text.str(), Catch::Contains(t.candidate.label()));
  CHECK_THAT(text.str(), Catch::Contains("(best)"));
}

TEST_CASE("autotune tries ZeRO++ and MiCS variants of the candidates", "[autotune][mpi]") {
  Context& ctx = *Context::current();
  const int world = ctx.world_size();
  const auto candidates = with_zero_plus_plus(tune_grid({2, 3}, {1}), 0, world);
  // stage 2, then qgZ and MiCS; stage 3, then qwZ, hpZ, both, the three with qgZ, and MiCS (hpZ
  // and MiCS only where the group has 2 ranks or more).
  std::vector<std::string> labels;
  for (const auto& c : candidates) labels.push_back(c.label());
  const std::string w = std::to_string(world);
  if (world > 1)
    CHECK(labels == std::vector<std::string>{"stage 2, mb 1", "stage 2, mb 1, qgz", "stage 2, mb 1, mics " + w,
                                             "stage 3, mb 1", "stage 3, mb 1, qwz", "stage 3, mb 1, hpz " + w,
                                             "stage 3, mb 1, hpz " + w + ", qwz",
                                             "stage 3, mb 1, hpz " + w + ", qwz, qgz", "stage 3, mb 1, mics " + w});
  else
    CHECK(labels == std::vector<std::string>{"stage 2, mb 1", "stage 2, mb 1, qgz", "stage 3, mb 1",
                                             "stage 3, mb 1, qwz", "stage 3, mb 1, qwz, qgz"});
  // An unset stage follows the base's: stage 1 gets MiCS only, stage 0 nothing.
  CHECK(with_zero_plus_plus({TuneCandidate{}}, 3, 2).size() == 6);
  CHECK(with_zero_plus_plus({TuneCandidate{}}, 2, 2).size() == 3);
  CHECK(with_zero_plus_plus({TuneCandidate{}}, 1, 2).size() == 2);
  CHECK(with_zero_plus_plus({TuneCandidate{}}, 0, 2).size() == 1);
  // With a tensor-parallel grid: no qgZ and no MiCS (the engine refuses both there).
  TuneCandidate tp;
  tp.tensor_parallel = 2;
  CHECK(with_zero_plus_plus({tp}, 3, 2).size() == 4);
  CHECK(with_zero_plus_plus({tp}, 2, 2).size() == 1);

  const plan::GptShape shape{"", 2, 2, 64, 32, 256};
  std::string y = "train_batch_size: " + std::to_string(2 * world) + "\ntrain_micro_batch_size_per_gpu: 1\n";
  y += "zero_optimization:\n  stage: 0\n  stage3_param_persistence_threshold: 100\n";
  y += "optimizer:\n  type: AdamW\n  params:\n    lr: 0.001\n";
  const auto dir = std::filesystem::temp_directory_path() / ("zero_autotune_zpp_np" + std::to_string(world));
  std::filesystem::create_directories(dir);
  TuneOptions opt;
  opt.timed_steps = 1;
  opt.config_out = (dir / "best.yaml").string();
  TuneResult r =
      autotune(ctx, parse_config(y, "test_autotune"), plan::gpt_layout(shape), init, train_step, candidates, opt);
  for (const auto& t : r.trials) {
    INFO(t.candidate.label() << ": " << t.note);
    CHECK(t.outcome == TuneTrial::Outcome::timed);
  }
  REQUIRE(r.found);
  // The winner's file carries its ZeRO++ settings.
  const Config loaded = load_config(opt.config_out);
  CHECK(loaded.zero_optimization.zero_hpz_partition_size == r.best_trial.candidate.hpz_partition_size.value_or(1));
  CHECK(loaded.zero_optimization.zero_quantized_weights == r.best_trial.candidate.quantized_weights.value_or(false));
  CHECK(loaded.zero_optimization.zero_quantized_gradients ==
        r.best_trial.candidate.quantized_gradients.value_or(false));
  CHECK(loaded.zero_optimization.mics_shard_size == r.best_trial.candidate.mics_shard_size.value_or(-1));
}

TEST_CASE("autotune grids: with_grids, refused sizes, the whole-model entry points", "[autotune][mpi]") {
  Context& ctx = *Context::current();
  const int world = ctx.world_size();
  // The grid varies slowest; an empty list keeps the base's size (unset).
  const auto c = with_grids(tune_grid({0, 1}, {}), {1, 2}, {});
  REQUIRE(c.size() == 4);
  CHECK(c[0].label() == "stage 0, tp 1");
  CHECK(c[1].label() == "stage 1, tp 1");
  CHECK(c[3].label() == "stage 1, tp 2");
  CHECK_FALSE(c[3].pipeline_parallel);
  CHECK(c[3].grid({1, 3}).tensor == 2);
  CHECK(c[3].grid({1, 3}).pipeline == 3);

  const plan::GptShape shape{"", 2, 2, 64, 32, 256};
  std::string y = "train_batch_size: " + std::to_string(2 * world) + "\ntrain_micro_batch_size_per_gpu: 1\n";
  y += "optimizer:\n  type: AdamW\n  params:\n    lr: 0.001\n";
  // tp 1 runs; tp <world> needs groups, which autotune() does not build; tp <world + 1> does not
  // divide the ranks.
  const auto candidates = with_grids(tune_grid({0}, {}), {1, world, world + 1}, {});
  TuneOptions opt;
  opt.timed_steps = 1;
  TuneResult r =
      autotune(ctx, parse_config(y, "test_autotune"), plan::gpt_layout(shape), init, train_step, candidates, opt);
  REQUIRE(r.trials.size() == 3);
  CHECK(r.trials[0].outcome == TuneTrial::Outcome::timed);
  if (world > 1) {
    CHECK(r.trials[1].outcome == TuneTrial::Outcome::failed);
    CHECK_THAT(r.trials[1].note, Catch::Contains("use autotune_grid()"));
  }
  CHECK(r.trials[2].outcome == TuneTrial::Outcome::refused);
  CHECK_THAT(r.trials[2].note, Catch::Contains("does not divide the " + std::to_string(world) + " ranks"));
  CHECK(r.trials[2].grid.tensor == world + 1);
  CHECK_THAT(r.table(), Catch::Contains("stage 0, tp " + std::to_string(world + 1) + " | refused |"));
  REQUIRE(r.found);
  CHECK(r.best_index == 0);
}
