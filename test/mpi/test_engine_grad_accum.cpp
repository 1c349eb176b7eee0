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
#include <memory>
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

constexpr int kElements = 37;

// An engine over one unit of kElements parameters, all zero, from the YAML text `y` and one plain
// SGD step (lr 1): after step() the fp32 master is the negated mean gradient.
std::unique_ptr<Engine> one_unit_engine(std::string y) {
  y += "optimizer:\n  type: SGD\n  params:\n    lr: 1.0\n    momentum: 0.0\n    weight_decay: 0.0\n";
  Config cfg = parse_config(y, "test_engine_grad_accum");
  cfg.resolve(ctx().world_size());
  Layout l;
  l.add_unit("w", {{"w", {kElements}}});
  auto e = std::make_unique<Engine>(ctx(), cfg, l);
  e->init_params([](const ParamInfo&, std::span<float> out) {
    for (auto& x : out) x = 0.0f;
  });
  return e;
}

Result train_one_step(int stage, const std::string& accum, bool offload = false) {
  std::string y = "train_micro_batch_size_per_gpu: 1\ngradient_accumulation_steps: " + std::to_string(kMicroSteps) +
                  "\nbf16:\n  enabled: true\n";
  if (!accum.empty()) y += "data_types:\n  grad_accum_dtype: " + accum + "\n";
  y += "zero_optimization:\n  stage: " + std::to_string(stage) + "\n";
  if (offload) y += "  offload_optimizer:\n    device: cpu\n";
  const auto engine = one_unit_engine(y);
  Engine& e = *engine;
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
    REQUIRE(bf16.master.size() == kElements);
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

// communication_data_type: with fp32 accumulation, stages 0 and 1 reduce in fp32 by default, or,
// set to the compute dtype (bf16), round each rank's fp32 sum to bf16 once before the reduction.
// Two micro-steps: 1 and then k/512 with k = (i + 3 rank) % 8, both exact in bf16, so each rank's
// fp32 sum 1 + k/512 is exact, and its bf16 rounding (spacing 1/128 in [1, 2)) hits every case:
// exact, below and above half, and ties to even both ways. The reference is computed in double:
// the default sums the exact contributions; bf16 sums each rank's round-to-nearest-even and the
// sum, being reduced in bf16, is rounded once more. One SGD step (lr 1) makes the master the
// negated mean over ranks and micro-steps.
namespace {

// Round to the nearest bf16 value (8 significant bits), ties to even, in double.
double bf16_round(double x) {
  if (x == 0.0) return x;
  int e = 0;
  (void)std::frexp(x, &e);  // |x| = m 2^e with m in [0.5, 1)
  const double ulp = std::ldexp(1.0, e - 8);
  return std::nearbyint(x / ulp) * ulp;  // the default rounding mode: to nearest, ties to even
}

double micro_grad(int m, int rank, std::int64_t i) {
  return m == 0 ? 1.0 : static_cast<double>((i + 3 * rank) % 8) / 512.0;
}

struct CommResult {
  std::vector<float> master;
  TrafficBytes traffic;
  std::int64_t padded = 0;  // the unit's elements with its padding
};

CommResult comm_step(int stage, bool reduce_scatter, const std::string& comm_dtype) {
  std::string y =
      "train_micro_batch_size_per_gpu: 1\ngradient_accumulation_steps: 2\nbf16:\n  enabled: true\n"
      "data_types:\n  grad_accum_dtype: fp32\n";
  if (!comm_dtype.empty()) y += "communication_data_type: " + comm_dtype + "\n";
  y += "zero_optimization:\n  stage: " + std::to_string(stage) +
       "\n  reduce_scatter: " + (reduce_scatter ? "true" : "false") + "\n";
  const auto engine = one_unit_engine(y);
  Engine& e = *engine;
  const TrafficBytes before = e.traffic();
  for (int m = 0; m < 2; ++m) {
    auto p = e.gather(0);
    auto t = e.grads(0)[0];
    for (std::int64_t i = 0; i < t.numel; ++i) t.add(i, static_cast<float>(micro_grad(m, ctx().rank(), i)));
    e.reduce(0);
  }
  REQUIRE_FALSE(e.step().skipped);
  const TrafficBytes sent = e.traffic() - before;
  return {e.full_master(0), sent, e.layout().padded_numel(0, ctx().world_size())};
}

}  // namespace

TEST_CASE("communication_data_type rounds the fp32 sum to bf16 once before the reduction", "[engine][accum]") {
  const int world = ctx().world_size();
  const double steps = 2.0 * world;
  for (auto [stage, rs] : {std::pair{0, true}, std::pair{1, true}, std::pair{1, false}}) {
    INFO("stage " << stage << ", reduce_scatter " << rs << " at " << world << " ranks");
    const CommResult dflt = comm_step(stage, rs, "");
    const CommResult fp32 = comm_step(stage, rs, "fp32");
    const CommResult null = comm_step(stage, rs, "null");
    const CommResult bf16 = comm_step(stage, rs, "bf16");
    REQUIRE(dflt.master.size() == kElements);
    int rounded_away = 0;
    for (std::size_t i = 0; i < dflt.master.size(); ++i) {
      INFO("element " << i);
      double exact = 0.0, rounded = 0.0;
      for (int r = 0; r < world; ++r) {
        const double sum =
            micro_grad(0, r, static_cast<std::int64_t>(i)) + micro_grad(1, r, static_cast<std::int64_t>(i));
        exact += sum;
        rounded += bf16_round(sum);
      }
      rounded = bf16_round(rounded);
      const double want_exact = -exact / steps, want_rounded = -rounded / steps;
      // The default is unchanged: the fp32 sum, and the same bits as fp32 or null given.
      REQUIRE(std::abs(dflt.master[i] - want_exact) <= 1e-6 * std::abs(want_exact));
      REQUIRE(fp32.master[i] == dflt.master[i]);
      REQUIRE(null.master[i] == dflt.master[i]);
      REQUIRE(std::abs(bf16.master[i] - want_rounded) <= 1e-6 * std::abs(want_rounded));
      if (std::abs(want_rounded - want_exact) > 1e-4) {
        ++rounded_away;
        REQUIRE(std::abs(bf16.master[i] - want_exact) > 1e-4);
      }
    }
    REQUIRE(rounded_away > 0);  // the rounding is seen, not only allowed
    // The gradient's reduction sends half the bytes; the rest of the step's traffic is the same.
    const std::int64_t n = dflt.padded, w = world;
    const std::int64_t saved = stage == 1 && rs ? ring_gather_bytes(w, n / w, 4) - ring_gather_bytes(w, n / w, 2)
                                                : ring_all_reduce_bytes(w, n, 4) - ring_all_reduce_bytes(w, n, 2);
    REQUIRE(dflt.traffic.intra_node + dflt.traffic.inter_node - bf16.traffic.intra_node - bf16.traffic.inter_node ==
            saved);
  }
  // Stages 2 and 3 reduce each micro-step's gradient in bf16 already: the key changes nothing.
  for (int stage : {2, 3}) {
    INFO("stage " << stage);
    const CommResult plain = comm_step(stage, true, ""), named = comm_step(stage, true, "bf16");
    REQUIRE(plain.master == named.master);
  }
}
