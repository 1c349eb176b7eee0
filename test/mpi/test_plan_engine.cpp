// The planner's model-state bytes equal the engine's own accounting (Engine::memory()) for
// every stage, optimizer offload (none, cpu, nvme), parameter offload to NVMe at stage 3,
// compute dtype, fp32 gradient accumulation under bf16 (data_types.grad_accum_dtype), and the world size this test runs at (ctest runs it at 1, 2, 3 and 4 ranks),
// on a small GPT layout whose units pad differently at each world size; and for MiCS
// (mics_shard_size) and hpZ's secondary shards (zero_hpz_partition_size) at even world sizes, and
// qgZ's error-feedback buffers (zero_quantized_gradients) at stages 2 and 3.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <span>
#include <string>

#include "scratch_dir.hpp"
#include "zero/context.hpp"
#include "zero/engine.hpp"
#include "zero/plan.hpp"

using namespace zero;

namespace {

std::string nvme_dir() { return test::process_scratch_dir("plan_engine"); }

Config make_config(int stage, const std::string& opt_dev, const std::string& param_dev, const std::string& dtype,
                   const std::string& accum, const std::string& groups = "") {
  std::string y = "train_micro_batch_size_per_gpu: 1\ngradient_accumulation_steps: 2\n";
  if (!accum.empty()) y += "data_types:\n  grad_accum_dtype: " + accum + "\n";
  y += "zero_optimization:\n  stage: " + std::to_string(stage) + "\n" + groups;
  // Between the sizes of ln_f (2C) and a block: some units persist at stage 3.
  y += "  stage3_param_persistence_threshold: 1000\n";
  y += "  sub_group_size: 5000\n";
  y += "  offload_optimizer:\n    device: " + opt_dev + "\n    nvme_path: " + nvme_dir() + "\n";
  y += "  offload_param:\n    device: " + param_dev + "\n    nvme_path: " + nvme_dir() + "\n";
  if (dtype == "bf16") y += "bf16:\n  enabled: true\n";
  if (dtype == "fp16") y += "fp16:\n  enabled: true\n";
  y += "optimizer:\n  type: AdamW\n  params:\n    lr: 0.001\n";
  Config cfg = parse_config(y, "test_plan_engine");
  cfg.resolve(Context::current()->world_size());
  return cfg;
}

}  // namespace

TEST_CASE("plan model states equal engine.memory()", "[plan][mpi]") {
  Context& ctx = *Context::current();
  // Odd sizes: a vocabulary that is not a multiple of 128 and a width that splits unevenly.
  const plan::GptShape shape{"", 2, 3, 72, 40, 300};
  for (int stage = 0; stage <= 3; ++stage)
    for (std::string opt : {"none", "cpu", "nvme"})
      for (std::string param : {"none", "nvme"})
        for (std::string dtype : {"bf16", "fp32", "bf16 fp32-accum"}) {
          if (opt != "none" && stage == 0) continue;     // the engine refuses offload at stage 0
          if (param != "none" && stage != 3) continue;   // parameter offload is a stage 3 feature
          DYNAMIC_SECTION("stage " << stage << " offload " << opt << " param " << param << " " << dtype) {
            const bool fp32_accum = dtype == "bf16 fp32-accum";
            const Config cfg = make_config(stage, opt, param, fp32_accum ? "bf16" : dtype, fp32_accum ? "fp32" : "");
            Engine engine(ctx, cfg, plan::gpt_layout(shape));
            const MemoryReport r = engine.memory();
            const plan::ModelStates m = plan::model_states(plan::gpt_layout(shape), plan::settings_from(cfg),
                                                           ctx.world_size());
            CHECK(m.device() == r.model_state());
            CHECK(m.params == r.params);
            CHECK(m.grads == r.grads);
            CHECK(m.master == r.master);
            CHECK(m.optimizer == r.optimizer);
            // NVMe bytes are the engine's exactly when only parameters are there (the optimizer
            // swap files round each sub-group up to a page); host state is at least the plan's.
            if (opt != "nvme") CHECK(m.nvme == r.offloaded_nvme);
            else CHECK(r.offloaded_nvme >= m.nvme);
            CHECK(r.offloaded_host >= m.host);
          }
        }
}

// One training step of zeros: every unit gathered, reduced, stepped (hpZ keeps its secondary
// chunks from the first gathers on).
void zero_step(Engine& e) {
  const int n = e.layout().num_units();
  for (std::int64_t k = 0; k < e.config().gradient_accumulation_steps; ++k) {
    for (int u = 0; u < n; ++u) e.gather(u);
    for (int u = n - 1; u >= 0; --u) {
      auto p = e.gather(u);
      (void)e.grads(u);  // zero gradients
      e.reduce(u);
    }
  }
  (void)e.step();
}

TEST_CASE("plan model states equal engine.memory() with MiCS and hpZ", "[plan][mpi]") {
  Context& ctx = *Context::current();
  const int world = ctx.world_size();
  if (world % 2 != 0) return;  // two groups of world / 2
  const int group = world / 2;
  const plan::GptShape shape{"", 2, 3, 72, 40, 300};
  for (int stage = 1; stage <= 3; ++stage)
    for (const bool hpz : {false, true}) {
      if (hpz && (stage != 3 || group < 2)) continue;
      const std::string groups = hpz ? "  zero_hpz_partition_size: " + std::to_string(group) + "\n"
                                     : "  mics_shard_size: " + std::to_string(group) + "\n";
      DYNAMIC_SECTION("stage " << stage << (hpz ? " hpZ " : " MiCS ") << group << " of " << world) {
        const Config cfg = make_config(stage, "none", "none", "bf16", "", groups);
        Engine engine(ctx, cfg, plan::gpt_layout(shape));
        engine.init_params([](const ParamInfo&, std::span<float> w) { std::fill(w.begin(), w.end(), 0.0f); });
        zero_step(engine);
        const MemoryReport r = engine.memory();
        const plan::ModelStates m = plan::model_states(plan::gpt_layout(shape), plan::settings_from(cfg), world);
        CHECK(m.params == r.params);
        CHECK(m.grads == r.grads);
        CHECK(m.master == r.master);
        CHECK(m.optimizer == r.optimizer);
        CHECK(m.secondary == r.secondary);
        if (hpz) CHECK(r.secondary > 0);
      }
    }
}

TEST_CASE("plan model states equal engine.memory() with qgZ's error feedback", "[plan][mpi]") {
  Context& ctx = *Context::current();
  const int world = ctx.world_size();
  const plan::GptShape shape{"", 2, 3, 72, 40, 300};
  for (int stage : {2, 3})
    DYNAMIC_SECTION("stage " << stage << " qgZ, " << world << " ranks") {
      const Config cfg = make_config(stage, "none", "none", "bf16", "", "  zero_quantized_gradients: true\n");
      Engine engine(ctx, cfg, plan::gpt_layout(shape));
      engine.init_params([](const ParamInfo&, std::span<float> w) { std::fill(w.begin(), w.end(), 0.0f); });
      zero_step(engine);
      const MemoryReport r = engine.memory();
      const plan::ModelStates m = plan::model_states(plan::gpt_layout(shape), plan::settings_from(cfg), world);
      CHECK(m.device() == r.params + r.grads + r.master + r.optimizer);
      CHECK(m.error_feedback == r.error_feedback);
      if (world > 1) CHECK(r.error_feedback > 0);
    }
}
