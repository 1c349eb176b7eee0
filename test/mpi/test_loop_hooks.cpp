// The training loop's own controls over the step: the learning rate it sets (Engine::set_lr,
// scheduler.type: ManualLR), run at 1 and 2 ranks and every stage.
#include <catch2/catch.hpp>

#include <cmath>
#include <numbers>
#include <string>
#include <vector>

#include "scratch_dir.hpp"
#include "zero/checkpoint.hpp"
#include "zero/context.hpp"
#include "zero/engine.hpp"

using namespace zero;
using Catch::Matchers::Contains;

namespace {

Context& ctx() { return *Context::current(); }

Config make_config(int stage, const std::string& extra) {
  std::string y = "train_micro_batch_size_per_gpu: 1\ngradient_accumulation_steps: 1\n";
  y += "zero_optimization:\n  stage: " + std::to_string(stage) + "\n  stage3_param_persistence_threshold: 0\n";
  y += extra;
  Config cfg = parse_config(y, "test_loop_hooks");
  cfg.resolve(ctx().world_size());
  return cfg;
}

const std::string kSgd = "optimizer:\n  type: SGD\n  params:\n    lr: 0.5\n    momentum: 0.0\n    weight_decay: 0.0\n";

// llm.c's learning rate (train_gpt2.cu, get_learning_rate), in float as there: a linear warmup
// that starts at lr * 1/warmup, then a cosine from lr down to lr * final_frac.
float llmc_lr(int step, float lr, int warmup, int total, float final_frac) {
  if (step < warmup) return lr * static_cast<float>(step + 1) / static_cast<float>(warmup);
  const float decay = static_cast<float>(step - warmup) / static_cast<float>(total - warmup);
  const float coeff = 0.5f * (1.0f + std::cos(static_cast<float>(std::numbers::pi) * decay));
  const float min_lr = lr * final_frac;
  return min_lr + coeff * (lr - min_lr);
}

// One step whose only gradient is 1 at element `hot` of the single unit (on every rank, so the
// average is 1 as well): with plain SGD from zero, that element ends at exactly -lr.
StepResult one_hot_step(Engine& e, std::int64_t hot) {
  e.gather(0);
  {
    auto p = e.gather(0);
    auto g = e.grads(0);
    g[0].add(hot, e.loss_scale());
  }
  e.reduce(0);
  return e.step();
}

Engine make_engine(const Config& cfg, std::int64_t n) {
  Layout l;
  l.add_unit("w", {{"w", {n}}});
  Engine e(ctx(), cfg, l);
  e.init_params([](const ParamInfo&, std::span<float> out) {
    for (auto& x : out) x = 0.0f;
  });
  return e;
}

}  // namespace

TEST_CASE("a cosine schedule with warmup set from the loop is the rate the optimizer applies") {
  constexpr int kSteps = 12, kWarmup = 3;
  std::vector<float> reference;
  for (int s = 0; s < kSteps; ++s) reference.push_back(llmc_lr(s, 6e-4f, kWarmup, kSteps, 0.1f));
  // The shape llm.c intends: the first update already moves, the peak is reached at the end of
  // the warmup and held one step, then the cosine descends towards lr * final_frac.
  REQUIRE(reference[0] == Approx(2e-4));
  REQUIRE(reference[kWarmup - 1] == Approx(6e-4));
  REQUIRE(reference[kWarmup] == Approx(6e-4));
  REQUIRE(reference[kSteps - 1] == Approx(6e-5 + 5.4e-4 * 0.5 * (1 + std::cos(std::numbers::pi * 8 / 9))));

  for (int stage = 0; stage <= 3; ++stage) {
    for (const char* sched : {"", "scheduler:\n  type: ManualLR\n"}) {
      INFO("stage " << stage << (*sched ? " ManualLR" : " no scheduler"));
      Engine e = make_engine(make_config(stage, kSgd + sched), kSteps + 3);
      for (int s = 0; s < kSteps; ++s) {
        e.set_lr(reference[static_cast<std::size_t>(s)]);
        REQUIRE(e.lr() == static_cast<double>(reference[static_cast<std::size_t>(s)]));
        const StepResult r = one_hot_step(e, s);
        REQUIRE_FALSE(r.skipped);
        REQUIRE(r.lr == static_cast<double>(reference[static_cast<std::size_t>(s)]));
      }
      const std::vector<float> w = e.full_master(0);
      for (int s = 0; s < kSteps; ++s) REQUIRE(w[static_cast<std::size_t>(s)] == -reference[static_cast<std::size_t>(s)]);
      // The rate stays until the loop sets another.
      REQUIRE(one_hot_step(e, kSteps).lr == static_cast<double>(reference.back()));
      REQUIRE(e.full_master(0)[kSteps] == -reference.back());
    }
  }
}

TEST_CASE("without a scheduler the loop's rate replaces optimizer.params.lr from set_lr on") {
  Engine e = make_engine(make_config(1, kSgd), 3);
  REQUIRE(e.lr() == 0.5);
  REQUIRE(one_hot_step(e, 0).lr == 0.5);
  e.set_lr(0.25);
  REQUIRE(one_hot_step(e, 1).lr == 0.25);
  const std::vector<float> w = e.full_master(0);
  CHECK(w[0] == -0.5f);
  CHECK(w[1] == -0.25f);
  CHECK(w[2] == 0.0f);
}

TEST_CASE("the loop's rate is kept by checkpoints and a resumed run continues bit for bit") {
  const std::string root = test::process_scratch_dir("loop_lr") + "/ckpt";
  for (int stage : {0, 3}) {
    INFO("stage " << stage);
    const Config cfg = make_config(stage, "optimizer:\n  type: AdamW\n  params:\n    lr: 0.1\nscheduler:\n  type: ManualLR\n");
    auto rate = [](int s) { return llmc_lr(s, 0.01f, 2, 8, 0.1f); };
    auto train = [&](Engine& e, int from, int to) {
      for (int s = from; s < to; ++s) {
        e.set_lr(rate(s));
        one_hot_step(e, s % 5);
      }
    };
    Engine a = make_engine(cfg, 5);
    train(a, 0, 4);
    a.set_lr(rate(4));  // set for the next step, then saved before it
    save_checkpoint(a, root + std::to_string(stage));

    Engine b = make_engine(cfg, 5);
    REQUIRE(std::isnan(b.lr()));  // ManualLR and nothing set yet
    load_checkpoint(b, root + std::to_string(stage));
    REQUIRE(b.lr() == static_cast<double>(rate(4)));
    // Step 4 without set_lr in either run: both use the rate the loop set before the save.
    REQUIRE(one_hot_step(a, 4).lr == one_hot_step(b, 4).lr);
    train(a, 5, 8);
    train(b, 5, 8);
    REQUIRE(a.full_master(0) == b.full_master(0));
  }
}

TEST_CASE("the loop's rate: misuse is an error that says what to do") {
  SECTION("a DeepSpeed schedule owns the rate") {
    Engine e = make_engine(make_config(0, kSgd + "scheduler:\n  type: WarmupLR\n"), 2);
    REQUIRE_THROWS_WITH(e.set_lr(0.1), Contains("scheduler.type is WarmupLR") && Contains("ManualLR"));
  }
  SECTION("ManualLR needs a rate before the first step") {
    Engine e = make_engine(make_config(2, kSgd + "scheduler:\n  type: ManualLR\n"), 2);
    REQUIRE_THROWS_WITH(one_hot_step(e, 0), Contains("Engine::set_lr"));
  }
  SECTION("a rate that is not a finite number >= 0") {
    Engine e = make_engine(make_config(0, kSgd), 2);
    REQUIRE_THROWS_WITH(e.set_lr(-1.0), Contains("not a finite number >= 0"));
    REQUIRE_THROWS_WITH(e.set_lr(std::nan("")), Contains("not a finite number >= 0"));
  }
  SECTION("ManualLR takes no schedule parameters") {
    REQUIRE_THROWS_WITH(make_config(0, kSgd + "scheduler:\n  type: ManualLR\n  params:\n    warmup_num_steps: 10\n"),
                        Contains("does not apply to ManualLR"));
  }
  if (ctx().world_size() > 1) {
    SECTION("ranks that set different rates") {
      Engine e = make_engine(make_config(1, kSgd), 2);
      e.set_lr(ctx().rank() == 0 ? 0.1 : 0.2);
      REQUIRE_THROWS_WITH(one_hot_step(e, 0), Contains("disagree on the learning rate"));
    }
  }
}
