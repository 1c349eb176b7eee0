// The planner's model-state bytes equal the engine's own accounting (Engine::memory()) for
// every stage, optimizer offload (none, cpu, nvme), parameter offload to NVMe at stage 3,
// compute dtype, fp32 gradient accumulation under bf16 (data_types.grad_accum_dtype), and the world size this test runs
// at (ctest runs it at 1, 2, 3 and 4 ranks), on a small GPT layout whose units pad differently at each world size; and
// for MiCS (mics_shard_size) and hpZ's secondary shards (zero_hpz_partition_size) at even world sizes, and qgZ's
// error-feedback buffers (zero_quantized_gradients) at stages 2 and 3; and qgZ's scratch (MemoryReport::qgz_buffers,
// part of comm_buffers) against plan::qgz_buffer_bytes, also on simulated nodes (ZERO_RANKS_PER_NODE: 4 ranks as 2 x 2,
// both phases; 2 ranks as 2 x 1); and the plan's comm_buffers (equal) and stage-3 gathered (equal at the default max
// live, else a bound) against the reducer's and the gatherer's pools; and the 1-bit optimizers' own buffers and
// OneBitLamb's fresh variance; and the offload staging (MemoryReport::offload_staging) against
// plan::offload_staging_bytes under ZERO_HOST_STAGING=1 for AdamW, Lamb and Muon.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <span>
#include <string>

#include "scratch_dir.hpp"
#include "zero/context.hpp"
#include "zero/engine.hpp"
#include "zero/groups.hpp"
#include "zero/plan/plan.hpp"

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
          if (opt != "none" && stage == 0) continue;    // the engine refuses offload at stage 0
          if (param != "none" && stage != 3) continue;  // parameter offload is a stage 3 feature
          DYNAMIC_SECTION("stage " << stage << " offload " << opt << " param " << param << " " << dtype) {
            const bool fp32_accum = dtype == "bf16 fp32-accum";
            const Config cfg = make_config(stage, opt, param, fp32_accum ? "bf16" : dtype, fp32_accum ? "fp32" : "");
            Engine engine(ctx, cfg, plan::gpt_layout(shape));
            const MemoryReport r = engine.memory();
            const plan::ModelStates m =
                plan::model_states(plan::gpt_layout(shape), plan::settings_from(cfg), ctx.world_size());
            CHECK(m.device() == r.model_state());
            CHECK(m.params == r.params);
            CHECK(m.grads == r.grads);
            CHECK(m.master == r.master);
            CHECK(m.optimizer == r.optimizer);
            // NVMe bytes are the engine's exactly when only parameters are there (the optimizer
            // swap files round each sub-group up to a page); host state is at least the plan's.
            if (opt != "nvme")
              CHECK(m.nvme == r.offloaded_nvme);
            else
              CHECK(r.offloaded_nvme >= m.nvme);
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

Config resolved_config(const std::string& yaml, int world) {
  Config cfg = parse_config(yaml, "test_plan_engine");
  cfg.resolve(world);
  return cfg;
}

// engine.memory() after `steps` training steps of zeros.
MemoryReport memory_after_steps(Context& ctx, const Config& cfg, const Layout& layout, int steps) {
  Engine engine(ctx, cfg, layout);
  engine.init_params([](const ParamInfo&, std::span<float> w) { std::fill(w.begin(), w.end(), 0.0f); });
  for (int i = 0; i < steps; ++i) zero_step(engine);
  return engine.memory();
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
  for (int stage : {2, 3}) DYNAMIC_SECTION("stage " << stage << " qgZ, " << world << " ranks") {
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

// OneBitAdam's and OneBitLamb's own buffers (the exchange's errors, shared momentum and messages;
// OneBitLamb's values per tensor) and OneBitLamb's fresh variance (a third moment) as the engine
// holds them after its compressed steps, against the plan and against the sizes worked out here.
TEST_CASE("plan model states equal engine.memory() with the 1-bit optimizers", "[plan][mpi]") {
  Context& ctx = *Context::current();
  const std::int64_t W = ctx.world_size();
  const plan::GptShape shape{"", 2, 3, 72, 40, 300};
  const Layout layout = plan::gpt_layout(shape);
  for (const std::string type : {"OneBitAdam", "OneBitLamb"})
    for (int stage : {1, 2}) DYNAMIC_SECTION(type << " stage " << stage << ", " << W << " ranks") {
        const std::string y =
            "train_micro_batch_size_per_gpu: 1\nzero_optimization:\n  stage: " + std::to_string(stage) +
            "\noptimizer:\n  type: " + type + "\n  params:\n    lr: 0.001\n    freeze_step: 1\n";
        const Config cfg = resolved_config(y, static_cast<int>(W));
        const MemoryReport r = memory_after_steps(ctx, cfg, layout, 3);
        const plan::ModelStates m = plan::model_states(layout, plan::settings_from(cfg), static_cast<int>(W));
        CHECK(m.device() == r.model_state());
        CHECK(m.optimizer == r.optimizer);
        CHECK(m.optimizer_buffers == r.optimizer_buffers);
        // By hand: per unit of slice S (P = S W over the ranks) this step's owned momentum (4S),
        // and with W > 1 the worker and server errors (4P + 4S), the shared momentum's bits and
        // scales (P/8 + 4W); the largest unit decoded (4P); the messages (a slice of bits of every
        // unit and a scale per unit to each rank), sent and, with W > 1, received; OneBitLamb's
        // 24 bytes per tensor. Its fresh variance: 4 more bytes per owned element.
        std::int64_t hand = 0, largest = 0, bits = 0, owned = 0, tensors = 0;
        for (int u = 0; u < layout.num_units(); ++u) {
          const std::int64_t S = layout.slice_numel(u, static_cast<int>(W)), P = S * W;
          hand += 4 * S + (W > 1 ? 4 * (P + S) + P / 8 + 4 * W : 0);
          largest = std::max(largest, P), bits += S / 8, owned += S;
          tensors += static_cast<std::int64_t>(layout.unit(u).params.size());
        }
        hand += 4 * largest + (W > 1 ? 2 : 1) * W * (bits + 4 * layout.num_units());
        if (type == "OneBitLamb") hand += 24 * tensors;
        CHECK(r.optimizer_buffers == hand);
        CHECK(r.optimizer == owned * 4 * (type == "OneBitLamb" ? 3 : 2));
        CHECK(r.to_string().find("optimizer buffers") != std::string::npos);
      }
}

// qgZ's scratch, as the engine's pool holds it and as the plan models it, over the bucket
// schedules that change it: every unit a bucket of its own, [ln_f h.1] [h.0] [embeddings] (the
// reduce order is the units backwards), and one bucket of all; one bucket kept in flight or none;
// one micro-step per step or two (the last bucket still in flight when the next micro-step's
// first starts).
TEST_CASE("plan's qgZ scratch equals engine.memory()", "[plan][mpi][qgz]") {
  Context& ctx = *Context::current();
  const int world = ctx.world_size();
  const int per_node = node_layout(ctx).ranks_per_node;
  // Units of 30528 (embeddings), 63144 (h.0, h.1) and 144 (ln_f) elements before padding.
  const plan::GptShape shape{"", 2, 3, 72, 40, 300};
  const Layout layout = plan::gpt_layout(shape);
  for (int stage : {2, 3})
    for (std::int64_t bucket : {1, 60000, 500000000})
      for (bool overlap : {false, true})
        for (int gas : {1, 2})
          DYNAMIC_SECTION("stage " << stage << " bucket " << bucket << " overlap " << overlap << " gas " << gas << ", "
                                   << world << " ranks, " << per_node << " per node") {
            const std::string y =
                "train_micro_batch_size_per_gpu: 1\ngradient_accumulation_steps: " + std::to_string(gas) +
                "\nbf16:\n  enabled: true\nzero_optimization:\n  stage: " + std::to_string(stage) +
                "\n  zero_quantized_gradients: true\n  reduce_bucket_size: " + std::to_string(bucket) +
                "\n  overlap_comm: " + (overlap ? "true" : "false") +
                "\noptimizer:\n  type: AdamW\n  params:\n    lr: 0.001\n";
            Config cfg = parse_config(y, "test_plan_engine");
            cfg.resolve(world);
            Engine engine(ctx, cfg, layout);
            engine.init_params([](const ParamInfo&, std::span<float> w) { std::fill(w.begin(), w.end(), 0.0f); });
            zero_step(engine);
            const std::int64_t planned = plan::qgz_buffer_bytes(layout, plan::settings_from(cfg), world, per_node);
            CHECK(engine.memory().qgz_buffers == planned);
            CHECK(planned > 0);
            // A second step reuses the buffers: the peak stays.
            zero_step(engine);
            CHECK(engine.memory().qgz_buffers == planned);
          }
}

// comm_buffers holds qgZ's scratch: one unit per bucket, none in flight, so the reducer's own
// staging differs only by qgZ's fp32 sum beside each slice; its pool keeps one such buffer for
// each of the three unit sizes (4 bytes per element of each one's slice). Everything beyond that
// is qgZ's pool, and its figure is the one worked out by hand.
// One reduction at a time, so the pool keeps, for each of the three unit sizes (embeddings, a
// block, ln_f), the buffers of one reduction: phase 1's int8 messages of the M slices this rank
// serves to its L node peers (a byte per value and a 4-byte scale per block of 256, rounded up to
// whole words), sent and received; the fp32 partial sum of the M slices; phase 2's int4 messages
// of one slice to the M nodes, sent and received.
TEST_CASE("engine.memory().comm_buffers counts qgZ's scratch", "[plan][mpi][qgz]") {
  Context& ctx = *Context::current();
  const int world = ctx.world_size();
  const std::int64_t L = std::min(world, node_layout(ctx).ranks_per_node), M = world / L;
  const plan::GptShape shape{"", 2, 3, 72, 40, 300};
  const Layout layout = plan::gpt_layout(shape);
  auto memory = [&](bool qgz) {
    const std::string y = std::string("train_micro_batch_size_per_gpu: 1\nbf16:\n  enabled: true\n") +
                          "zero_optimization:\n  stage: 2\n  reduce_bucket_size: 1\n  overlap_comm: false\n" +
                          "  zero_quantized_gradients: " + (qgz ? "true" : "false") +
                          "\noptimizer:\n  type: AdamW\n  params:\n    lr: 0.001\n";
    return memory_after_steps(ctx, resolved_config(y, world), layout, 1);
  };
  const MemoryReport with = memory(true), without = memory(false);
  REQUIRE(layout.unit(1).numel == 12 * 72 * 72 + 13 * 72);  // h.0 and h.1: the largest
  auto words = [](std::int64_t bytes) { return (bytes + 3) / 4 * 4; };
  std::int64_t expected = 0, sums = 0;
  for (int unit : {0, 1, 3}) {
    const std::int64_t slice = layout.slice_numel(unit, world);
    sums += 4 * slice;
    const std::int64_t int8 = words(M * slice + 4 * ((M * slice + 255) / 256));
    const std::int64_t int4 = words((slice + 1) / 2 + 4 * ((slice + 255) / 256));
    expected += (L > 1 ? 2 * L * int8 : 0) + 4 * M * slice + (M > 1 ? 2 * M * int4 : 0);
  }
  CHECK(without.qgz_buffers == 0);
  CHECK(with.qgz_buffers == expected);
  CHECK(with.comm_buffers - without.comm_buffers == expected + sums);
  CHECK(with.to_string().find("(qgZ ") != std::string::npos);
}

// The small GPT the buffer tests plan for, on `world` A100s.
struct SmallGpt {
  plan::GptShape shape{"", 2, 3, 72, 40, 300};
  Layout layout = plan::gpt_layout(shape);
  plan::Cluster cluster;
  explicit SmallGpt(int world) {
    cluster.gpu = plan::gpu_preset("A100-80GB");
    cluster.gpus = world;
  }
};

// zero-plan's comm_buffers (the reducer's pools, plan::reduce_buffer_bytes) and gathered (the
// stage 3 gatherer's pool) against what the engine's pools hold after two steps, over the
// settings that change them: every unit a bucket of its own, [ln_f h.1] [h.0] [embeddings], one
// bucket of all; overlap_comm; one or two micro-steps; the compute and accumulation dtypes; the
// prefetch bucket (and the after-step all-gather bucket, which takes no buffer); max live
// parameters at its default and below two blocks. comm_buffers is exact; gathered is exact at
// the default max live (every sharded unit is kept), an upper bound below it, measured at most
// 1.68 times the engine's here (the bound allows two of the largest units beyond max live).
TEST_CASE("plan's comm buffers equal, and its gathered bounds, engine.memory()", "[plan][mpi][buffers]") {
  Context& ctx = *Context::current();
  const int world = ctx.world_size();
  const SmallGpt gpt(world);
  const plan::GptShape& shape = gpt.shape;
  const Layout& layout = gpt.layout;
  const plan::Cluster& cluster = gpt.cluster;
  for (int stage = 0; stage <= 3; ++stage)
    for (std::string dtype : {"fp32", "bf16", "bf16 fp32-accum"})
      for (std::int64_t bucket : {1, 60000, 500000000})
        for (std::int64_t ag : {1, 500000000})
          for (bool overlap : {false, true})
            for (int gas : {1, 2})
              for (std::int64_t live : {1000000000, 70000}) {
                if (stage != 3 && live != 1000000000) continue;  // max live is a stage 3 setting
                DYNAMIC_SECTION("stage " << stage << " " << dtype << " bucket " << bucket << " ag " << ag << " overlap "
                                         << overlap << " gas " << gas << " live " << live << ", " << world
                                         << " ranks") {
                  std::string y =
                      "train_micro_batch_size_per_gpu: 1\ngradient_accumulation_steps: " + std::to_string(gas) + "\n";
                  if (dtype != "fp32") y += "bf16:\n  enabled: true\n";
                  if (dtype == "bf16 fp32-accum") y += "data_types:\n  grad_accum_dtype: fp32\n";
                  y += "zero_optimization:\n  stage: " + std::to_string(stage) +
                       "\n  reduce_bucket_size: " + std::to_string(bucket) +
                       "\n  allgather_bucket_size: " + std::to_string(ag) +
                       "\n  stage3_prefetch_bucket_size: " + std::to_string(ag) +
                       "\n  stage3_max_live_parameters: " + std::to_string(live) +
                       "\n  stage3_param_persistence_threshold: 1000\n  overlap_comm: " + (overlap ? "true" : "false") +
                       "\noptimizer:\n  type: AdamW\n  params:\n    lr: 0.001\n";
                  const Config cfg = resolved_config(y, world);
                  const MemoryReport r = memory_after_steps(ctx, cfg, layout, 2);
                  const plan::Settings s = plan::settings_from(cfg);
                  const plan::MemoryPlan m = plan::make_plan(shape, cluster, s).memory;
                  CHECK(m.comm_buffers == r.comm_buffers);
                  CHECK(m.comm_buffers == plan::reduce_buffer_bytes(layout, s, world));
                  if (stage == 3) {
                    REQUIRE(r.gathered > 0);
                    if (live == 1000000000) CHECK(m.gathered == r.gathered);
                    CHECK(m.gathered >= r.gathered);
                    CHECK(static_cast<double>(m.gathered) <= 1.7 * static_cast<double>(r.gathered));
                  } else {
                    CHECK(m.gathered == 0);
                    CHECK(r.gathered == 0);
                  }
                  if (stage >= 1 || dtype == "bf16 fp32-accum") CHECK(r.comm_buffers > 0);
                }
              }
}

// Sets an environment variable for its lifetime.
struct ScopedEnv {
  const char* name;
  ScopedEnv(const char* n, const char* value) : name(n) { setenv(n, value, 1); }
  ~ScopedEnv() { unsetenv(name); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
};

// The offload staging (MemoryReport::offload_staging, the bytes its buffers hold after a step)
// against plan::offload_staging_bytes and the plan's pinned host memory. With ZERO_HOST_STAGING=1
// the host backend stages offloaded steps as a device backend does: every owned gradient and
// parameter at once, for AdamW as for the multi-pass Lamb and Muon, so more than one sub-group's
// (sub_group_size 5000 is less than the owned range at up to 4 ranks). Without it the host
// backend steps in place and holds none.
TEST_CASE("plan's offload staging equals engine.memory()", "[plan][mpi][staging]") {
  Context& ctx = *Context::current();
  const int world = ctx.world_size();
  const SmallGpt gpt(world);
  for (std::string type : {"AdamW", "Lamb", "Muon"})
    for (int stage : {1, 2, 3})
      for (std::string dtype : {"fp32", "bf16 fp32-accum", "bf16"})
        DYNAMIC_SECTION(type << " stage " << stage << " " << dtype << ", " << world << " ranks") {
          std::string y = "train_micro_batch_size_per_gpu: 1\ngradient_accumulation_steps: 1\n";
          if (dtype != "fp32") y += "bf16:\n  enabled: true\n";
          if (dtype == "bf16 fp32-accum") y += "data_types:\n  grad_accum_dtype: fp32\n";
          y += "zero_optimization:\n  stage: " + std::to_string(stage) + "\n  sub_group_size: 5000\n";
          y += "  offload_optimizer:\n    device: cpu\n";
          y += "optimizer:\n  type: " + type + "\n  params:\n    lr: 0.001\n";
          const Config cfg = resolved_config(y, world);
          MemoryReport staged;
          {
            const ScopedEnv env("ZERO_HOST_STAGING", "1");
            staged = memory_after_steps(ctx, cfg, gpt.layout, 1);
          }
          const MemoryReport in_place = memory_after_steps(ctx, cfg, gpt.layout, 1);
          const plan::Settings s = plan::settings_from(cfg);
          const std::int64_t planned = plan::offload_staging_bytes(gpt.layout, s, world);
          CHECK(staged.offload_staging == planned);
          CHECK(plan::make_plan(gpt.shape, gpt.cluster, s).memory.pinned == planned);
          const std::int64_t element = dtype == "fp32" ? 4 + 4 : dtype == "bf16" ? 2 + 2 : 4 + 2;
          CHECK(staged.offload_staging > 5000 * element);
          CHECK(staged.offload_staging % element == 0);
          CHECK(staged.to_string().find("offload staging") != std::string::npos);
          CHECK(in_place.offload_staging == 0);
        }
}
