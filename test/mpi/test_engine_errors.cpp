// Overflow handling, memory accounting and misuse errors of the engine.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <string>

#include "engine_model.hpp"
#include "zero/context.hpp"
#include "zero/engine.hpp"

using namespace zero;
using namespace zero::test;

namespace {

Config config(const std::string& yaml) {
  Config c = parse_config(yaml, "test_engine_errors");
  c.resolve(Context::current()->world_size());
  return c;
}

// One micro-step of the test model; `poison` writes +inf into the first gradient element.
void micro_step(Engine& e, int step, bool poison) {
  int n = e.layout().num_units();
  int world = Context::current()->world_size(), rank = Context::current()->rank();
  for (int u = 0; u < n; ++u) e.gather(u);
  for (int u = n - 1; u >= 0; --u) {
    auto p = e.gather(u);
    auto g = e.grads(u);
    auto t = g[0];
    for (std::int64_t i = 0; i < t.numel; ++i)
      t.add(i, e.loss_scale() * sample_grad(u, i, step * 100 + rank, p[0].get(i)));
    if (poison && u == 0) t.set(0, std::numeric_limits<float>::infinity());
    (void)world;
    e.reduce(u);
  }
}

}  // namespace

TEST_CASE("an overflow on one rank makes every rank skip; the scale honours hysteresis") {
  Context& ctx = *Context::current();
  Engine e(ctx,
           config("fp16:\n  enabled: true\n  initial_scale_power: 8\n  hysteresis: 2\n"
                  "zero_optimization:\n  stage: 2\n"),
           make_layout());
  e.init_params(init_value);
  int last = ctx.world_size() - 1;

  micro_step(e, 0, false);
  StepResult r0 = e.step();
  REQUIRE_FALSE(r0.skipped);
  REQUIRE(r0.loss_scale == 256.0);
  auto before = e.full_params(1);

  micro_step(e, 1, ctx.rank() == last);  // overflow on the last rank only
  StepResult r1 = e.step();
  REQUIRE(r1.skipped);                  // ... but every rank skips
  REQUIRE(e.full_params(1) == before);  // and nothing moved
  REQUIRE(e.loss_scale() == 256.0f);    // hysteresis 2: the first overflow is absorbed

  micro_step(e, 2, ctx.rank() == last);
  StepResult r2 = e.step();
  REQUIRE(r2.skipped);
  REQUIRE(e.loss_scale() == 128.0f);  // the second halves the scale

  micro_step(e, 3, false);
  StepResult r3 = e.step();
  REQUIRE_FALSE(r3.skipped);
  REQUIRE(r3.loss_scale == 128.0);
  REQUIRE(e.full_params(1) != before);
}

TEST_CASE("overflow at the minimum loss scale is reported clearly") {
  Context& ctx = *Context::current();
  Engine e(ctx, config("fp16:\n  enabled: true\n  initial_scale_power: 2\n  hysteresis: 1\n  min_loss_scale: 4\n"),
           make_layout());
  e.init_params(init_value);
  micro_step(e, 0, true);
  REQUIRE_THROWS_WITH(e.step(), Catch::Contains("minimum loss scale") && Catch::Contains("diverged"));
}

TEST_CASE("memory report equals the ZeRO formula for every stage") {
  Context& ctx = *Context::current();
  const double N = ctx.world_size();
  for (int stage = 0; stage <= 3; ++stage) {
    Engine e(ctx,
             config("bf16:\n  enabled: true\nzero_optimization:\n  stage: " + std::to_string(stage) +
                    "\n  stage3_param_persistence_threshold: 0\n"),
             make_layout());
    e.init_params(init_value);
    double psi = 0;  // padded Ψ: the formula holds exactly on the padded sizes
    for (int u = 0; u < e.layout().num_units(); ++u)
      psi += static_cast<double>(e.layout().padded_numel(u, ctx.world_size()));
    double expect = stage == 0   ? 16 * psi
                    : stage == 1 ? 4 * psi + 12 * psi / N
                    : stage == 2 ? 2 * psi + 14 * psi / N
                                 : 16 * psi / N;
    MemoryReport m = e.memory();
    INFO("stage " << stage << ": " << m.to_string());
    REQUIRE(static_cast<double>(m.model_state()) == expect);
    REQUIRE(static_cast<double>(m.master) == (stage == 0 ? 4 * psi : 4 * psi / N));
  }
}

TEST_CASE("misuse gives clear errors") {
  Context& ctx = *Context::current();
  SECTION("reduce twice in one micro-step") {
    Engine e(ctx, config("zero_optimization:\n  stage: 2\n"), make_layout());
    e.init_params(init_value);
    {
      auto p = e.gather(4);
      e.grads(4);
    }
    e.reduce(4);
    REQUIRE_THROWS_WITH(e.reduce(4), Catch::Contains("'big' was reduced twice"));
  }
  SECTION("step before every unit was reduced") {
    Engine e(ctx, config("zero_optimization:\n  stage: 1\n"), make_layout());
    e.init_params(init_value);
    e.reduce(4);
    e.reduce(3);
    REQUIRE_THROWS_WITH(e.step(),
                        Catch::Contains("before every unit was reduced") && Catch::Contains("embed, layer0, layer1"));
  }
  SECTION("a gather order that changed") {
    Engine e(ctx, config("zero_optimization:\n  stage: 3\n  stage3_param_persistence_threshold: 0\n"), make_layout());
    e.init_params(init_value);
    micro_step(e, 0, false);
    e.step();
    REQUIRE_THROWS_WITH(e.gather(1), Catch::Contains("gather order changed") && Catch::Contains("'layer0'") &&
                                         Catch::Contains("'embed'"));
  }
  SECTION("a gather_all handle alive at grads(), reduce() and step() is named, at every stage") {
    // The loop never called set_eval: the message must name the handle that put the engine in
    // eval mode, not the mode.
    for (int stage = 0; stage <= 3; ++stage) {
      INFO("stage " << stage);
      Engine e(ctx, config("zero_optimization:\n  stage: " + std::to_string(stage) + "\n"), make_layout());
      e.init_params(init_value);
      GatheredModel held = e.gather_all();
      // Catch's combined matchers hold references: each assertion builds its own.
      const std::string held_msg = "a GatheredModel from Engine::gather_all() is still alive";
      for (const char* call : {"grads()", "reduce()", "step()"}) {
        INFO(call);
        const auto run = [&] {
          if (call[0] == 'g')
            e.grads(4);
          else if (call[0] == 'r')
            e.reduce(4);
          else
            e.step();
        };
        REQUIRE_THROWS_WITH(run(),
                            Catch::Contains(std::string(call) + ": " + held_msg) && !Catch::Contains("set_eval(true)"));
      }
      REQUIRE_THROWS_WITH(e.set_eval(false), Catch::Contains("GatheredModel"));
      held.release();
      micro_step(e, 0, false);
      REQUIRE_FALSE(e.step().skipped);
    }
  }
  SECTION("an unknown unit") {
    Engine e(ctx, config("zero_optimization:\n  stage: 0\n"), make_layout());
    e.init_params(init_value);
    REQUIRE_THROWS_WITH(e.gather(99), Catch::Contains("unknown unit id 99"));
    REQUIRE_THROWS_WITH(e.gather("layr0"), Catch::Contains("did you mean 'layer0'"));
    REQUIRE_THROWS_WITH(e.grads(-1), Catch::Contains("unknown unit id -1"));
    e.set_stream(nullptr);  // the host backend has no streams: null is fine, anything else is not
    int dummy = 0;
    REQUIRE_THROWS_WITH(e.set_stream(&dummy), Catch::Contains("has no streams"));
  }
  SECTION("rank-dependent initial values") {
    if (ctx.world_size() > 1) {
      Engine e(ctx, config("zero_optimization:\n  stage: 1\n"), make_layout());
      REQUIRE_THROWS_WITH(e.init_params([&](const ParamInfo&, std::span<float> v) {
        for (auto& x : v) x = static_cast<float>(ctx.rank());
      }),
                          Catch::Contains("different initial values on different ranks"));
    }
  }
  SECTION("a NaN initial value is reported as NaN, on every rank, not as a difference") {
    Engine e(ctx, config("zero_optimization:\n  stage: 1\n"), make_layout());
    auto nan_at_3 = [](const ParamInfo& p, std::span<float> v) {
      for (std::size_t k = 0; k < v.size(); ++k) v[k] = 0.01f * static_cast<float>(k);
      if (p.unit == "layer0" && p.name == "b") v[3] = std::numeric_limits<float>::quiet_NaN();
    };
    REQUIRE_THROWS_WITH(e.init_params(nan_at_3),
                        Catch::Contains("parameter 'b' of unit 'layer0' has the initial value nan at index 3, which "
                                        "is not finite") &&
                            !Catch::Contains("different initial values"));
  }
  SECTION("a NaN on one rank only: that rank names it, the others point at it") {
    if (ctx.world_size() > 1) {
      Engine e(ctx, config("zero_optimization:\n  stage: 2\n"), make_layout());
      const bool mine = ctx.rank() == 1;
      auto init = [&](const ParamInfo& p, std::span<float> v) {
        for (auto& x : v) x = 0.5f;
        if (mine && p.unit == "head") v[5] = -std::numeric_limits<float>::infinity();
      };
      REQUIRE_THROWS_WITH(e.init_params(init),
                          (mine ? Catch::Contains("parameter 'w' of unit 'head' has the initial value -inf at index 5")
                                : Catch::Contains("unit 'head' got initial values that are not finite or out of range "
                                                  "on 1 other rank(s)")) &&
                              !Catch::Contains("different initial values"));
    }
  }
  SECTION("a finite value the parameter dtype cannot hold") {
    auto big_at_7 = [](const ParamInfo& p, std::span<float> v) {
      for (auto& x : v) x = 0.25f;
      if (p.unit == "embed" && p.name == "w") v[7] = 3e38f;
    };
    Engine f16(ctx, config("fp16:\n  enabled: true\n"), make_layout());
    REQUIRE_THROWS_WITH(f16.init_params(big_at_7),
                        Catch::Contains("parameter 'w' of unit 'embed' has the initial value 3e+38 at index 7, which "
                                        "the run's fp16 parameters cannot hold"));
    // fp32 holds it, and so does bf16 (its range is fp32's): both accept it.
    Engine f32(ctx, config("zero_optimization:\n  stage: 1\n"), make_layout());
    REQUIRE_NOTHROW(f32.init_params(big_at_7));
    Engine b16(ctx, config("bf16:\n  enabled: true\n"), make_layout());
    REQUIRE_NOTHROW(b16.init_params(big_at_7));
  }
}
