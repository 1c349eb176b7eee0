// The training loop's own controls over the step: the learning rate it sets (Engine::set_lr,
// scheduler.type: ManualLR), the gradient norm before the update (Engine::grad_norm) and what
// step() is told (StepOptions: skip, the loop's clip coefficient). Run at 1 and 2 ranks, every
// stage. And gradient_average, which leaves the division of the summed gradients to the loop.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>
#include <sstream>
#include <string>
#include <vector>

#include "engine_model.hpp"
#include "scratch_dir.hpp"
#include "zero/checkpoint.hpp"
#include "zero/context.hpp"
#include "zero/engine.hpp"
#include "zero/engine_state.hpp"

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
      for (int s = 0; s < kSteps; ++s)
        REQUIRE(w[static_cast<std::size_t>(s)] == -reference[static_cast<std::size_t>(s)]);
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
    const Config cfg =
        make_config(stage, "optimizer:\n  type: AdamW\n  params:\n    lr: 0.1\nscheduler:\n  type: ManualLR\n");
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
    {
      // zero-ckpt inspect prints the rate the loop set, and says so.
      std::ostringstream listing;
      REQUIRE(inspect_checkpoint(root + std::to_string(stage), listing));
      INFO(listing.str());
      const std::string text = listing.str(), label = "learning rate: ";
      const auto at = text.find(label);
      REQUIRE(at != std::string::npos);
      std::size_t used = 0;
      CHECK(std::stod(text.substr(at + label.size()), &used) == static_cast<double>(rate(4)));  // printed exactly
      CHECK(text.compare(at + label.size() + used, 35, " (set by the loop: Engine::set_lr)\n") == 0);
    }

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
    // It names the call and the key, not a source file an installed package does not have
    // (that only with ZERO_ERROR_SOURCE=1, for a bug report).
    REQUIRE_THROWS_WITH(e.set_lr(0.1), Contains("set_lr: scheduler.type") && !Contains("src/") && !Contains(".cpp"));
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

namespace {

const std::string kAdam =
    "optimizer:\n  type: AdamW\n  params:\n    lr: 0.01\n    betas: [0.9, 0.95]\n    weight_decay: 0.1\n";

Config model_config(int stage, const std::string& extra) {
  std::string y = "train_micro_batch_size_per_gpu: 2\ngradient_accumulation_steps: 2\n";
  y += "zero_optimization:\n  stage: " + std::to_string(stage) + "\n  stage3_param_persistence_threshold: 20\n";
  Config cfg = parse_config(y + kAdam + extra, "test_loop_hooks");
  cfg.resolve(ctx().world_size());
  return cfg;
}

Engine model_engine(const Config& cfg) {
  Engine e(ctx(), cfg, test::make_mixed_decay_layout());
  e.init_params(test::init_value);
  return e;
}

void accumulate(Engine& e, std::int64_t s) { test::accumulate(e, ctx().rank(), ctx().world_size(), s); }

// Everything an update changes, bit for bit: every unit's compute params and fp32 master, this
// rank's optimizer moments, and the counters.
struct Snapshot {
  std::vector<std::vector<float>> params, master, moments;
  std::int64_t step = 0, applied = 0;
  bool operator==(const Snapshot& o) const {
    auto same = [](const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
      if (a.size() != b.size()) return false;
      for (std::size_t i = 0; i < a.size(); ++i)
        if (a[i].size() != b[i].size() || std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)) != 0)
          return false;
      return true;
    };
    return same(params, o.params) && same(master, o.master) && same(moments, o.moments) && step == o.step &&
           applied == o.applied;
  }
};

Snapshot snapshot(Engine& e) {
  Snapshot s;
  EngineState st(e);
  for (int u = 0; u < e.layout().num_units(); ++u) {
    s.params.push_back(e.full_params(u));
    s.master.push_back(e.full_master(u));
    for (int k = 1; k <= st.optimizer_moments(); ++k) {
      std::vector<float> m(static_cast<std::size_t>(st.owned_range(u).len));
      st.read_owned(u, k, m.data());
      s.moments.push_back(std::move(m));
    }
  }
  s.step = st.training_state().step;
  s.applied = st.training_state().applied;
  return s;
}

// The norm of the step's averaged gradient, computed here from the model's formula for every
// rank's micro-batches (all ranks' samples are known everywhere), in double.
double reference_norm(Engine& e, std::int64_t s) {
  const int world = ctx().world_size();
  const int gas = static_cast<int>(e.config().gradient_accumulation_steps);
  const int micro = static_cast<int>(e.config().train_micro_batch_size_per_gpu);
  double sumsq = 0.0;
  for (int u = 0; u < e.layout().num_units(); ++u) {
    const std::vector<float> w = e.full_params(u);
    std::vector<double> mean(w.size(), 0.0);
    for (int r = 0; r < world; ++r)
      for (int k = 0; k < gas; ++k) {
        const std::vector<float> g = test::micro_grad(u, w, s, k, r, world, gas, micro);
        for (std::size_t i = 0; i < g.size(); ++i) mean[i] += g[i] / static_cast<double>(gas * world);
      }
    for (double m : mean) sumsq += m * m;
  }
  return std::sqrt(sumsq);
}

}  // namespace

TEST_CASE("the norm before the update is the norm step() reports") {
  for (int stage = 0; stage <= 3; ++stage) {
    INFO("stage " << stage);
    Engine e = model_engine(model_config(stage, ""));
    for (int s = 0; s < 3; ++s) {
      const double expected = reference_norm(e, s);
      accumulate(e, s);
      const GradNorm n = e.grad_norm();
      REQUIRE_FALSE(n.overflow);
      REQUIRE(n.norm == Approx(expected).epsilon(1e-5));
      REQUIRE(e.grad_norm().norm == n.norm);  // asked twice: the same value
      const StepResult r = e.step();
      REQUIRE(r.grad_norm == n.norm);
      REQUIRE_FALSE(r.skipped);
    }
  }
}

TEST_CASE("a step the loop skips leaves parameters and optimizer state bit-identical") {
  for (int stage = 0; stage <= 3; ++stage) {
    INFO("stage " << stage);
    const Config cfg = model_config(stage, "");
    Engine e = model_engine(cfg);
    test::train(e, ctx().rank(), ctx().world_size(), 0, 2);
    const Snapshot before = snapshot(e);
    accumulate(e, 7);  // an outlier batch
    REQUIRE(e.grad_norm().norm > 0.0);
    const StepResult r = e.step({.skip = true});
    CHECK(r.skipped);
    CHECK_FALSE(r.overflow);
    CHECK(r.step == 3);
    Snapshot after = snapshot(e);
    // As DeepSpeed's overflow skip: the step counter moves on, Adam's step count does not.
    REQUIRE(after.step == before.step + 1);
    after.step = before.step;
    REQUIRE(after == before);
    // The run goes on as if the skipped batch had never come: equal to a run without it.
    test::train(e, ctx().rank(), ctx().world_size(), 2, 2);
    Engine plain = model_engine(cfg);
    test::train(plain, ctx().rank(), ctx().world_size(), 0, 4);
    Snapshot a = snapshot(e), b = snapshot(plain);
    REQUIRE(a.step == b.step + 1);
    a.step = b.step;
    REQUIRE(a == b);
  }
}

TEST_CASE("a skipped step can count for the optimizer and the schedule, as llm.c's loop does") {
  for (int stage : {0, 2, 3}) {
    INFO("stage " << stage);
    const Config cfg = model_config(stage, "");
    Engine e = model_engine(cfg);
    test::train(e, ctx().rank(), ctx().world_size(), 0, 2);
    const Snapshot before = snapshot(e);
    accumulate(e, 7);
    const StepResult r = e.step({.skip = true, .skip_counts = true});
    CHECK(r.skipped);
    Snapshot after = snapshot(e);
    // Adam's step count moves on with the step counter; parameters and moments stay.
    REQUIRE(after.step == before.step + 1);
    REQUIRE(after.applied == before.applied + 1);
    after.step = before.step;
    after.applied = before.applied;
    REQUIRE(after == before);
    // The next update is Adam's update number 4 (bias corrections of t = 4), not 3: it differs
    // from the update of a run that skipped without counting.
    Engine uncounted = model_engine(cfg);
    test::train(uncounted, ctx().rank(), ctx().world_size(), 0, 2);
    accumulate(uncounted, 7);
    uncounted.step({.skip = true});
    test::train(e, ctx().rank(), ctx().world_size(), 2, 1);
    test::train(uncounted, ctx().rank(), ctx().world_size(), 2, 1);
    CHECK_FALSE(snapshot(e).master == snapshot(uncounted).master);
    CHECK(snapshot(e).applied == snapshot(uncounted).applied + 1);
  }
  Engine e = model_engine(model_config(1, ""));
  test::train(e, ctx().rank(), ctx().world_size(), 0, 1);
  accumulate(e, 1);
  REQUIRE_THROWS_WITH(e.step({.skip_counts = true}), Contains("skip_counts applies to a skipped step"));
}

TEST_CASE("the loop's clip coefficient gives the result of the equivalent gradient_clipping") {
  constexpr double kClip = 0.05;
  for (int stage = 0; stage <= 3; ++stage) {
    INFO("stage " << stage);
    Engine by_config = model_engine(model_config(stage, "gradient_clipping: 0.05\n"));
    Engine by_loop = model_engine(model_config(stage, ""));
    Engine unclipped = model_engine(model_config(stage, ""));
    int clipped_steps = 0;
    for (int s = 0; s < 3; ++s) {
      accumulate(by_config, s);
      by_config.step();
      accumulate(by_loop, s);
      const double norm = by_loop.grad_norm().norm;
      // DeepSpeed's (and PyTorch's clip_grad_norm_) coefficient.
      const double coef = std::min(1.0, kClip / (norm + 1e-6));
      clipped_steps += coef < 1.0;
      by_loop.step({.clip_coefficient = coef});
      test::train(unclipped, ctx().rank(), ctx().world_size(), s, 1);
    }
    REQUIRE(clipped_steps > 0);
    REQUIRE(snapshot(by_loop) == snapshot(by_config));
    REQUIRE_FALSE(snapshot(unclipped) == snapshot(by_config));
  }
}

TEST_CASE("the overflow flag is known before step(), which then skips") {
  for (int stage = 0; stage <= 3; ++stage) {
    INFO("stage " << stage);
    Engine e = model_engine(model_config(stage, "fp16:\n  enabled: true\n  initial_scale_power: 4\n"));
    test::train(e, ctx().rank(), ctx().world_size(), 0, 1);
    const Snapshot before = snapshot(e);
    const int n = e.layout().num_units();
    for (int k = 0; k < 2; ++k) {
      for (int u = 0; u < n; ++u) e.gather(u);
      for (int u = n - 1; u >= 0; --u) {
        auto p = e.gather(u);
        auto g = e.grads(u);
        // One rank's gradient overflows: every rank must see it.
        if (u == 2 && k == 1 && ctx().rank() == ctx().world_size() - 1)
          g[0].add(0, std::numeric_limits<float>::infinity());
        e.reduce(u);
      }
    }
    const GradNorm norm = e.grad_norm();
    REQUIRE(norm.overflow);
    const StepResult r = e.step();
    CHECK(r.overflow);
    CHECK(r.skipped);
    Snapshot after = snapshot(e);
    after.step = before.step;
    REQUIRE(after == before);
  }
}

TEST_CASE("the norm and step options: misuse is an error that says what to do") {
  Engine e = model_engine(model_config(2, ""));
  SECTION("the norm before every unit was reduced") {
    for (int u = 0; u < e.layout().num_units(); ++u) e.gather(u);
    REQUIRE_THROWS_WITH(e.grad_norm(), Contains("grad_norm() called before every unit was reduced"));
  }
  SECTION("a clip coefficient that is not a finite number >= 0") {
    accumulate(e, 0);
    REQUIRE_THROWS_WITH(e.step({.clip_coefficient = -0.5}), Contains("clip_coefficient -0.5"));
  }
  if (ctx().world_size() > 1) {
    SECTION("ranks that decide differently") {
      accumulate(e, 0);
      REQUIRE_THROWS_WITH(e.step({.skip = ctx().rank() == 0}), Contains("disagree") && Contains("skip"));
    }
  }
}

TEST_CASE("gradient_average leaves the division to the loop with identical results") {
  // Accumulation 2 and 1 or 2 ranks: dividing by them is exact, so every way to average must
  // give the same bits.
  const int world = ctx().world_size(), gas = 2;
  for (int stage = 0; stage <= 3; ++stage) {
    INFO("stage " << stage);
    Engine libzero_divides = model_engine(model_config(stage, "gradient_clipping: 0.05\n"));
    Engine loop_divides_steps = model_engine(model_config(stage, "gradient_clipping: 0.05\ngradient_average: ranks\n"));
    Engine loop_divides_all = model_engine(model_config(stage, "gradient_clipping: 0.05\ngradient_average: none\n"));
    Engine loop_divides_twice = model_engine(model_config(stage, "gradient_clipping: 0.05\n"));
    for (int s = 0; s < 3; ++s) {
      accumulate(libzero_divides, s);
      test::accumulate(loop_divides_steps, ctx().rank(), world, s, static_cast<float>(gas));
      test::accumulate(loop_divides_all, ctx().rank(), world, s, static_cast<float>(gas * world));
      test::accumulate(loop_divides_twice, ctx().rank(), world, s, static_cast<float>(gas));
      const double norm = libzero_divides.grad_norm().norm;
      REQUIRE(loop_divides_steps.grad_norm().norm == norm);
      REQUIRE(loop_divides_all.grad_norm().norm == norm);
      // The pattern the setting is for: a loop that divides and leaves the default divides twice.
      REQUIRE(loop_divides_twice.grad_norm().norm == Approx(norm / gas));
      libzero_divides.step();
      loop_divides_steps.step();
      loop_divides_all.step();
      loop_divides_twice.step();
    }
    const Snapshot expected = snapshot(libzero_divides);
    REQUIRE(snapshot(loop_divides_steps) == expected);
    REQUIRE(snapshot(loop_divides_all) == expected);
    REQUIRE_FALSE(snapshot(loop_divides_twice) == expected);
  }
}
