// MiCS / hybrid sharding (zero_optimization.mics_shard_size N): the model states are sharded over
// groups of N consecutive ranks and replicated across the world / N groups. Checked here, at 2
// ranks (N = 1) and 4 ranks (N = 2, also on two simulated nodes of two ranks: ctest entry
// test_mics_np4_nodes2):
//   - memory per rank is the stage formula with N in place of the world size (engine.memory());
//   - training follows plain ZeRO at the same stage within fp32 reduction-order error (losses of
//     20 steps, and the independent double-precision reference), N = world is plain ZeRO bit for
//     bit; the global norm, clipping and fp16 overflow agree with plain (each slice counted once);
//   - the bytes crossing nodes per step are the ring model's: only the replica all-reduce of each
//     rank's gradient slice and a few scalars, fewer than plain stage 3;
//   - qwZ's int8 gathers work inside the groups, optimizer offload changes no bit;
//   - bad combinations are clear errors.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "checkpoint_common.hpp"

using namespace zero;
using namespace zero::test;
using namespace zero::test::cktest;

namespace {

// The group size these tests use: two groups (N = 1 at 2 ranks: every rank holds everything).
int group_size() { return std::max(1, ctx().world_size() / 2); }

// engine_model's loop (no collectives of its own, so engine.traffic() is the engine's alone),
// with gradient clipping and two micro-steps.
Config loop_config(int stage, const std::string& dtype, int mics, const std::string& extra = "") {
  std::string y =
      "train_micro_batch_size_per_gpu: 2\ngradient_accumulation_steps: 2\ngradient_clipping: 1.0\n"
      "zero_optimization:\n  stage: " +
      std::to_string(stage) +
      "\n  stage3_param_persistence_threshold: 0\n  stage3_max_reuse_distance: 0\n"
      "  mics_shard_size: " +
      std::to_string(mics) + "\n" + extra;
  if (dtype == "fp16")
    y += "fp16:\n  enabled: true\n  initial_scale_power: 18\n  loss_scale_window: 4\n  hysteresis: 1\n";
  Config c = parse_config(y, "test_mics");
  c.resolve(ctx().world_size());
  return c;
}

struct Run {
  std::vector<StepResult> steps;
  std::vector<std::vector<float>> master;
  TrafficBytes traffic;  // of the last step
};

Run loop_run(const Config& cfg, int steps) {
  Engine e(ctx(), cfg, make_layout());
  e.init_params(init_value);
  Run r;
  train(e, ctx().rank(), ctx().world_size(), 0, steps - 1, &r.steps);
  const TrafficBytes before = e.traffic();
  train(e, ctx().rank(), ctx().world_size(), steps - 1, 1, &r.steps);
  r.traffic = e.traffic() - before;
  for (int u = 0; u < e.layout().num_units(); ++u) r.master.push_back(e.full_master(u));
  return r;
}

double rel(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-30); }

}  // namespace

TEST_CASE("MiCS: memory per rank is the stage formula with N in place of the world size") {
  const int world = ctx().world_size(), n = group_size();
  const Layout l = make_ckpt_layout();
  for (const DType dtype : {DType::bf16, DType::f32})
    for (int stage = 1; stage <= 3; ++stage) {
      Case c;
      c.stage = stage;
      c.dtype = dtype;
      c.mics = n;
      const Config cfg = make_config(c, world);
      INFO(c.name() << " on " << world << " ranks");
      Engine e(ctx(), cfg, make_ckpt_layout());
      e.init_params(init_value);
      // Psi elements of a unit padded for N ranks, Psi / N of them per rank: the compute-dtype
      // parameters whole (stages 1, 2; stage 3 below the persistence threshold of 20) or a slice,
      // the gradients whole (stage 1) or a slice, fp32 master and two Adam moments a slice.
      const std::int64_t es = dtype_size(dtype), gs = dtype_size(cfg.grad_dtype());
      MemoryReport want;
      for (int u = 0; u < l.num_units(); ++u) {
        const std::int64_t padded = l.padded_numel(u, n), slice = l.slice_numel(u, n);
        const bool sharded_params = stage == 3 && l.unit(u).numel >= 20;
        want.params += (sharded_params ? slice : padded) * es;
        want.grads += (stage == 1 ? padded : slice) * gs;
        want.master += slice * 4;
        want.optimizer += slice * 8;
      }
      const MemoryReport got = e.memory();
      REQUIRE(got.params == want.params);
      REQUIRE(got.grads == want.grads);
      REQUIRE(got.master == want.master);
      REQUIRE(got.optimizer == want.optimizer);
      if (n < world) {
        // What plain ZeRO over every rank would keep, for contrast: MiCS holds more per rank.
        std::int64_t plain_master = 0;
        for (int u = 0; u < l.num_units(); ++u) plain_master += l.slice_numel(u, world) * 4;
        REQUIRE(got.master > plain_master);
      }
    }
}

TEST_CASE("MiCS trains as plain ZeRO within fp32 reduction-order error") {
  const int world = ctx().world_size(), n = group_size();
  const int gas = kGlobalBatch % (world * 3) == 0 ? 3 : 1;
  const auto ref = reference(20);
  for (int stage = 1; stage <= 3; ++stage) {
    double worst_loss = 0, worst_weight = 0;
    std::vector<std::vector<float>> master[2];
    std::vector<double> losses[2];
    for (int k = 0; k < 2; ++k) {
      Case c;
      c.stage = stage;
      c.gas = gas;
      c.mics = k == 0 ? -1 : n;
      Engine e(ctx(), make_config(c, world), make_ckpt_layout());
      e.init_params(init_value);
      for (int s = 0; s < 20; ++s) losses[k].push_back(train_step(e, c));
      const Snapshot snap = snapshot(e);
      master[k] = snap.master;
      INFO(c.name());
      require_near_reference(snap.params, ref);  // the independent double-precision AdamW
    }
    for (int s = 0; s < 20; ++s) {
      INFO("stage " << stage << " step " << s << ": plain loss " << losses[0][s] << ", MiCS " << losses[1][s]);
      worst_loss = std::max(worst_loss, rel(losses[1][s], losses[0][s]));
      REQUIRE(rel(losses[1][s], losses[0][s]) <= 1e-6);
    }
    for (std::size_t u = 0; u < master[0].size(); ++u)
      for (std::size_t i = 0; i < master[0][u].size(); ++i)
        worst_weight = std::max(worst_weight, std::abs(static_cast<double>(master[1][u][i]) - master[0][u][i]));
    REQUIRE(worst_weight <= 1e-6);
    if (ctx().rank() == 0)
      std::printf(
          "MiCS N=%d on %d ranks, stage %d, 20 steps: largest relative loss difference to plain %.3g, "
          "largest weight difference %.3g\n",
          n, world, stage, worst_loss, worst_weight);
  }
}

TEST_CASE("MiCS with the optimizer offloaded to host memory trains bit for bit as without") {
  const int world = ctx().world_size(), n = group_size();
  for (int stage = 1; stage <= 3; ++stage) {
    std::vector<std::vector<float>> master[2];
    for (int k = 0; k < 2; ++k) {
      Case c;
      c.stage = stage;
      c.mics = n;
      c.offload = k == 0 ? "none" : "cpu";
      INFO(c.name());
      Engine e(ctx(), make_config(c, world), make_ckpt_layout());
      e.init_params(init_value);
      for (int s = 0; s < 5; ++s) train_step(e, c);
      master[k] = snapshot(e).master;
      if (k == 1) REQUIRE(e.memory().offloaded_host > 0);
    }
    require_bitwise(master[1], master[0], "master with offload against without");
  }
}

TEST_CASE("MiCS with N = world is plain ZeRO, bit for bit") {
  const int world = ctx().world_size();
  for (int stage = 1; stage <= 3; ++stage) {
    INFO("stage " << stage);
    const Run plain = loop_run(loop_config(stage, "fp32", -1), 6),
              whole = loop_run(loop_config(stage, "fp32", world), 6);
    REQUIRE(whole.master == plain.master);
    for (std::size_t s = 0; s < plain.steps.size(); ++s) REQUIRE(whole.steps[s].grad_norm == plain.steps[s].grad_norm);
  }
}

TEST_CASE("MiCS: the global norm, clipping and fp16 overflow agree with plain ZeRO") {
  const int n = group_size();
  for (int stage = 1; stage <= 3; ++stage)
    for (const std::string dtype : {"fp32", "fp16"}) {
      INFO("stage " << stage << " " << dtype << ", N = " << n);
      const Run plain = loop_run(loop_config(stage, dtype, -1), 12), mics = loop_run(loop_config(stage, dtype, n), 12);
      REQUIRE(mics.steps.size() == plain.steps.size());
      int skipped = 0, clipped = 0;
      for (std::size_t s = 0; s < plain.steps.size(); ++s) {
        INFO("step " << s << ": norm plain " << plain.steps[s].grad_norm << ", MiCS " << mics.steps[s].grad_norm);
        // Each slice counted once: the same norm (to fp32 reduction order, fp16's rounding of
        // the sums, reduced once more across groups), the same skips, the same scale.
        REQUIRE(mics.steps[s].skipped == plain.steps[s].skipped);
        REQUIRE(mics.steps[s].loss_scale == plain.steps[s].loss_scale);
        if (!plain.steps[s].skipped)
          REQUIRE(rel(mics.steps[s].grad_norm, plain.steps[s].grad_norm) <= (dtype == "fp32" ? 1e-6 : 2e-3));
        skipped += plain.steps[s].skipped ? 1 : 0;
        clipped += !plain.steps[s].skipped && plain.steps[s].grad_norm > 1.0 ? 1 : 0;
      }
      REQUIRE(clipped > 0);                       // clipping at 1.0 did act
      if (dtype == "fp16") REQUIRE(skipped > 0);  // 2^18 overflows first, then the scale falls
    }
}

TEST_CASE("MiCS: the bytes crossing nodes per step are the ring model's, fewer than plain stage 3") {
  const char* per = std::getenv("ZERO_RANKS_PER_NODE");
  const int world = ctx().world_size(), rank = ctx().rank();
  if (per == nullptr || std::atoi(per) != 2 || world != 4) return;  // test_mics_np4_nodes2 only
  const int n = 2, replicas = world / n;
  const Layout l = make_layout();
  for (int stage = 1; stage <= 3; ++stage) {
    INFO("stage " << stage << ", rank " << rank);
    const Run plain = loop_run(loop_config(stage, "fp32", -1), 3), mics = loop_run(loop_config(stage, "fp32", n), 3);
    // Inside a group (a node): the reduce-scatters, gathers and the norm's sum. Across: the
    // all-reduce of the rank's fp32 gradient slice of every unit over the 2 replicas (ring:
    // 2 (R - 1) ceil(slice / R) elements), the norm's max over them (2 (R - 1) doubles), and the
    // step's agreement check over every rank (two scalar all-reduces over 4 ranks), which
    // crosses from rank r to r + 1 only at the node boundary (ranks 1 and 3).
    std::int64_t want = 2 * (replicas - 1) * 8;
    for (int u = 0; u < l.num_units(); ++u) {
      const std::int64_t slice = l.slice_numel(u, n);
      want += 2 * (replicas - 1) * ((slice + replicas - 1) / replicas) * 4;
    }
    if (rank % 2 == 1) want += 2 * (2 * (world - 1) * 8);
    INFO("inter-node bytes in one step: plain " << plain.traffic.inter_node << ", MiCS " << mics.traffic.inter_node
                                                << " (ring model " << want << ")");
    REQUIRE(mics.traffic.inter_node == want);
    if (stage == 3 && rank % 2 == 1) REQUIRE(mics.traffic.inter_node < plain.traffic.inter_node);
    if (rank == 1)
      std::printf(
          "stage %d, 4 ranks on 2 simulated nodes, rank 1's inter-node bytes per step: plain %lld, MiCS "
          "N=2 %lld\n",
          stage, static_cast<long long>(plain.traffic.inter_node), static_cast<long long>(mics.traffic.inter_node));
  }
}

TEST_CASE("MiCS with qwZ: the group's parameter gathers go through int8, close to MiCS alone") {
  const int n = group_size();
  const std::string qwz = "  zero_quantized_weights: true\n  zero_quantized_weights_block_size: 16\n";
  const Run mics = loop_run(loop_config(3, "fp32", n), 10);
  const Run q = loop_run(loop_config(3, "fp32", n, qwz), 10), again = loop_run(loop_config(3, "fp32", n, qwz), 10);
  REQUIRE(q.master == again.master);  // deterministic
  float largest = 0, worst = 0;
  for (std::size_t u = 0; u < mics.master.size(); ++u)
    for (std::size_t i = 0; i < mics.master[u].size(); ++i) {
      largest = std::max(largest, std::abs(mics.master[u][i]));
      worst = std::max(worst, std::abs(q.master[u][i] - mics.master[u][i]));
    }
  INFO("largest weight difference " << worst << " of " << largest);
  REQUIRE(worst <= 0.02f * largest);
  if (n > 1) {
    REQUIRE(worst > 0.0f);  // the gathers did go through int8
    REQUIRE(q.traffic.intra_node + q.traffic.inter_node < mics.traffic.intra_node + mics.traffic.inter_node);
  }
}

TEST_CASE("MiCS's bad combinations are clear errors") {
  const int world = ctx().world_size();
  REQUIRE_THROWS_WITH(Engine(ctx(), loop_config(0, "fp32", 1), make_layout()),
                      Catch::Contains("mics_shard_size = 1 applies to stages 1-3"));
  REQUIRE_THROWS_WITH(Engine(ctx(), loop_config(1, "fp32", 0), make_layout()),
                      Catch::Contains("mics_shard_size = 0 is not a group size"));
  REQUIRE_THROWS_WITH(parse_config("zero_optimization:\n  mics_shard_size: -2\n", "t"),
                      Catch::Contains("mics_shard_size"));
  REQUIRE_THROWS_WITH(
      Engine(ctx(), loop_config(3, "fp32", world, "  zero_hpz_partition_size: " + std::to_string(world) + "\n"),
             make_layout()),
      Catch::Contains("zero_hpz_partition_size = " + std::to_string(world) + " together"));
  REQUIRE_THROWS_WITH(Engine(ctx(), loop_config(2, "fp32", world + 1), make_layout()),
                      Catch::Contains("mics_shard_size = " + std::to_string(world + 1) + " does not divide the " +
                                      std::to_string(world) + " data-parallel ranks"));
  // MiCS on backend: cuda builds the backend over the shard group: here (no device, or no CUDA
  // in the build) the only error left is the backend's own, never a refusal of MiCS.
  Config cuda = loop_config(2, "fp32", world);
  cuda.backend = BackendKind::cuda;
  try {
    Engine e(ctx(), cuda, make_layout());
  } catch (const Error& e) {
    CHECK_THAT(std::string(e.what()), Catch::Contains("backend: cuda") && !Catch::Contains("MiCS"));
  }
}
