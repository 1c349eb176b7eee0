// zero-plan's step time counts Muon's Newton-Schulz (what --max-model and --autotune rank by):
// each matrix's ns_steps quintic iterations, X X^T (2 r^2 k FLOPs for an r x k matrix, r <= k),
// its square (2 r^3) and B X (2 r^2 k), at the training compute's rate, on the rank that owns
// the matrix (every rank at stage 0); the rest of the optimizer step is AdamW's.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>

#include "zero/plan/plan.hpp"

using namespace zero;
using namespace zero::plan;

namespace {

Settings muon_settings(OptimizerType type, int stage) {
  Settings s;
  s.stage = stage;
  s.dtype = DType::bf16;
  s.micro_batch = 4;
  s.optimizer.type = type;
  return s;
}

// The FLOPs of every Muon matrix of GPT-2 124M (2-D and not the embeddings), worked out here.
double gpt2_newton_schulz_flops(int steps, double* largest) {
  const Layout layout = gpt_layout(gpt_preset("gpt2"));
  double all = 0.0;
  *largest = 0.0;
  for (const UnitInfo& u : layout.units())
    for (const ParamInfo& p : u.params) {
      if (p.shape.size() != 2 || p.embedding) continue;
      const double r = static_cast<double>(std::min(p.shape[0], p.shape[1]));
      const double k = static_cast<double>(std::max(p.shape[0], p.shape[1]));
      const double f = steps * (2 * r * r * k + 2 * r * r * r + 2 * r * r * k);
      all += f;
      *largest = std::max(*largest, f);
    }
  return all;
}

}  // namespace

TEST_CASE("plan: Muon's Newton-Schulz time is in the optimizer step") {
  Cluster c;
  c.gpu = gpu_preset("A100-80GB");
  c.gpus_per_node = 8;
  const double rate = c.gpu.peak_flops * c.gpu.efficiency;
  double largest = 0.0;
  const double all = gpt2_newton_schulz_flops(5, &largest);
  REQUIRE(all > 0.0);
  // Stage 0 on one GPU: every matrix, on top of AdamW's step.
  c.gpus = 1;
  const Plan adamw = make_plan(gpt_preset("gpt2"), c, muon_settings(OptimizerType::adamw, 0));
  const Plan muon = make_plan(gpt_preset("gpt2"), c, muon_settings(OptimizerType::muon, 0));
  CHECK(adamw.time.newton_schulz_s == 0.0);
  CHECK(muon.time.newton_schulz_s == Approx(all / rate).epsilon(1e-12));
  CHECK(muon.time.optimizer_s - adamw.time.optimizer_s == Approx(all / rate).epsilon(1e-9));
  CHECK(muon.time.step_s - adamw.time.step_s == Approx(all / rate).epsilon(1e-9));
  // ns_steps scales it.
  Settings three = muon_settings(OptimizerType::muon, 0);
  three.optimizer.ns_steps = 3;
  CHECK(make_plan(gpt_preset("gpt2"), c, three).time.newton_schulz_s == Approx(0.6 * all / rate).epsilon(1e-12));
  // Stage 1 on 8 GPUs: the matrices are dealt out; the slowest rank holds at least an eighth and
  // at most an eighth plus the largest matrix.
  c.gpus = 8;
  const double eighth = make_plan(gpt_preset("gpt2"), c, muon_settings(OptimizerType::muon, 1)).time.newton_schulz_s;
  CHECK(eighth * rate >= all / 8 * (1 - 1e-12));
  CHECK(eighth * rate <= (all / 8 + largest) * (1 + 1e-12));
}
