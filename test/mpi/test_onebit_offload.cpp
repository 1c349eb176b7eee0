// OneBitAdam and OneBitLamb with offload_optimizer cpu and nvme (the host backend), at stages 1
// and 2: the warm-up steps (exact Adam, Lamb) and the compressed ones, whose capture visit and
// update read the owned state through the offload store, in sub-groups that cut the tensors and
// slices, give the same bits as the state kept in memory: the master after every step, every
// step's gradient norm, the parameters at the end; and a checkpoint saved with offload past
// freeze_step resumes, offloaded or not, at either stage, as the uninterrupted run in memory.
#include <catch2/catch.hpp>

#include <cstring>
#include <string>
#include <vector>

#include "onebit_run.hpp"
#include "scratch_dir.hpp"
#include "zero/checkpoint.hpp"

using namespace zero;
using namespace zero::test;
using namespace zero::test::onebit;

namespace {

constexpr int kFreeze = 3, kSteps = 8;

Config make_config(const std::string& optimizer, int stage, const std::string& device) {
  std::string y = "train_micro_batch_size_per_gpu: 4\ngradient_accumulation_steps: 1\n";
  y += "zero_optimization:\n  stage: " + std::to_string(stage) + "\n";
  // Sub-groups smaller than a slice at every world size here: runs begin inside tensors and slices.
  y += "  sub_group_size: 70\n";
  y += "  offload_optimizer:\n    device: " + device + "\n    nvme_path: " + process_scratch_dir("onebit_offload") +
       "\n";
  y += "optimizer:\n  type: " + optimizer + "\n  params:\n    lr: 0.01\n    betas: [0.9, 0.95]\n    eps: 1.0e-8\n";
  y += "    weight_decay: 0.1\n    freeze_step: " + std::to_string(kFreeze) + "\n";
  if (optimizer == "OneBitLamb") y += "    coeff_beta: 0.8\n";
  Config cfg = parse_config(y, "test_onebit_offload");
  cfg.resolve(ctx().world_size());
  return cfg;
}

std::vector<std::vector<float>> masters(Engine& e) {
  std::vector<std::vector<float>> m;
  for (int u = 0; u < e.layout().num_units(); ++u) m.push_back(e.full_master(u));
  return m;
}

struct Trace {
  std::vector<std::vector<std::vector<float>>> master;  // after each step: per unit
  std::vector<double> grad_norm;                        // per step
  std::vector<std::vector<float>> params;               // at the end: per unit
  MemoryReport memory;
};

Trace trace(const Config& cfg) {
  Engine e(ctx(), cfg, layout());
  e.init_params(init_value);
  Trace t;
  for (int s = 0; s < kSteps; ++s) {
    std::vector<StepResult> r;
    train(e, ctx().rank(), ctx().world_size(), s, 1, &r);
    t.grad_norm.push_back(r.at(0).grad_norm);
    t.master.push_back(masters(e));
  }
  for (int u = 0; u < e.layout().num_units(); ++u) t.params.push_back(e.full_params(u));
  t.memory = e.memory();
  return t;
}

bool same_norm(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

}  // namespace

TEST_CASE("OneBitAdam and OneBitLamb offloaded to cpu and nvme step as in memory, bit for bit",
          "[optim][onebit][offload]") {
  const int world = ctx().world_size();
  for (const char* optimizer : {"OneBitAdam", "OneBitLamb"})
    for (const int stage : {1, 2}) {
      const Trace memory = trace(make_config(optimizer, stage, "none"));
      REQUIRE(memory.memory.offloaded_host == 0);
      // The compressed steps ran: the exchange's buffers are taken, and they moved the weights.
      REQUIRE(memory.memory.optimizer_buffers > 0);
      REQUIRE_FALSE(same_bits(memory.master[kFreeze], memory.master.back()));
      for (const char* device : {"cpu", "nvme"}) {
        INFO(optimizer << " at stage " << stage << " on " << world << " rank(s), offload_optimizer.device " << device);
        const Trace got = trace(make_config(optimizer, stage, device));
        CHECK(got.memory.master == 0);  // master and moments left the backend's memory
        CHECK(got.memory.offloaded_host > 0);
        CHECK((got.memory.offloaded_nvme > 0) == (std::string(device) == "nvme"));
        for (int s = 0; s < kSteps; ++s) {
          INFO("step " << s + 1 << (s < kFreeze ? " (warm-up)" : " (compressed)"));
          CHECK(same_bits(got.master[static_cast<std::size_t>(s)], memory.master[static_cast<std::size_t>(s)]));
          CHECK(same_norm(got.grad_norm[static_cast<std::size_t>(s)], memory.grad_norm[static_cast<std::size_t>(s)]));
        }
        CHECK(same_bits(got.params, memory.params));
      }
    }
}

// The checkpoint holds the moments read back from the offload store and each rank's exchange
// state: saved offloaded to NVMe past freeze_step, it resumes in memory, on cpu and on NVMe, at
// stage 1 or 2, and continues the run that never left memory bit for bit.
TEST_CASE("OneBitAdam and OneBitLamb resume from an offloaded checkpoint bit for bit", "[optim][onebit][offload]") {
  const int world = ctx().world_size(), saved = kFreeze + 2;
  for (const char* optimizer : {"OneBitAdam", "OneBitLamb"}) {
    const Trace whole = trace(make_config(optimizer, 1, "none"));
    const std::string where = process_scratch_dir("onebit_offload") + "/ckpt_" + optimizer;
    {
      Engine e(ctx(), make_config(optimizer, 1, "nvme"), layout());
      e.init_params(init_value);
      train(e, ctx().rank(), world, 0, saved);
      save_checkpoint(e, where);
    }
    for (const int stage : {1, 2})
      for (const char* device : {"none", "cpu", "nvme"}) {
        INFO(optimizer << " saved with nvme after " << saved << " steps, resumed at stage " << stage << " with "
                       << device << " on " << world << " rank(s)");
        Engine e(ctx(), make_config(optimizer, stage, device), layout());
        load_checkpoint(e, where);
        REQUIRE(e.global_step() == saved);
        for (int s = saved; s < kSteps; ++s) {
          train(e, ctx().rank(), world, s, 1);
          INFO("step " << s + 1);
          CHECK(same_bits(masters(e), whole.master[static_cast<std::size_t>(s)]));
        }
      }
  }
}
