// Engine parity on the CUDA backend: the same training (test/mpi/engine_model.hpp's model and
// data) through backend: cuda and backend: host, compared after 5 steps, for every stage, compute
// dtype and optimizer offload mode, with the bucket / overlap / prefetch knobs varied as in
// test/mpi/test_engine.cpp, plus SGD, Adam (L2), an fp16 overflow that must skip the step on
// both, a user-supplied compute stream, repeatability, memory accounting, and hpZ, MiCS and qwZ
// (the backend over MiCS's shard group, device communicators over hpZ's and MiCS's groups), qgZ's
// error feedback through a checkpoint, and PowerSGD (host-staged on CUDA), its checkpoint resume
// included.
//
// The loop hands the engine device pointers the way a CUDA training loop would: it reads the
// gathered parameters back to the host to compute the gradient there, and writes the updated
// gradient buffer back before reduce(). The host run uses the same loop (its copies are
// memmoves), so the only difference between the two runs is the backend.
//
// Expected: bitwise-equal parameters, master weights and optimizer-visible results whenever the
// arithmetic is the same: always with comm: mpi (the host communicator's sums), and with NCCL on
// one rank (its reductions are then identities). With gradient clipping the coefficient comes from the gradient norm,
// whose double-precision sum runs in another order on the device (relative ~1e-16); a change of the float coefficient
// is then possible but improbable (~1e-7 per step), so those cases are held to a tolerance (and in practice match
// bitwise). NCCL with several ranks sums in its own order and rounds 16-bit sums at each step of its ring: a tolerance
// of two units in the last place of the compute dtype.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "engine/engine_impl.hpp"
#include "engine_model.hpp"
#include "gpu_test_util.hpp"
#include "scratch_dir.hpp"
#include "spin_kernel.hpp"
#include "zero/checkpoint.hpp"
#include "zero/engine.hpp"
#include "zero/engine_state.hpp"

using namespace zero;
using namespace zero::test;
using namespace zero::gputest;

namespace {

struct Case {
  int stage = 0;
  DType dtype = DType::f32;
  int gas = 1;
  double clip = 0.0;
  std::string optimizer = "AdamW";
  std::string offload = "none";  // offload_optimizer.device
  std::string extra;             // more lines under zero_optimization
  std::string top;               // more top-level lines (gradient_compression)
  // The gradient reduction runs over the host communicator on both backends (PowerSGD, staged
  // through the host on CUDA): the same sums in the same order whatever `comm` is.
  bool host_reduced = false;
  int inf_step = -1;         // step at which rank 0 writes an inf into a gradient
  bool user_stream = false;  // run the CUDA engine on a stream of the test's own
  bool spin = false;         // ~20 ms of spinning on the compute stream before each producer
  bool mixed_decay = false;  // make_mixed_decay_layout(): weight decay on some parameters only
  std::string accum;         // data_types.grad_accum_dtype; "": the CUDA default on both backends
  // The loop's own controls: ManualLR with a rate set before each step, the norm read before
  // the step, the loop's clip coefficient from it, and step 2 skipped.
  bool loop_controls = false;
  std::string name() const {
    return "stage " + std::to_string(stage) + " " + std::string(dtype_name(dtype)) + " gas " + std::to_string(gas) +
           (clip > 0 ? " clip" : "") + " " + optimizer + " offload " + offload + (inf_step >= 0 ? " overflow" : "") +
           (user_stream ? " user-stream" : "") + (mixed_decay ? " mixed-decay" : "") +
           (accum.empty() ? "" : " accumulate " + accum) + (loop_controls ? " loop-controls" : "");
  }
};

// Unique per run: NVMe swap directories are locked by the job using them.
std::string nvme_dir() { return zero::test::process_scratch_dir("gpu_engine"); }

Config make_config(const Case& c, const std::string& kind) {
  std::string y;
  y += "train_micro_batch_size_per_gpu: 2\n";
  y += "gradient_accumulation_steps: " + std::to_string(c.gas) + "\n";
  y += "gradient_clipping: " + std::to_string(c.clip) + "\n";
  y += c.top;
  y += "zero_optimization:\n  stage: " + std::to_string(c.stage) + "\n" + c.extra;
  if (c.offload != "none") {
    y += "  sub_group_size: 50\n  offload_optimizer:\n    device: " + c.offload + "\n    nvme_path: " + nvme_dir() +
         "\n";
  }
  if (c.dtype == DType::bf16) y += "bf16:\n  enabled: true\n";
  if (c.dtype == DType::f16) y += "fp16:\n  enabled: true\n  initial_scale_power: 8\n";
  y += "optimizer:\n  type: " + c.optimizer + "\n  params:\n    lr: 0.01\n    weight_decay: 0.1\n";
  if (c.optimizer == "SGD") y += "    momentum: 0.9\n";
  if (c.optimizer == "Adam")
    y += "    adam_w_mode: false\n";  // the L2 path (DeepSpeed's Adam decouples by default)
  else
    y += "    betas: [0.9, 0.95]\n    eps: 1.0e-8\n";
  if (c.loop_controls) y += "scheduler:\n  type: ManualLR\n";
  y += "backend: " + kind + "\n";
  if (kind == "cuda") y += "comm: " + test_comm() + "\n";
  // The CUDA backend accumulates 16-bit gradients in fp32 by default when there is more than one
  // micro-step; the host backend is told the same, so that the two compute the same thing.
  std::string accum = c.accum;
  if (accum.empty() && kind == "host" && c.gas > 1 && c.dtype != DType::f32) accum = "fp32";
  if (!accum.empty()) y += "data_types:\n  grad_accum_dtype: " + accum + "\n";
  Config cfg = parse_config(y, "test_cuda_engine");
  cfg.resolve(ctx().world_size());
  return cfg;
}

// The rate a loop_controls case sets before step s: a linear warmup as llm.c's starts it.
double loop_lr(int s) { return 0.01 * (s + 1) / 4.0; }

// engine_model.hpp's train(), with the parameters and gradients behind backend pointers.
// Steps first .. first + steps - 1 (a resumed run goes on with the same data).
void train(Engine& e, Backend& b, const Case& c, int steps, std::vector<StepResult>& results, int first = 0) {
  const int rank = ctx().rank(), world = ctx().world_size();
  const int gas = static_cast<int>(e.config().gradient_accumulation_steps);
  const int micro = static_cast<int>(e.config().train_micro_batch_size_per_gpu);
  const int n = e.layout().num_units();
  const DType t = c.dtype;
  for (int s = first; s < first + steps; ++s) {
    for (int k = 0; k < gas; ++k) {
      for (int u = 0; u < n; ++u) e.gather(u);
      for (int u = n - 1; u >= 0; --u) {
        auto p = e.gather(u);
        auto g = e.grads(u);
        const UnitInfo& ui = e.layout().unit(u);
        const std::size_t numel = static_cast<std::size_t>(ui.numel), bytes = numel * dtype_size(t);
        std::vector<char> hp(bytes), hg(bytes);
        b.to_host(hp.data(), p.data(), bytes);
        std::vector<float> w(numel);
        for (std::size_t i = 0; i < numel; ++i) w[i] = load_as_f32(hp.data(), i, t);
        auto mg = micro_grad(u, w, s, k, rank, world, gas, micro);
        const float scale = e.loss_scale();
        b.to_host(hg.data(), g.data(), bytes);
        for (std::size_t i = 0; i < numel; ++i)
          store_from_f32(hg.data(), i, t, load_as_f32(hg.data(), i, t) + scale * mg[i]);
        if (s == c.inf_step && k == 0 && rank == 0 && u == 0)
          store_from_f32(hg.data(), 0, t, std::numeric_limits<float>::infinity());
        b.from_host(g.data(), hg.data(), bytes);
        // A delayed compute stream: the reduction's kernels (bucket copies, accumulation) run
        // late, so a collective or a copy that does not wait for them reads old data.
        if (c.spin && b.compute_stream()) spin(static_cast<cudaStream_t>(b.compute_stream()));
        e.reduce(u);
      }
    }
    // The optimizer's kernels run late: the all-gather of updated slices and the offload copies
    // must wait for them, or the parameters come out stale.
    if (c.spin && b.compute_stream()) spin(static_cast<cudaStream_t>(b.compute_stream()));
    StepOptions opts;
    if (c.loop_controls) {
      e.set_lr(loop_lr(s));
      opts.skip = s == 2;
      opts.clip_coefficient = std::min(1.0, 0.05 / (e.grad_norm().norm + 1e-6));
    }
    results.push_back(e.step(opts));
  }
}

struct Run {
  std::vector<std::vector<float>> params, master;
  std::vector<StepResult> steps;
  MemoryReport mem;
  std::int64_t allocated = 0, reserved = 0;
};

Run run(const Case& c, const std::string& kind, int steps = 5) {
  Engine e(ctx(), make_config(c, kind), c.mixed_decay ? make_mixed_decay_layout() : make_layout());
  Backend& b = engine_backend(e);
  REQUIRE(std::string(b.name()) == kind);
  cudaStream_t user = nullptr;
  if (c.user_stream && kind == "cuda") {
    REQUIRE(cudaStreamCreateWithFlags(&user, cudaStreamNonBlocking) == cudaSuccess);
    b.set_compute_stream(user);
  }
  e.init_params(init_value);
  Run r;
  train(e, b, c, steps, r.steps);
  for (int u = 0; u < e.layout().num_units(); ++u) {
    r.params.push_back(e.full_params(u));
    r.master.push_back(e.full_master(u));
  }
  r.mem = e.memory();
  r.allocated = b.bytes_allocated();
  r.reserved = b.bytes_reserved();
  if (user) {
    b.set_compute_stream(nullptr);
    cudaStreamSynchronize(user);
    cudaStreamDestroy(user);
  }
  return r;
}

double ulp(DType t, double x) {
  const int bits = t == DType::f32 ? 23 : (t == DType::bf16 ? 7 : 10);
  int e = 0;
  std::frexp(std::max(std::abs(x), 1e-30), &e);
  return std::ldexp(1.0, e - 1 - bits);
}

// Clipping (by the config or the loop) scales by a coefficient from the norm, whose sum of
// squares the device adds in another order: equal to rounding, not bit for bit.
// Lamb's trust ratio and Adafactor's update scale likewise come from sums of squares the device
// adds in another order; Muon's Newton-Schulz products are bf16 on the device. Offloaded, all
// three are stepped by the host kernels on both backends, from staged gradients.
bool bitwise_expected(const Case& c) {
  const bool device_statistics =
      c.offload == "none" && (c.optimizer == "Lamb" || c.optimizer == "Adafactor" || c.optimizer == "Muon");
  return c.clip == 0.0 && !c.loop_controls && !device_statistics &&
         (c.host_reduced || test_comm() == "mpi" || ctx().world_size() == 1);
}

void compare_values(const std::vector<std::vector<float>>& got, const std::vector<std::vector<float>>& want, DType t,
                    bool bitwise, const char* what) {
  REQUIRE(got.size() == want.size());
  for (std::size_t u = 0; u < got.size(); ++u) {
    REQUIRE(got[u].size() == want[u].size());
    for (std::size_t i = 0; i < got[u].size(); ++i) {
      const double g = got[u][i], w = want[u][i];
      const double tol = bitwise ? 0.0 : 2.0 * ulp(t, std::max(std::abs(w), 0.25));
      const bool same = bitwise ? std::memcmp(&got[u][i], &want[u][i], sizeof(float)) == 0 : std::abs(g - w) <= tol;
      if (!same) {
        INFO(what << ": unit " << u << " element " << i << ": cuda " << g << " host " << w << " tolerance " << tol);
        REQUIRE(same);
      }
    }
  }
}

void check_parity(const Case& c) {
  INFO(c.name() << " via " << test_comm() << " on " << ctx().world_size() << " ranks");
  const Run host = run(c, "host");
  const Run dev = run(c, "cuda");
  const bool bitwise = bitwise_expected(c);
  REQUIRE(dev.steps.size() == host.steps.size());
  for (std::size_t s = 0; s < host.steps.size(); ++s) {
    INFO("step " << s);
    CHECK(dev.steps[s].skipped == host.steps[s].skipped);
    CHECK(dev.steps[s].loss_scale == host.steps[s].loss_scale);
    CHECK(dev.steps[s].lr == host.steps[s].lr);
    const double gn = dev.steps[s].grad_norm, hn = host.steps[s].grad_norm;
    if (std::isfinite(hn))
      CHECK(std::abs(gn - hn) <= (bitwise ? 1e-12 : 1e-2) * std::max(hn, 1e-30));
    else
      CHECK_FALSE(std::isfinite(gn));
  }
  compare_values(dev.params, host.params, c.dtype, bitwise, "parameters");
  // Master weights are fp32; their tolerance follows the compute dtype's noise.
  compare_values(dev.master, host.master, bitwise ? DType::f32 : c.dtype, bitwise, "master");
  // The same storage decisions on both backends.
  CHECK(dev.mem.params == host.mem.params);
  CHECK(dev.mem.grads == host.mem.grads);
  CHECK(dev.mem.master == host.mem.master);
  CHECK(dev.mem.optimizer == host.mem.optimizer);
  CHECK(dev.mem.comm_buffers == host.mem.comm_buffers);
  CHECK(dev.mem.gathered == host.mem.gathered);
  CHECK(dev.mem.offloaded_host == host.mem.offloaded_host);
  CHECK(dev.mem.offloaded_nvme == host.mem.offloaded_nvme);
  // Device memory held: at least the model state kept on the device, all of it accounted.
  CHECK(dev.allocated >= dev.mem.params + dev.mem.grads + dev.mem.master + dev.mem.optimizer);
  CHECK(dev.reserved >= dev.allocated);
}

std::string knobs(bool odd) {
  return std::string("  overlap_comm: ") + (odd ? "true" : "false") + "\n" +
         "  reduce_bucket_size: " + (odd ? "64" : "500000000") + "\n" +
         "  allgather_bucket_size: " + (odd ? "100" : "500000000") + "\n" +
         "  stage3_param_persistence_threshold: " + (odd ? "20" : "0") + "\n" +
         "  stage3_prefetch_bucket_size: " + (odd ? "300" : "50000000") + "\n" +
         "  stage3_max_live_parameters: " + (odd ? "1200" : "1000000000") + "\n" +
         "  stage3_max_reuse_distance: " + (odd ? "0" : "1000000000") + "\n";
}

// A CUDA run that keeps per-rank state (PowerSGD's, qgZ's) through a checkpoint: the host
// backend's state after 3 steps; the CUDA run's state then, saved into `root`, and its
// parameters 3 steps later; a run resumed from `root`: its loaded state and its parameters
// after the same 3 steps.
struct Resumed {
  std::vector<float> host_state, saved, loaded;
  std::vector<std::vector<float>> straight, resumed;
};

Resumed resume_run(const Case& c, const std::string& root) {
  Resumed r;
  std::vector<StepResult> results;
  {
    Engine e(ctx(), make_config(c, "host"), make_layout());
    e.init_params(init_value);
    train(e, engine_backend(e), c, 3, results);
    r.host_state = EngineState(e).rank_state();
  }
  {
    Engine e(ctx(), make_config(c, "cuda"), make_layout());
    Backend& b = engine_backend(e);
    e.init_params(init_value);
    train(e, b, c, 3, results);
    save_checkpoint(e, root);
    r.saved = EngineState(e).rank_state();
    train(e, b, c, 3, results, 3);
    for (int u = 0; u < e.layout().num_units(); ++u) r.straight.push_back(e.full_params(u));
  }
  {
    Engine e(ctx(), make_config(c, "cuda"), make_layout());
    load_checkpoint(e, root);
    r.loaded = EngineState(e).rank_state();
    train(e, engine_backend(e), c, 3, results, 3);
    for (int u = 0; u < e.layout().num_units(); ++u) r.resumed.push_back(e.full_params(u));
  }
  return r;
}

}  // namespace

TEST_CASE("CUDA engine parity with the host backend: every stage x dtype x offload", "[engine]") {
  int idx = 0;
  for (int stage = 0; stage <= 3; ++stage)
    for (DType t : {DType::f32, DType::bf16, DType::f16})
      for (const char* offload : {"none", "cpu", "nvme"}) {
        if (stage == 0 && std::string(offload) != "none") continue;  // optimizer offload needs stage >= 1
        ++idx;
        Case c;
        c.stage = stage;
        c.dtype = t;
        c.offload = offload;
        c.gas = idx % 2 == 0 ? 2 : 1;
        c.clip = idx % 3 == 0 ? 0.05 : 0.0;
        c.extra = knobs(idx % 2 == 1);
        SECTION(c.name()) { check_parity(c); }
      }
}

// Accumulation in the compute dtype where asked (bf16 over 3 micro-steps), and fp32 where asked
// without accumulation: both backends, every stage.
TEST_CASE("CUDA engine parity with data_types.grad_accum_dtype given", "[engine]") {
  for (int stage = 0; stage <= 3; ++stage)
    for (const char* accum : {"bf16", "fp32"}) {
      Case c;
      c.stage = stage;
      c.dtype = DType::bf16;
      c.accum = accum;
      c.gas = std::string(accum) == "bf16" ? 3 : 1;
      c.offload = stage >= 1 && std::string(accum) == "fp32" ? "cpu" : "none";  // fp32 gradients to the host
      c.extra = knobs(stage % 2 == 1);
      SECTION(c.name()) { check_parity(c); }
    }
}

// The CUDA kernels step each owned range in runs that agree on weight decay, as the host does
// (Lamb, Adafactor, Muon: each tensor's part in each slice; offloaded, every pass of theirs).
TEST_CASE("CUDA engine parity with per-parameter weight decay", "[engine]") {
  for (int stage = 0; stage <= 3; ++stage)
    for (const char* offload : {"none", "cpu", "nvme"}) {
      if (stage == 0 && std::string(offload) != "none") continue;
      for (const std::string opt : {"AdamW", "Adam", "SGD", "Lion", "Lamb", "Adafactor", "Muon"}) {
        Case c;
        c.stage = stage;
        c.dtype = DType::bf16;
        c.offload = offload;
        c.optimizer = opt;
        c.mixed_decay = true;
        c.extra = knobs(stage % 2 == 1);
        SECTION(c.name()) { check_parity(c); }
      }
    }
}

TEST_CASE("a late compute stream changes nothing: every consumer waits for its producer", "[engine][streams]") {
  for (int stage = 1; stage <= 3; ++stage)
    for (const char* offload : {"none", "cpu"}) {
      Case c;
      c.stage = stage;
      c.dtype = DType::bf16;
      c.offload = offload;
      c.gas = 2;
      c.spin = true;
      c.extra = knobs(true);
      SECTION(c.name() + " spin") { check_parity(c); }
    }
}

TEST_CASE("CUDA engine parity: SGD with momentum, and Adam with L2 decay", "[engine]") {
  Case sgd1;
  sgd1.stage = 1;
  sgd1.dtype = DType::bf16;
  sgd1.optimizer = "SGD";
  sgd1.offload = "cpu";
  sgd1.gas = 2;
  SECTION("SGD stage 1 bf16 offloaded") { check_parity(sgd1); }
  Case sgd3;
  sgd3.stage = 3;
  sgd3.optimizer = "SGD";
  sgd3.extra = knobs(true);
  SECTION("SGD stage 3 fp32") { check_parity(sgd3); }
  Case adam;
  adam.stage = 2;
  adam.dtype = DType::f16;
  adam.optimizer = "Adam";
  adam.gas = 2;
  SECTION("Adam stage 2 fp16") { check_parity(adam); }
}

TEST_CASE("an inf gradient on one rank skips the step everywhere, on both backends", "[engine]") {
  for (int stage : {0, 2, 3}) {
    Case c;
    c.stage = stage;
    c.dtype = DType::f16;
    c.inf_step = 1;
    c.extra = knobs(stage == 3);
    SECTION("stage " + std::to_string(stage)) {
      check_parity(c);
      const Run dev = run(c, "cuda");
      CHECK_FALSE(dev.steps[0].skipped);
      CHECK(dev.steps[1].skipped);
      CHECK_FALSE(std::isfinite(dev.steps[1].grad_norm));
      CHECK_FALSE(dev.steps[2].skipped);
    }
  }
}

TEST_CASE("the loop's learning rate, pre-step norm, skip and clip coefficient on the CUDA backend", "[engine]") {
  for (int stage : {1, 3}) {
    Case c;
    c.stage = stage;
    c.dtype = stage == 1 ? DType::bf16 : DType::f32;
    c.optimizer = stage == 1 ? "SGD" : "AdamW";
    c.gas = 2;
    c.loop_controls = true;
    c.extra = knobs(stage == 3);
    SECTION(c.name()) {
      check_parity(c);
      const Run dev = run(c, "cuda");
      for (int s = 0; s < 5; ++s) {
        CHECK(dev.steps[static_cast<std::size_t>(s)].lr == loop_lr(s));
        CHECK(dev.steps[static_cast<std::size_t>(s)].skipped == (s == 2));
      }
    }
  }
}

TEST_CASE("the engine on a user compute stream", "[engine][streams]") {
  Case c;
  c.stage = 3;
  c.dtype = DType::bf16;
  c.gas = 2;
  c.user_stream = true;
  c.extra = knobs(true);
  check_parity(c);
  Case o = c;
  o.stage = 2;
  o.offload = "cpu";
  check_parity(o);
}

TEST_CASE("the CUDA engine is repeatable bit for bit, clipping included", "[engine]") {
  for (int stage : {1, 3}) {
    Case c;
    c.stage = stage;
    c.dtype = DType::bf16;
    c.gas = 2;
    c.clip = 0.05;
    c.extra = knobs(true);
    const Run a = run(c, "cuda", 4), b = run(c, "cuda", 4);
    for (std::size_t u = 0; u < a.params.size(); ++u) {
      REQUIRE(a.params[u] == b.params[u]);
      REQUIRE(a.master[u] == b.master[u]);
    }
    for (std::size_t s = 0; s < a.steps.size(); ++s) REQUIRE(a.steps[s].grad_norm == b.steps[s].grad_norm);
  }
}

// ZeRO++ / MiCS on the device: hpZ's secondary gathers over a device communicator of its group,
// MiCS's backend over the shard group with the replica all-reduce on a device communicator of
// its own, qwZ's int8 gathers quantized by the backend's kernels, qgZ's hierarchical reduce-
// scatter with its error feedback in device memory and its all-to-alls on device communicators
// of the node and cross-node groups (test_cuda_engine_mpi_np4_nodes2 makes 2 nodes x 2 ranks, so
// both of its phases run). Each equals the host backend's run bit for bit over comm: mpi (the
// kernels equal the host quantizer byte for byte: test_cuda_quantize), and within the NCCL
// tolerance otherwise.
TEST_CASE("hpZ, MiCS, qwZ and qgZ on the CUDA backend equal the host backend", "[engine][zeropp]") {
  const int world = ctx().world_size();
  const int group = world % 2 == 0 ? 2 : world;      // hpZ: 1 (off) on one rank
  const int shard = world % 2 == 0 ? world / 2 : 1;  // MiCS: replicated groups where world > 1
  const std::string hpz = "  zero_hpz_partition_size: " + std::to_string(group) + "\n";
  const std::string qwz = "  zero_quantized_weights: true\n  zero_quantized_weights_block_size: 16\n";
  const std::string qgz = "  zero_quantized_gradients: true\n";
  for (DType t : {DType::f32, DType::bf16}) {
    Case c;
    c.stage = 3;
    c.dtype = t;
    c.gas = 2;
    c.extra = knobs(true) + hpz;
    SECTION("hpZ " + c.name()) { check_parity(c); }
    c.extra = knobs(false) + qwz;
    SECTION("qwZ " + c.name()) { check_parity(c); }
    c.extra = knobs(true) + hpz + qwz;
    SECTION("hpZ + qwZ " + c.name()) { check_parity(c); }
    c.extra = knobs(true) + hpz + qwz + qgz;
    // With the compute stream held back before each reduce and step: the quantize kernels before
    // qwZ's all-gathers and qgZ's all-to-alls, and hpZ's chunk copies, then finish late, so a
    // collective that does not wait for them sends stale bytes.
    Case late = c;
    late.spin = true;
    SECTION("hpZ + qwZ + qgZ " + c.name() + " spin") { check_parity(late); }
    Case g = c;
    g.stage = 2;
    g.extra = knobs(false) + qgz;
    SECTION("qgZ " + g.name()) { check_parity(g); }
    for (int stage : {1, 2, 3}) {
      Case m = c;
      m.stage = stage;
      m.extra = knobs(stage % 2 == 1) + "  mics_shard_size: " + std::to_string(shard) + "\n";
      SECTION("MiCS " + std::to_string(shard) + " " + m.name()) { check_parity(m); }
    }
  }
}

// qgZ's error-feedback buffers are device memory on CUDA: after the same steps they equal the
// host backend's (bit for bit where the sums are the host communicator's), a checkpoint reads
// them back from the device, and a resume writes them to it and goes on bit for bit. One rank
// keeps none (no node peer, one node); test_cuda_engine_mpi_np4_nodes2 fills both phases' buffers.
TEST_CASE("qgZ on the CUDA backend: error feedback equals the host's, checkpoint resume is bit for bit",
          "[engine][zeropp][checkpoint]") {
  for (int stage : {2, 3}) {
    Case c;
    c.stage = stage;
    c.dtype = DType::bf16;
    c.gas = 2;
    c.extra = knobs(stage == 3) + "  zero_quantized_gradients: true\n";
    INFO(c.name() << " via " << test_comm() << " on " << ctx().world_size() << " ranks");
    const Resumed r = resume_run(c, process_scratch_dir("gpu_qgz") + "/qgz_stage" + std::to_string(stage));
    if (ctx().world_size() == 1)
      CHECK(r.saved.empty());
    else
      REQUIRE_FALSE(r.saved.empty());
    REQUIRE(r.saved.size() == r.host_state.size());
    if (bitwise_expected(c)) CHECK(r.saved == r.host_state);
    CHECK(r.loaded == r.saved);
    CHECK(r.resumed == r.straight);
  }
}

// PowerSGD on CUDA stages the accumulated gradients through the host and runs the host
// compressor over the host communicator: the same arithmetic as the host backend's, so the
// parameters are expected bit for bit whatever `comm` is (no clipping). Rank 1 with
// min_compression_rate 1 compresses make_layout()'s three matrices (7x5, 11x3, 4x4); start_step 1
// runs one plain step first, and the overflow case must skip on both without touching the state.
TEST_CASE("PowerSGD on the CUDA backend equals the host backend", "[engine][powersgd]") {
  const std::string psgd =
      "gradient_compression:\n  type: powersgd\n  rank: 1\n  start_step: 1\n  min_compression_rate: 1\n";
  for (int stage : {0, 1}) {
    for (DType t : {DType::f32, DType::bf16, DType::f16}) {
      Case c;
      c.stage = stage;
      c.dtype = t;
      c.gas = 2;
      c.extra = knobs(stage == 1);
      c.top = psgd;
      c.host_reduced = true;
      if (t == DType::f16) c.inf_step = 2;
      SECTION("PowerSGD " + c.name()) {
        check_parity(c);
        // The compressor ran: the host run differs from the same run without it.
        Case plain = c;
        plain.top.clear();
        const Run a = run(c, "host"), b = run(plain, "host");
        bool differs = false;
        for (std::size_t u = 0; u < a.params.size(); ++u) differs = differs || a.params[u] != b.params[u];
        CHECK(differs);
        CHECK(a.mem.comm_buffers > b.mem.comm_buffers);
      }
    }
  }
}

// The CUDA run's PowerSGD state (error buffers and Q, host memory) equals the host backend's
// after the same steps, a checkpoint saves it, and a resume goes on bit for bit.
TEST_CASE("PowerSGD on the CUDA backend: checkpoint resume is bit for bit", "[engine][powersgd][checkpoint]") {
  for (int stage : {0, 1}) {
    Case c;
    c.stage = stage;
    c.dtype = stage == 1 ? DType::bf16 : DType::f32;
    c.top = "gradient_compression:\n  type: powersgd\n  rank: 1\n  min_compression_rate: 1\n";
    c.host_reduced = true;
    INFO(c.name());
    const Resumed r = resume_run(c, process_scratch_dir("gpu_powersgd") + "/stage" + std::to_string(stage));
    REQUIRE_FALSE(r.saved.empty());
    CHECK(r.saved == r.host_state);
    CHECK(r.loaded == r.saved);
    CHECK(r.resumed == r.straight);
  }
}
