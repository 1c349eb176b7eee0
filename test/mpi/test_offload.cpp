// Offload parity: optimizer state in device (here: backend) memory, in host memory and on NVMe
// gives bitwise-identical parameters, at every stage, since all three run the same element-wise
// update over the same values; only where the state lives and how it is chunked differ.
#include <catch2/catch.hpp>

#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine_model.hpp"
#include "scratch_dir.hpp"
#include "zero/context.hpp"
#include "zero/engine.hpp"

using namespace zero;
using namespace zero::test;

namespace {

std::string nvme_dir() { return test::process_scratch_dir("offload_test"); }

struct Result {
  std::vector<std::vector<float>> params, master;
};

Result run(int stage, const std::string& dtype, const std::string& device, const std::string& optimizer,
           const std::string& param_device = "none", bool mixed_decay = false) {
  Context& ctx = *Context::current();
  std::string y =
      "train_micro_batch_size_per_gpu: 2\ngradient_accumulation_steps: 2\ngradient_clipping: 0.05\n"
      "zero_optimization:\n  stage: " +
      std::to_string(stage) +
      "\n  sub_group_size: 50\n  stage3_param_persistence_threshold: 0\n"
      "  offload_optimizer:\n    device: " +
      device + "\n    nvme_path: " + nvme_dir() + "\n" + "  offload_param:\n    device: " + param_device +
      "\n    nvme_path: " + nvme_dir() + "\n";
  if (dtype != "fp32") y += dtype + ":\n  enabled: true\n";
  if (dtype == "fp16") y += "  initial_scale_power: 8\n";
  y += "optimizer:\n  type: " + optimizer + "\n  params:\n    lr: 0.01\n    weight_decay: 0.1\n";
  if (optimizer == "SGD") y += "    momentum: 0.9\n";
  Config cfg = parse_config(y, "test_offload");
  cfg.resolve(ctx.world_size());
  Engine e(ctx, cfg, mixed_decay ? make_mixed_decay_layout() : make_layout());
  e.init_params(init_value);
  train(e, ctx.rank(), ctx.world_size(), 0, 5);
  Result r;
  for (int u = 0; u < e.layout().num_units(); ++u) {
    r.params.push_back(e.full_params(u));
    r.master.push_back(e.full_master(u));
  }
  MemoryReport m = e.memory();
  if (param_device == "nvme")
    REQUIRE(m.params < static_cast<std::int64_t>(e.layout().num_params()));  // slices left memory
  if (device == "none") {
    REQUIRE(m.master > 0);
    REQUIRE(m.offloaded_host == 0);
  } else {
    REQUIRE(m.master == 0);  // master and moments left the backend's memory
    REQUIRE(m.offloaded_host > 0);
    REQUIRE((m.offloaded_nvme > 0) == (device == "nvme" || param_device == "nvme"));
  }
  return r;
}

}  // namespace

TEST_CASE("offload none, cpu and nvme give bitwise-identical parameters after 5 steps") {
  for (int stage = 1; stage <= 3; ++stage)  // optimizer offload needs a sharded optimizer (stage >= 1)
    for (const char* dtype : {"fp32", "bf16", "fp16"})
      for (const char* opt : {"AdamW", "SGD"}) {
        SECTION("stage " + std::to_string(stage) + " " + dtype + " " + opt) {
          Result none = run(stage, dtype, "none", opt);
          for (const char* device : {"cpu", "nvme"}) {
            INFO("offload_optimizer.device " << device);
            Result got = run(stage, dtype, device, opt);
            for (std::size_t u = 0; u < none.params.size(); ++u) {
              REQUIRE(got.params[u] == none.params[u]);
              REQUIRE(got.master[u] == none.master[u]);
            }
          }
        }
      }
}

// The host AdamW steps each sub-group (50 elements here) in runs that agree on weight decay;
// the runs must cut at the same places as on the backend. test_engine checks the backend path
// against the reference; this one checks the offloaded paths against it bit for bit, and that
// the decay flags changed the result at all.
TEST_CASE("offload honours per-parameter weight decay bit for bit") {
  for (int stage = 1; stage <= 3; ++stage)
    for (const char* opt : {"AdamW", "SGD"}) {
      SECTION("stage " + std::to_string(stage) + " " + opt) {
        Result none = run(stage, "bf16", "none", opt, "none", true);
        Result all = run(stage, "bf16", "none", opt, "none", false);
        REQUIRE(none.master != all.master);
        for (const char* device : {"cpu", "nvme"}) {
          INFO("offload_optimizer.device " << device);
          Result got = run(stage, "bf16", device, opt, "none", true);
          REQUIRE(got.params == none.params);
          REQUIRE(got.master == none.master);
        }
      }
    }
}

TEST_CASE("stage-3 parameter offload to nvme gives bitwise-identical parameters") {
  for (const char* dtype : {"fp32", "bf16"})
    for (const char* device : {"none", "cpu", "nvme"}) {
      SECTION(std::string(dtype) + " optimizer " + device) {
        Result base = run(3, dtype, device, "AdamW");
        Result got = run(3, dtype, device, "AdamW", "nvme");
        for (std::size_t u = 0; u < base.params.size(); ++u) {
          REQUIRE(got.params[u] == base.params[u]);
          REQUIRE(got.master[u] == base.master[u]);
        }
      }
    }
}

TEST_CASE("nvme offload checks free space before any step") {
  Context& ctx = *Context::current();
  std::string y =
      "zero_optimization:\n  stage: 1\n  sub_group_size: 1000000\n"
      "  offload_optimizer:\n    device: nvme\n    nvme_path: " +
      nvme_dir() + "\n";
  Config cfg = parse_config(y, "test_offload");
  cfg.resolve(ctx.world_size());
  // A layout whose optimizer state (12 bytes per owned parameter) exceeds the free space of
  // the directory on every rank. The engine must refuse to start, before allocating the model.
  auto space = std::filesystem::space(nvme_dir());
  std::int64_t n = static_cast<std::int64_t>(space.available / 12 + 1) * ctx.world_size() * 2;
  Layout big;
  big.add_unit("huge", {{"w", {n}}});
  REQUIRE_THROWS_WITH(Engine(ctx, cfg, big), Catch::Contains("free") && Catch::Contains(nvme_dir()));
}

TEST_CASE("an exception leaving the training loop removes every rank's NVMe swap files") {
  Context& ctx = *Context::current();
  const std::string rank_dir = nvme_dir() + "/zero_rank" + std::to_string(ctx.rank());
  std::string y =
      "zero_optimization:\n  stage: 3\n  sub_group_size: 50\n  stage3_param_persistence_threshold: 0\n"
      "  offload_optimizer:\n    device: nvme\n    nvme_path: " +
      nvme_dir() + "\n" + "  offload_param:\n    device: nvme\n    nvme_path: " + nvme_dir() + "\n" +
      "optimizer:\n  type: AdamW\n  params:\n    lr: 0.01\n";
  Config cfg = parse_config(y, "test_offload");
  cfg.resolve(ctx.world_size());
  try {
    Engine e(ctx, cfg, make_layout());  // its parameter and optimizer swappers share the rank's lock
    e.init_params(init_value);
    train(e, ctx.rank(), ctx.world_size(), 0, 2);
    REQUIRE_FALSE(std::filesystem::is_empty(rank_dir));
    throw std::runtime_error("the loss is nan");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()) == "the loss is nan");
  }
  CHECK_FALSE(std::filesystem::exists(rank_dir));
  CHECK_FALSE(std::filesystem::exists(rank_dir + ".lock"));
}
