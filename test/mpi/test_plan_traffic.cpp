// zero-plan's bytes per step inside and across nodes (plan::step_traffic) equal what the GPT
// trainer's engine counts (Engine::traffic()) over a training step, for every stage, dtype,
// the reduce_scatter switch, stage 3's re-gathers (stage3_max_reuse_distance), hpZ, qwZ and
// MiCS, qgZ (stages 2 and 3, with and without hpZ and qwZ) and PowerSGD (stages 0 and 1, fp32
// and bf16 factors, the steps after start_step); and what Lamb and Adafactor sum over the tensor
// group for the tensors split by tensor parallelism, and what Muon sends over it to put its split
// matrices together (plan::tensor_group_traffic), against the tensor group's own counters.
// ctest runs it at 2 ranks on one node and at 4 ranks on two simulated nodes of two.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>

#include "gpt/trainer.hpp"
#include "zero/engine.hpp"
#include "zero/config.hpp"
#include "zero/context.hpp"
#include "zero/groups.hpp"
#include "zero/plan/plan.hpp"

using namespace zero::gpt;

namespace {

zero::Context& ctx() { return *zero::Context::current(); }

// `top`: more top-level sections (gradient_compression).
// `optimizer`: the optimizer section's body.
zero::Config make_config(const std::string& zero_keys, bool bf16, const std::string& top = "",
                         const std::string& optimizer = "  type: AdamW\n  params:\n    lr: 0.001\n") {
  std::string y = "train_micro_batch_size_per_gpu: 1\ngradient_accumulation_steps: 2\n" + top;
  y += "zero_optimization:\n" + zero_keys;
  y += "  reduce_bucket_size: 20000\n  allgather_bucket_size: 20000\n";
  y += "  stage3_param_persistence_threshold: 100\n  stage3_prefetch_bucket_size: 20000\n";
  if (bf16) y += "bf16:\n  enabled: true\n";
  y += "optimizer:\n" + optimizer;
  // A width whose units pad differently at 2 and 4 ranks; ln_f (2 x 40 elements) persists.
  y += "model:\n  n_layer: 2\n  n_head: 2\n  n_embd: 40\n  seq_len: 16\n  vocab_size: 200\n";
  y += "data:\n  train: shakespeare\n";
  zero::LoadOptions o;
  o.extra_sections = gpt_sections();
  zero::Config cfg = zero::parse_config(y, "test_plan_traffic", o);
  cfg.resolve(ctx().world_size());
  return cfg;
}

}  // namespace

TEST_CASE("plan::step_traffic equals the GPT trainer's counted bytes", "[plan][mpi]") {
  const int world = ctx().world_size(), rank = ctx().rank();
  const int per_node = zero::node_layout(ctx()).ranks_per_node;
  REQUIRE(per_node >= 1);
  const std::string regather = "  stage: 3\n  stage3_max_reuse_distance: 0\n";
  const std::string hpz = "  zero_hpz_partition_size: 2\n";
  const std::string qwz = "  zero_quantized_weights: true\n  zero_quantized_weights_block_size: 64\n";
  // MiCS: two groups of world / 2 (one per simulated node at 4 ranks; of 1 rank at 2).
  const std::string mics = "  mics_shard_size: " + std::to_string(std::max(1, world / 2)) + "\n";
  const std::string qgz = "  zero_quantized_gradients: true\n", block = "  zero_quantized_weights_block_size: 48\n";
  const std::vector<std::string> cases = {
      "  stage: 0\n",
      "  stage: 1\n",
      "  stage: 2\n",
      "  stage: 3\n",
      "  stage: 1\n  reduce_scatter: false\n",
      "  stage: 2\n  reduce_scatter: false\n",
      regather,
      regather + hpz,
      regather + qwz,
      regather + hpz + qwz,
      "  stage: 3\n" + hpz,
      "  stage: 1\n" + mics,
      "  stage: 2\n" + mics,
      "  stage: 3\n" + mics,
      regather + mics,
      "  stage: 1\n  reduce_scatter: false\n" + mics,
      "  stage: 2\n" + qgz + block,
      "  stage: 3\n" + qgz + block,
      regather + qgz + block,
      "  stage: 3\n" + hpz + qgz + block,
      "  stage: 3\n" + qwz + qgz,
      regather + hpz + qwz + qgz,
  };
  // PowerSGD from the second step on (the measured steps): its own rank and factor dtype each.
  auto powersgd = [](int r, const char* factor) {
    return "gradient_compression:\n  type: powersgd\n  start_step: 1\n  rank: " + std::to_string(r) +
           "\n  factor_dtype: " + factor + "\n";
  };
  struct Case {
    std::string keys, top, optimizer = "  type: AdamW\n  params:\n    lr: 0.001\n";
  };
  std::vector<Case> all;
  for (const std::string& keys : cases) all.push_back({keys, ""});
  // Optimizers that exchange statistics (Lamb, Adafactor) or whole matrices (Muon) between passes.
  for (const char* type : {"Lamb", "Adafactor", "Muon"})
    for (const std::string& keys : {std::string("  stage: 1\n"), std::string("  stage: 3\n"), "  stage: 2\n" + mics})
      all.push_back({keys, "", std::string("  type: ") + type + "\n  params:\n    lr: 0.001\n"});
  // OneBitAdam and OneBitLamb compressed from the first step (the plan is of their steady state;
  // OneBitLamb's first step also fixes its scaling coefficients).
  for (const char* type : {"OneBitAdam", "OneBitLamb"})
    for (const char* stage : {"  stage: 1\n", "  stage: 2\n"})
      all.push_back({stage, "", std::string("  type: ") + type + "\n  params:\n    lr: 0.001\n    freeze_step: 0\n"});
  for (const char* stage : {"  stage: 0\n", "  stage: 1\n"}) {
    all.push_back({stage, powersgd(2, "fp32")});
    all.push_back({stage, powersgd(3, "bf16")});
  }
  for (const auto& [keys, top, optimizer] : all)
    for (bool bf16 : {false, true}) {
      if ((keys.find("hpz") != std::string::npos || keys.find("mics") != std::string::npos) && world % 2 != 0) continue;
      DYNAMIC_SECTION(keys << top << optimizer << (bf16 ? "bf16" : "fp32")) {
        const zero::Config cfg = make_config(keys, bf16, top, optimizer);
        GptTrainer trainer(ctx(), cfg, read_gpt_settings(cfg));
        // The first step records stage 3's gather order; the plan is of the steps after it.
        trainer.train_step();
        for (int step = 0; step < 2; ++step) {
          const zero::TrafficBytes before = trainer.engine().traffic();
          trainer.train_step();
          const zero::TrafficBytes sent = trainer.engine().traffic() - before;
          const zero::TrafficBytes planned = zero::plan::step_traffic(
              trainer.engine().layout(), zero::plan::settings_from(cfg), world, per_node, rank);
          INFO("rank " << rank << " of " << world << ", " << per_node << " per node");
          CHECK(sent.intra_node == planned.intra_node);
          CHECK(sent.inter_node == planned.inter_node);
          if (world > 1) CHECK(sent.intra_node + sent.inter_node > 0);
        }
      }
    }
}

TEST_CASE("plan::step_traffic: hpZ and qwZ send fewer bytes across nodes than plain stage 3", "[plan]") {
  // Pure arithmetic on 2 nodes of 2 ranks: the figures the simulated-cluster benchmark measures.
  const zero::Layout layout = zero::plan::gpt_layout(zero::plan::GptShape{"", 4, 4, 256, 64, 512});
  zero::plan::Settings s;
  s.stage = 3;
  s.grad_accum = 2;
  s.max_reuse_distance = 0;
  s.persistence_threshold = 1000;
  auto inter = [&](const zero::plan::Settings& v) {
    std::int64_t most = 0;
    for (int r = 0; r < 4; ++r) most = std::max(most, zero::plan::step_traffic(layout, v, 4, 2, r).inter_node);
    return most;
  };
  const std::int64_t plain = inter(s);
  zero::plan::Settings h = s;
  h.hpz_partition_size = 2;
  zero::plan::Settings hq = h;
  hq.quantized_weights = true;
  CHECK(inter(h) < plain);
  CHECK(inter(hq) < inter(h));
  // qgZ: int4 gradient slices across nodes instead of the compute dtype's reduce-scatter.
  zero::plan::Settings hqg = hq;
  hqg.quantized_gradients = true;
  CHECK(inter(hqg) < inter(hq));
  zero::plan::Settings g = s;
  g.stage = 1;
  g.quantized_gradients = true;
  REQUIRE_THROWS_WITH(zero::plan::step_traffic(layout, g, 4, 2, 0), Catch::Matchers::Contains("stages 2 and 3"));
  // Rank 0's successor is on its own node: with 2 ranks per node only ranks 1 and 3 send across.
  CHECK(zero::plan::step_traffic(layout, s, 4, 2, 0).inter_node == 0);
  REQUIRE_THROWS_WITH(zero::plan::step_traffic(layout, s, 4, 2, 4), Catch::Matchers::Contains("not a rank"));
}

// A tensor-parallel part: a matrix cut by rows, one cut by columns, a vector cut, and replicated
// tensors (no sum). Lamb sums ||p||^2 and ||u||^2 of each split tensor over the tensor group once
// a step; Adafactor its first pass's sums of the split tensors and, for a split matrix, its sums
// along the cut axis, then the sums of R of the matrices cut by rows, then its second pass's
// sums of the split matrices; Muon puts its split matrices together over the group and gives the
// parts of the results back. The engine's tensor group counts what it sends; the plan must say
// the same, and the sizes worked out here.
TEST_CASE("plan::tensor_group_traffic equals the tensor group's counted bytes", "[plan][mpi]") {
  zero::ProcessGroups groups(ctx(), {.tensor = 2, .pipeline = 1});
  zero::Layout part;
  const int a = part.add_unit("a", {{"w", {12, 8}}, {"v", {8, 10}}, {"g", {8}}});
  const int b = part.add_unit("b", {{"x", {6}}, {"y", {4, 4}}});
  part.set_split(a, "w", 0);
  part.set_split(a, "v", 1);
  part.set_replicated(a, "g");
  part.set_split(b, "x", 0);
  part.set_replicated(b, "y");
  const int per_node = zero::node_layout(ctx()).ranks_per_node;
  // Doubles per rank of each all-gather, as worked out from the shapes.
  const std::vector<std::int64_t> lamb{2 * 3};
  // Adafactor: w (cut by rows) its 8 column sums, v (cut by columns) its 8 row sums; w's R sum;
  // the second pass's w and v.
  const std::vector<std::int64_t> adafactor{2 * 3 + 8 + 8, 1, 2};
  // Muon: w (24 x 8 whole, cost 8^2 x 24) goes to data rank 0, v (8 x 20, 8^2 x 20) to rank 1,
  // y (replicated, never exchanged) to rank 1. Unit a's parts put together in one exchange: an
  // all-gather of the rank's parts (w 96 floats, v 80) to its one peer, then an all-reduce of
  // both ranks' worth (2 x (T-1)/T of it): 4 x parts + 4 x 2 x parts bytes. Every rank puts
  // both together at stage 0 or with one data rank, else the owner of each.
  auto muon = [&](int stage) -> std::int64_t {
    const int d = ctx().rank() / 2 % groups.data_size();
    const std::int64_t parts = stage == 0 || groups.data_size() == 1 ? 96 + 80 : d == 0 ? 96 : 80;
    return 4 * parts + 4 * 2 * parts;
  };
  for (const std::string type : {"Lamb", "Adafactor", "Muon"})
    for (int stage : {0, 1, 2, 3})
      DYNAMIC_SECTION(type << " stage " << stage << ", " << ctx().world_size() << " ranks") {
        std::string y = "train_micro_batch_size_per_gpu: 1\nzero_optimization:\n  stage: " + std::to_string(stage);
        y += "\noptimizer:\n  type: " + type + "\n  params:\n    lr: 0.001\n";
        zero::Config cfg = zero::parse_config(y, "test_plan_traffic");
        cfg.resolve(groups.data_size());
        zero::Engine e(ctx(), cfg, part, groups);
        e.init_params([](const zero::ParamInfo&, std::span<float> w) { std::fill(w.begin(), w.end(), 0.5f); });
        const zero::TrafficBytes before = groups.tensor().traffic();
        for (int u = part.num_units() - 1; u >= 0; --u) {
          auto p = e.gather(u);
          const zero::UnitGrads g = e.grads(u);
          for (int k = 0; k < static_cast<int>(part.unit(u).params.size()); ++k)
            for (std::int64_t i = 0; i < g[k].numel; ++i) g[k].set(i, 0.25f);
          e.reduce(u);
        }
        (void)e.step();
        const zero::TrafficBytes sent = groups.tensor().traffic() - before;
        zero::plan::Settings s = zero::plan::settings_from(cfg);
        s.tensor_parallel = 2;
        const zero::TrafficBytes planned =
            zero::plan::tensor_group_traffic(part, s, groups.data_size(), per_node, ctx().rank());
        std::int64_t hand = type == "Muon" ? muon(stage) : 0;
        if (type != "Muon")
          for (std::int64_t d : type == "Lamb" ? lamb : adafactor) hand += 8 * d;  // one peer, 8 bytes a double
        CHECK(planned.intra_node == sent.intra_node);
        CHECK(planned.inter_node == sent.inter_node);
        CHECK(planned.intra_node + planned.inter_node == hand);
      }
}
