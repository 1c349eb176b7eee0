// Checkpoints with ZeRO++ on resume bit for bit: hpZ, qwZ, qgZ (stages 2 and 3, fp32 and bf16)
// and all three together. Train 8 steps without a break; train 4, save, build a new engine,
// load, train 4 more: every step's gradient norm and the final master weights must be the same
// bits. qgZ's error-feedback buffers travel in the checkpoint (one file per rank); without them
// (the files removed, as after a resume at another world size) the run starts them from zero,
// still trains, and is no longer bit-identical, which shows the buffers are what made it so.
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>
#include <vector>

#include "engine_model.hpp"
#include "scratch_dir.hpp"
#include "zero/checkpoint.hpp"
#include "zero/context.hpp"
#include "zero/engine.hpp"

using namespace zero;
using namespace zero::test;

namespace {

Config config(int stage, const std::string& dtype, const std::string& features, int block = 16) {
  std::string y = "train_micro_batch_size_per_gpu: 2\ngradient_accumulation_steps: 2\ngradient_clipping: 1.0\n"
                  "zero_optimization:\n  stage: " + std::to_string(stage) +
                  "\n  stage3_param_persistence_threshold: 0\n  stage3_max_reuse_distance: 0\n"
                  "  zero_quantized_weights_block_size: " + std::to_string(block) + "\n" + features;
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
Engine resumed(const Config& c, const std::string& root, bool drop_feedback = false) {
  Context& ctx = *Context::current();
  {
    Engine a(ctx, c, make_layout());
    a.init_params(init_value);
    train(a, ctx.rank(), ctx.world_size(), 0, 4);
    save_checkpoint(a, root);
  }
  if (drop_feedback) {
    if (ctx.rank() == 0)
      for (const auto& f : std::filesystem::directory_iterator(resolve_checkpoint(root)))
        if (f.path().filename().string().rfind("feedback_", 0) == 0) std::filesystem::remove(f.path());
    ctx.comm().barrier();
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
  const std::vector<Case> cases = {{"hpZ", 3, "fp32", hpz},          {"hpZ bf16", 3, "bf16", hpz},
                                   {"qwZ", 3, "fp32", qwz},          {"qgZ stage 2", 2, "fp32", qgz},
                                   {"qgZ stage 3", 3, "fp32", qgz},  {"qgZ stage 3 bf16", 3, "bf16", qgz},
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
    for (int s = 0; s < 4; ++s) REQUIRE(tail.norms[static_cast<std::size_t>(s)] == all.norms[static_cast<std::size_t>(4 + s)]);
    REQUIRE(tail.master == all.master);
  }
}

TEST_CASE("qgZ without its saved error feedback starts it from zero: still training, no longer bit for bit") {
  Context& ctx = *Context::current();
  if (ctx.world_size() == 1) return;  // one rank sends nothing, so it keeps no error
  const Config cfg = config(3, "fp32", "  zero_quantized_gradients: true\n");
  Engine whole(ctx, cfg, make_layout());
  whole.init_params(init_value);
  const Result all = finish(whole, 0, 8);
  Engine b = resumed(cfg, process_scratch_dir("zeropp_ckpt") + "/dropped", true);
  const Result tail = finish(b, 4, 4);
  REQUIRE(tail.master != all.master);
  const auto [worst, largest] = weight_difference(all.master, tail.master);
  REQUIRE(worst <= 0.02f * largest);
  // A checkpoint saved with another block size: its buffers belong to another layout.
  const std::string root = process_scratch_dir("zeropp_ckpt") + "/block";
  {
    Engine a(ctx, cfg, make_layout());
    a.init_params(init_value);
    train(a, ctx.rank(), ctx.world_size(), 0, 4);
    save_checkpoint(a, root);
  }
  const Config other = config(3, "fp32", "  zero_quantized_gradients: true\n", 32);
  Engine c(ctx, other, make_layout());
  load_checkpoint(c, root);
  const Result tail2 = finish(c, 4, 4);
  const auto [worst2, largest2] = weight_difference(all.master, tail2.master);
  REQUIRE(worst2 <= 0.02f * largest2);
}
