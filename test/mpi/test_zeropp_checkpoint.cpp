// Checkpoints with ZeRO++ on resume bit for bit: hpZ, qwZ, qgZ (stages 2 and 3, fp32 and bf16)
// and all three together. Train 8 steps without a break; train 4, save, build a new engine,
// load, train 4 more: every step's gradient norm and the final master weights must be the same
// bits. qgZ's error-feedback buffers travel in the checkpoint as per-rank state (the metadata's
// rank_state, one rank_state_<r>.ckpt per rank, as PowerSGD's); a checkpoint without them
// (saved without qgZ) or for another layout (another block size) starts them from zero, and the
// run still trains within 2% of the uninterrupted one.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "engine_model.hpp"
#include "scratch_dir.hpp"
#include "zero/checkpoint.hpp"
#include "zero/context.hpp"
#include "zero/engine.hpp"
#include "zero/engine_state.hpp"

using namespace zero;
using namespace zero::test;

namespace {

Config config(int stage, const std::string& dtype, const std::string& features, int block = 16) {
  std::string y =
      "train_micro_batch_size_per_gpu: 2\ngradient_accumulation_steps: 2\ngradient_clipping: 1.0\n"
      "zero_optimization:\n  stage: " +
      std::to_string(stage) +
      "\n  stage3_param_persistence_threshold: 0\n  stage3_max_reuse_distance: 0\n"
      "  zero_quantized_weights_block_size: " +
      std::to_string(block) + "\n" + features;
  if (dtype == "bf16") y += "bf16:\n  enabled: true\n";
  Config c = parse_config(y, "test_zeropp_checkpoint");
  c.resolve(Context::current()->world_size());
  return c;
}

struct Result {
  std::vector<double> norms;
  std::vector<std::vector<float>> master;
};

Result finish(Engine& e, int first, int steps) {
  Context& ctx = *Context::current();
  std::vector<StepResult> r;
  train(e, ctx.rank(), ctx.world_size(), first, steps, &r);
  Result out;
  for (const auto& s : r) out.norms.push_back(s.grad_norm);
  for (int u = 0; u < e.layout().num_units(); ++u) out.master.push_back(e.full_master(u));
  return out;
}

// Trains 4 steps, saves into root, and returns a new engine resumed from it.
Engine resumed(const Config& c, const std::string& root) {
  Context& ctx = *Context::current();
  {
    Engine a(ctx, c, make_layout());
    a.init_params(init_value);
    train(a, ctx.rank(), ctx.world_size(), 0, 4);
    save_checkpoint(a, root);
  }
  Engine b(ctx, c, make_layout());
  load_checkpoint(b, root);
  return b;
}

}  // namespace

TEST_CASE("hpZ, qwZ and qgZ resume bit for bit") {
  Context& ctx = *Context::current();
  const int world = ctx.world_size();
  const std::string hpz = "  zero_hpz_partition_size: " + std::to_string(world % 2 == 0 ? 2 : world) + "\n";
  const std::string qwz = "  zero_quantized_weights: true\n", qgz = "  zero_quantized_gradients: true\n";
  struct Case {
    const char* name;
    int stage;
    const char* dtype;
    std::string features;
  };
  const std::vector<Case> cases = {{"hpZ", 3, "fp32", hpz},
                                   {"hpZ bf16", 3, "bf16", hpz},
                                   {"qwZ", 3, "fp32", qwz},
                                   {"qgZ stage 2", 2, "fp32", qgz},
                                   {"qgZ stage 3", 3, "fp32", qgz},
                                   {"qgZ stage 3 bf16", 3, "bf16", qgz},
                                   {"hpZ+qwZ+qgZ", 3, "fp32", hpz + qwz + qgz}};
  int k = 0;
  for (const auto& c : cases) {
    INFO(c.name << ", " << world << " ranks");
    const Config cfg = config(c.stage, c.dtype, c.features);
    Engine whole(ctx, cfg, make_layout());
    whole.init_params(init_value);
    const Result all = finish(whole, 0, 8);
    const std::string root = process_scratch_dir("zeropp_ckpt") + "/case" + std::to_string(k++);
    Engine b = resumed(cfg, root);
    const Result tail = finish(b, 4, 4);
    for (int s = 0; s < 4; ++s)
      REQUIRE(tail.norms[static_cast<std::size_t>(s)] == all.norms[static_cast<std::size_t>(4 + s)]);
    REQUIRE(tail.master == all.master);
  }
}

// Trains 4 steps with `c`, saves into root and returns this rank's per-rank state at the save.
std::vector<float> save_after_4(const Config& c, const std::string& root) {
  Context& ctx = *Context::current();
  Engine a(ctx, c, make_layout());
  a.init_params(init_value);
  train(a, ctx.rank(), ctx.world_size(), 0, 4);
  save_checkpoint(a, root);
  return EngineState(a).rank_state();
}

TEST_CASE("qgZ's error feedback is saved as per-rank state; without a match it starts from zero and still trains") {
  Context& ctx = *Context::current();
  if (ctx.world_size() == 1) return;  // one rank sends nothing, so it keeps no error
  const Config cfg = config(3, "fp32", "  zero_quantized_gradients: true\n");
  Engine whole(ctx, cfg, make_layout());
  whole.init_params(init_value);
  const Result all = finish(whole, 0, 8);
  auto all_zero = [](const std::vector<float>& v) {
    return std::all_of(v.begin(), v.end(), [](float x) { return x == 0.0f; });
  };

  // Saved and restored as rank_state_<r>.ckpt, the values exactly.
  const std::string kept = process_scratch_dir("zeropp_ckpt") + "/kept";
  const std::vector<float> saved = save_after_4(cfg, kept);
  REQUIRE(!saved.empty());
  REQUIRE(!all_zero(saved));
  char name[32];
  std::snprintf(name, sizeof name, "rank_state_%05d.ckpt", ctx.rank());
  REQUIRE(std::filesystem::exists(resolve_checkpoint(kept) + "/" + name));
  Engine b(ctx, cfg, make_layout());
  load_checkpoint(b, kept);
  REQUIRE(EngineState(b).rank_state() == saved);
  // The size the load compares against, taken without copying the (device) buffers.
  CHECK(EngineState(b).rank_state_size() == saved.size());

  // An engine without qgZ keeps no per-rank state.
  {
    Engine none(ctx, config(3, "fp32", ""), make_layout());
    CHECK(EngineState(none).rank_state_size() == 0);
  }

  // A checkpoint saved without qgZ, and one for another block size: zero, then training goes on.
  const std::string plain = process_scratch_dir("zeropp_ckpt") + "/plain";
  REQUIRE(save_after_4(config(3, "fp32", ""), plain).empty());
  const std::string block = process_scratch_dir("zeropp_ckpt") + "/block";
  (void)save_after_4(config(3, "fp32", "  zero_quantized_gradients: true\n", 32), block);
  for (const std::string& root : {plain, block}) {
    INFO(root);
    Engine c(ctx, cfg, make_layout());
    load_checkpoint(c, root);
    REQUIRE(EngineState(c).rank_state().size() == saved.size());
    REQUIRE(all_zero(EngineState(c).rank_state()));
    const Result tail = finish(c, 4, 4);
    REQUIRE(tail.master != all.master);
    const auto [worst, largest] = weight_difference(all.master, tail.master);
    REQUIRE(worst <= 0.02f * largest);
  }
}
