// The gradient audit (debug.audit_interval), on the engine-test model at the world size this
// test runs at (1-4 ranks), stages 0-3, fp32 and bf16, 1 and 2 micro-steps per step:
// - on every step, it passes a correct reduction and changes nothing: the norms equal those of
//   a run without it, bit for bit;
// - a reduction corrupted on purpose (ZERO_AUDIT_CORRUPT doubles one unit's reduced slice on
//   the first rank) stops the job on every rank with a message naming the unit and the step; with
//   an interval of 2 the first step is not audited and the second is;
// - it is refused next to the lossy reductions (PowerSGD, qgZ, OneBitAdam).
#include <catch2/catch.hpp>

#include <stdlib.h>

#include <string>
#include <vector>

#include "engine_model.hpp"
#include "zero/context.hpp"
#include "zero/engine.hpp"
#include "zero/error.hpp"

using namespace zero;
using namespace zero::test;

namespace {

Context& ctx() { return *Context::current(); }

std::string config_text(int stage, bool bf16, int gas, int audit) {
  std::string y = "train_micro_batch_size_per_gpu: 2\ngradient_accumulation_steps: " + std::to_string(gas) +
                  "\noptimizer:\n  type: AdamW\n  params:\n    lr: 0.01\n    betas: [0.9, 0.95]\n"
                  "zero_optimization:\n  stage: " +
                  std::to_string(stage) + "\n  reduce_bucket_size: 50\n";
  if (bf16) y += "bf16:\n  enabled: true\n";
  if (audit > 0) y += "debug:\n  audit_interval: " + std::to_string(audit) + "\n";
  return y;
}

Engine make_engine(int stage, bool bf16, int gas, int audit) {
  Config c = parse_config(config_text(stage, bf16, gas, audit), "test_grad_audit");
  c.resolve(ctx().world_size());
  Engine e(ctx(), c, make_layout());
  e.init_params(init_value);
  return e;
}

std::vector<double> norms(Engine& e, int steps) {
  std::vector<StepResult> r;
  train(e, ctx().rank(), ctx().world_size(), 0, steps, &r);
  std::vector<double> out;
  for (const auto& x : r) out.push_back(x.grad_norm);
  return out;
}

}  // namespace

TEST_CASE("gradient audit: a correct reduction passes and nothing changes", "[audit]") {
  for (int stage = 0; stage <= 3; ++stage)
    for (bool bf16 : {false, true})
      for (int gas : {1, 2}) {
        INFO("stage " << stage << (bf16 ? " bf16" : " fp32") << ", " << gas << " micro-step(s)");
        Engine plain = make_engine(stage, bf16, gas, 0);
        Engine audited = make_engine(stage, bf16, gas, 1);
        const auto a = norms(plain, 3), b = norms(audited, 3);
        REQUIRE(a == b);
      }
}

TEST_CASE("gradient audit: a corrupted reduction stops the job naming the unit", "[audit]") {
  const std::string unit = make_layout().unit(1).name;
  ::setenv("ZERO_AUDIT_CORRUPT", unit.c_str(), 1);
  for (int stage = 0; stage <= 3; ++stage)
    for (bool bf16 : {false, true}) {
      INFO("stage " << stage << (bf16 ? " bf16" : " fp32"));
      Engine e = make_engine(stage, bf16, 1, 1);
      REQUIRE_THROWS_WITH(norms(e, 1),
                          Catch::Contains("gradient audit (debug.audit_interval 1) at step 1: unit '" + unit + "'") &&
                              Catch::Contains("through a plain all-reduce of the ranks' local gradients") &&
                              Catch::Contains("the reduction is wrong"));
    }
  // Every second step: the first is not audited (the corruption passes), the second is.
  {
    Engine e = make_engine(2, false, 1, 2);
    REQUIRE(norms(e, 1).size() == 1);
    std::vector<StepResult> r;
    REQUIRE_THROWS_WITH(train(e, ctx().rank(), ctx().world_size(), 1, 1, &r),
                        Catch::Contains("(debug.audit_interval 2) at step 2: unit '" + unit + "'"));
  }
  ::unsetenv("ZERO_AUDIT_CORRUPT");
}

TEST_CASE("gradient audit: refused next to reductions that are lossy by design", "[audit]") {
  const std::string base = "train_micro_batch_size_per_gpu: 2\ndebug:\n  audit_interval: 5\n";
  REQUIRE_THROWS_WITH(parse_config(base + "zero_optimization:\n  stage: 1\ngradient_compression:\n  type: powersgd\n",
                                   "test_grad_audit"),
                      Catch::Contains("debug.audit_interval = 5 checks the reduced gradients against exact sums, but "
                                      "gradient_compression (PowerSGD)"));
  REQUIRE_THROWS_WITH(
      parse_config(base + "zero_optimization:\n  stage: 2\n  zero_quantized_gradients: true\n", "test_grad_audit"),
      Catch::Contains("zero_quantized_gradients (qgZ)") && Catch::Contains("set audit_interval: 0"));
  REQUIRE_THROWS_WITH(
      parse_config(base + "zero_optimization:\n  stage: 1\noptimizer:\n  type: OneBitAdam\n  params:\n    lr: 0.01\n",
                   "test_grad_audit"),
      Catch::Contains("OneBitAdam exchanges compressed momenta"));
}
