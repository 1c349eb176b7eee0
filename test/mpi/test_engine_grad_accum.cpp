// Gradient accumulation in bf16 against fp32 (data_types.grad_accum_dtype), at every stage and
// the world size this test runs at (1-4 ranks): the first of 64 micro-steps adds a large
// gradient (256) and the other 63 small ones (0.125 to 0.375). In bf16 (8 significant bits) the
// sum stays at 256, whose spacing is 2, so every small gradient is rounded away; in fp32 the sum
// is exact. After one plain SGD step (lr 1) the fp32 master is -(mean gradient): the fp32
// accumulation must match a double reference to fp32 precision, and the bf16 one must miss it by
// the lost 63 small gradients (which is what the fp32 default on the CUDA backend is for). The
// host optimizer of offload_optimizer: cpu steps from the fp32 gradients the same way.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "zero/context.hpp"
#include "zero/engine.hpp"

using namespace zero;

namespace {

Context& ctx() { return *Context::current(); }

constexpr int kMicroSteps = 64;
constexpr double kLarge = 256.0;

// Micro-step m's gradient of element i, the same on every rank (so the rank average is it).
double grad(int m, std::int64_t i) { return m == 0 ? kLarge : 0.125 * static_cast<double>(1 + i % 3); }

// The exact mean over the micro-steps, in double.
double mean_grad(std::int64_t i) {
  double s = 0.0;
  for (int m = 0; m < kMicroSteps; ++m) s += grad(m, i);
  return s / kMicroSteps;
}

struct Result {
  std::vector<float> master;
  std::int64_t grad_bytes = 0;
};

Result train_one_step(int stage, const std::string& accum, bool offload = false) {
  std::string y = "train_micro_batch_size_per_gpu: 1\ngradient_accumulation_steps: " + std::to_string(kMicroSteps) +
                  "\nbf16:\n  enabled: true\n";
  if (!accum.empty()) y += "data_types:\n  grad_accum_dtype: " + accum + "\n";
  y += "zero_optimization:\n  stage: " + std::to_string(stage) + "\n";
  if (offload) y += "  offload_optimizer:\n    device: cpu\n";
  y += "optimizer:\n  type: SGD\n  params:\n    lr: 1.0\n    momentum: 0.0\n    weight_decay: 0.0\n";
  Config cfg = parse_config(y, "test_engine_grad_accum");
  cfg.resolve(ctx().world_size());
  Layout l;
  l.add_unit("w", {{"w", {37}}});
  Engine e(ctx(), cfg, l);
  e.init_params([](const ParamInfo&, std::span<float> out) {
    for (auto& x : out) x = 0.0f;
  });
  for (int m = 0; m < kMicroSteps; ++m) {
    auto p = e.gather(0);
    auto g = e.grads(0);
    auto t = g[0];
    for (std::int64_t i = 0; i < t.numel; ++i) t.add(i, e.loss_scale() * static_cast<float>(grad(m, i)));
    e.reduce(0);
  }
  const StepResult r = e.step();
  REQUIRE_FALSE(r.skipped);
  return {e.full_master(0), e.memory().grads};
}

}  // namespace

TEST_CASE("fp32 gradient accumulation keeps what bf16 accumulation rounds away", "[engine][accum]") {
  const int world = ctx().world_size();
  for (int stage = 0; stage <= 3; ++stage) {
    INFO("stage " << stage << " at " << world << " ranks");
    // The host backend accumulates in the compute dtype unless asked (auto), as given here.
    const Result bf16 = train_one_step(stage, "");
    const Result explicit_bf16 = train_one_step(stage, "bf16");
    const Result fp32 = train_one_step(stage, "fp32");
    // The host optimizer (offload_optimizer: cpu) reads the fp32 gradients alike.
    const Result offloaded = stage >= 1 ? train_one_step(stage, "fp32", true) : fp32;
    REQUIRE(bf16.master.size() == 37);
    for (std::size_t i = 0; i < bf16.master.size(); ++i) {
      INFO("element " << i);
      const double exact = -mean_grad(static_cast<std::int64_t>(i));
      // fp32: the sum is exact (multiples of 1/8 below 2^11), so only the division rounds.
      REQUIRE(std::abs(fp32.master[i] - exact) <= 1e-6 * std::abs(exact));
      // bf16: the 63 small gradients are lost, and the result is the large one's mean alone.
      const double lost = -kLarge / kMicroSteps;
      REQUIRE(std::abs(bf16.master[i] - lost) <= 1e-6 * std::abs(lost));
      REQUIRE(std::abs(bf16.master[i] - exact) > 0.1);
      REQUIRE(explicit_bf16.master[i] == bf16.master[i]);
      REQUIRE(offloaded.master[i] == fp32.master[i]);
    }
    // The accumulated gradients take 4 bytes an element instead of 2.
    REQUIRE(fp32.grad_bytes == 2 * bf16.grad_bytes);
  }
}
