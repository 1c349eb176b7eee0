// The planner's formulas against values worked out by hand: the ZeRO model-state formula,
// padding, the persistence threshold, offload, the GPT parameter count and activations, the
// step time and the derived figures, fitting, user GPU presets and the max-model search.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include "zero/error.hpp"
#include "zero/plan.hpp"

using namespace zero;
using namespace zero::plan;

namespace {

// Two units whose sizes split into 128-byte-aligned slices for 1, 2 and 4 ranks: no padding,
// so the bytes are exactly the ZeRO paper's formula.
Layout aligned_layout() {
  Layout l;
  l.add_unit("a", {{"w", {768, 256}}});  // 196608 = 256 * 768
  l.add_unit("b", {{"w", {2560}}});      // 2560 = 256 * 10
  return l;
}
constexpr std::int64_t kPsi = 196608 + 2560;

Settings bf16_stage(int stage) {
  Settings s;
  s.stage = stage;
  s.dtype = DType::bf16;
  s.persistence_threshold = 0;
  return s;
}

}  // namespace

TEST_CASE("model states follow the ZeRO formula when nothing is padded", "[plan]") {
  const Layout l = aligned_layout();
  for (std::int64_t N : {1, 2, 4}) {
    const int n = static_cast<int>(N);
    CHECK(model_states(l, bf16_stage(0), n).device() == 16 * kPsi);
    CHECK(model_states(l, bf16_stage(1), n).device() == 4 * kPsi + 12 * kPsi / N);
    CHECK(model_states(l, bf16_stage(2), n).device() == 2 * kPsi + 14 * kPsi / N);
    CHECK(model_states(l, bf16_stage(3), n).device() == 16 * kPsi / N);
  }
  // The split by category at stage 2, 4 ranks.
  ModelStates m = model_states(l, bf16_stage(2), 4);
  CHECK(m.params == 2 * kPsi);
  CHECK(m.grads == 2 * kPsi / 4);
  CHECK(m.master == 4 * kPsi / 4);
  CHECK(m.optimizer == 8 * kPsi / 4);
  CHECK(m.host == 0);
  CHECK(m.nvme == 0);
}

TEST_CASE("gradients accumulate in fp32 with accumulation over 16-bit compute, as on the CUDA backend", "[plan]") {
  const Layout l = aligned_layout();
  Settings s = bf16_stage(2);
  CHECK(s.grad_dtype() == DType::bf16);  // one micro-step
  CHECK(model_states(l, s, 4).grads == 2 * kPsi / 4);
  s.grad_accum = 8;
  CHECK(s.grad_dtype() == DType::f32);
  CHECK(model_states(l, s, 4).grads == 4 * kPsi / 4);
  CHECK(model_states(l, s, 4).device() == 2 * kPsi + 16 * kPsi / 4);
  s.grad_accum_dtype = GradAccumDType::bf16;  // data_types.grad_accum_dtype: bf16
  CHECK(model_states(l, s, 4).grads == 2 * kPsi / 4);
  s.grad_accum_dtype = GradAccumDType::fp32;
  s.grad_accum = 1;
  CHECK(model_states(l, s, 4).grads == 4 * kPsi / 4);
  // Stages 0 and 1 reduce the fp32 sum at the boundary: twice the bytes of a bf16 reduction.
  Settings z0 = bf16_stage(0), z0_fp32 = z0;
  z0_fp32.grad_accum_dtype = GradAccumDType::fp32;
  Cluster c;
  c.gpus = 8;
  c.gpu = gpu_preset("H100-SXM");
  const GptShape shape = gpt_preset("gpt2");
  const double t16 = make_plan(shape, c, z0, 1e9).time.comm_s, t32 = make_plan(shape, c, z0_fp32, 1e9).time.comm_s;
  CHECK(t16 > 0);
  CHECK(t32 == Approx(2 * t16));
}

TEST_CASE("padding: a slice rounds up to 64 elements, every rank holds one", "[plan]") {
  Layout l;
  l.add_unit("u", {{"w", {1000}}});
  // 3 ranks: ceil(1000 / 3) = 334 -> 384 per slice, 1152 padded.
  ModelStates m = model_states(l, bf16_stage(1), 3);
  CHECK(m.params == 1152 * 2);
  CHECK(m.grads == 1152 * 2);
  CHECK(m.master == 384 * 4);
  CHECK(m.optimizer == 384 * 8);
  // Stage 0 keeps the padded unit whole (padded for its world size: 1024 at one rank).
  CHECK(model_states(l, bf16_stage(0), 1).device() == 1024 * 16);
}

TEST_CASE("stage 3 keeps units below the persistence threshold whole", "[plan]") {
  Layout l;
  l.add_unit("big", {{"w", {4096}}});
  l.add_unit("small", {{"w", {100}}});
  Settings s = bf16_stage(3);
  s.persistence_threshold = 1000;
  // 2 ranks: big splits 2048 + 2048; small is 64-aligned to 64 per slice, 128 padded, kept whole.
  ModelStates m = model_states(l, s, 2);
  CHECK(m.params == (2048 + 128) * 2);
  CHECK(m.grads == (2048 + 64) * 2);
  CHECK(m.master == (2048 + 64) * 4);
}

TEST_CASE("offload moves the optimizer part to host or NVMe, parameter offload the shard", "[plan]") {
  const Layout l = aligned_layout();
  Settings s = bf16_stage(2);
  s.offload_optimizer = OffloadDevice::cpu;
  ModelStates m = model_states(l, s, 4);
  CHECK(m.device() == 2 * kPsi + 2 * kPsi / 4);
  CHECK(m.host == 12 * kPsi / 4);
  s.offload_optimizer = OffloadDevice::nvme;
  m = model_states(l, s, 4);
  CHECK(m.host == 0);
  CHECK(m.nvme == 12 * kPsi / 4);
  s = bf16_stage(3);
  s.offload_optimizer = OffloadDevice::nvme;
  s.offload_param = OffloadDevice::nvme;
  m = model_states(l, s, 4);
  CHECK(m.device() == 2 * kPsi / 4);  // only the gradient slice stays
  CHECK(m.nvme == 14 * kPsi / 4);
  // SGD keeps one moment: 8 bytes of optimizer state per element instead of 12.
  s = bf16_stage(1);
  s.moments = 1;
  CHECK(model_states(l, s, 2).device() == 4 * kPsi + 8 * kPsi / 2);
}

TEST_CASE("GPT shapes: parameter count and the trainer's layout", "[plan]") {
  // GPT-2 small with the vocabulary padded to 50304: llm.c's 124,475,904.
  const GptShape g = gpt_preset("gpt2");
  CHECK(g.num_params() == 124475904);
  CHECK(gpt_layout(g).num_params() == g.num_params());
  CHECK(gpt_layout(g).num_units() == 14);
  CHECK(gpt_preset("bloom-7b").num_params() / 100000000 == 70);  // 7.07B
  CHECK_THROWS_WITH(gpt_preset("gtp2"), Catch::Contains("did you mean 'gpt2'"));
  GptFamily f;
  const GptShape s = f.shape(12288);
  CHECK(s.n_layer == 96);
  CHECK(s.n_head == 96);
  CHECK(std::abs(static_cast<double>(f.closest(175e9).num_params()) - 175e9) < 3e9);
}

TEST_CASE("activation bytes: the trainer's buffers, worked by hand", "[plan]") {
  // B=1, T=2, C=2, NH=1, L=1, V=100 (padded 128): N=2, NC=4.
  // Elements: block 15*4 = 60; residual 2*4 = 8; ln_f 4; logits 256; backward 9*4 = 36: 364.
  // fp32 (host, probabilities att = 4): block 4*2 + 4 = 12; ln_f stats + losses 6; scratch 4: 22.
  // 386 floats = 1544 bytes, + 2*2 int32 ids = 1560.
  using zero::plan::AttentionStore;
  const auto probs = AttentionStore::probabilities, rows = AttentionStore::row_statistics;
  GptShape s{"", 1, 1, 2, 2, 100};
  CHECK(activation_bytes(s, 1, false, 4, probs) == 1560);
  // Three blocks without checkpointing keep two more blocks (2*72) and two more residuals (2*4).
  s.n_layer = 3;
  CHECK(activation_bytes(s, 1, false, 4, probs) == 1560 + 4 * (2 * 72 + 2 * 4));
  CHECK(activation_bytes(s, 1, true, 4, probs) == 1560 + 4 * (2 * 4));
  // bf16 elements with row statistics (B*NH*T = 2 per block and 2 of scratch): 372 elements
  // (two more residuals) at 2 bytes, fp32 (8 + 2) + 6 + 2 = 18 at 4, ids 16.
  CHECK(activation_bytes(s, 1, true, 2, rows) == 372 * 2 + 18 * 4 + 16);
}

TEST_CASE("step time: compute at the stated efficiency, exposed collectives, the optimizer", "[plan]") {
  GptShape shape = gpt_preset("gpt2");
  Cluster c;
  c.gpu = gpu_preset("A100-80GB");
  c.gpu.efficiency = 0.5;
  c.gpus = 1;
  Settings s = bf16_stage(0);
  s.micro_batch = 4;
  s.grad_accum = 2;
  Plan p = make_plan(shape, c, s, 1e9);
  const double psi = 124475904;
  const double tokens = 4.0 * 2 * 1024;
  const double compute = 6 * psi * tokens / (312e12 * 0.5);
  // Stage 0 at one rank steps every (padded) element on the device: 30 bytes each through HBM,
  // 32 with the fp32 gradients that accumulation over bf16 gets by default.
  const double padded = static_cast<double>(model_states(gpt_layout(shape), s, 1).params) / 2;
  REQUIRE(s.grad_dtype() == DType::f32);
  const double optimizer = padded * 32 / 2039e9;
  CHECK(p.time.compute_s == Approx(compute));
  CHECK(p.time.comm_s == 0.0);
  CHECK(p.time.step_s == Approx(compute + optimizer));
  CHECK(p.tokens_per_s == Approx(tokens / (compute + optimizer)));
  CHECK(p.tflops_per_gpu == Approx(6 * psi * p.tokens_per_s / 1e12));
  CHECK(p.days == Approx(1e9 / p.tokens_per_s / 86400));

  // Stage 2 at 4 ranks in one node without overlap: a reduce-scatter per micro-step and an
  // all-gather after the step, each 3/4 of the padded bf16 model over NVLink (300 GB/s).
  c.gpus = 4;
  s = bf16_stage(2);
  s.overlap_comm = false;
  s.micro_batch = 1;
  s.activation_checkpointing = true;
  p = make_plan(shape, c, s, 1e9);
  const Layout l4 = gpt_layout(shape);
  double padded4 = 0;
  for (int u = 0; u < l4.num_units(); ++u) padded4 += static_cast<double>(l4.padded_numel(u, 4));
  const double ring = 0.75 * padded4 * 2 / 300e9;
  const double compute1 = 8 * psi * 1024 / (312e12 * 0.5);
  CHECK(p.time.comm_s == Approx(2 * ring));
  CHECK(p.time.step_s == Approx(compute1 + 2 * ring + padded4 / 4 * 30 / 2039e9));
  CHECK(p.tflops_per_gpu == Approx(8 * psi * p.tokens_per_s / (4 * 1e12)));
}

TEST_CASE("fitting names what does not fit", "[plan]") {
  Cluster c;
  c.gpu = gpu_preset("V100-32GB");
  c.gpus = 32;
  c.gpus_per_node = 4;
  c.host_bytes_per_gpu = 40e9;
  Settings s = bf16_stage(2);
  s.offload_optimizer = OffloadDevice::cpu;
  s.activation_checkpointing = true;
  Plan p = make_plan(gpt_preset("gpt-52b"), c, s);
  CHECK_FALSE(p.fits);
  CHECK_THAT(p.why, Catch::Contains("GPU memory"));
  s.stage = 3;
  p = make_plan(gpt_preset("gpt-52b"), c, s);
  CHECK(p.fits);
  // A cluster without NVMe cannot hold NVMe-offloaded state.
  s.offload_optimizer = OffloadDevice::nvme;
  p = make_plan(gpt_preset("gpt-52b"), c, s);
  CHECK_FALSE(p.fits);
  CHECK_THAT(p.why, Catch::Contains("NVMe"));
}

TEST_CASE("a near miss says by how much it does not fit", "[plan]") {
  Cluster c;
  c.gpu = gpu_preset("A100-80GB");
  const Settings s = bf16_stage(3);
  const Plan fits = make_plan(gpt_preset("gpt2"), c, s);
  REQUIRE(fits.fits);
  // 4 KiB short of what the plan needs: both sides print alike, so the excess is named.
  c.gpu.memory_bytes = static_cast<double>(fits.memory.gpu_bytes - 4096);
  const Plan p = make_plan(gpt_preset("gpt2"), c, s);
  CHECK_FALSE(p.fits);
  CHECK_THAT(p.why, Catch::Contains("GPU memory: ") && Catch::Contains("(by 4.0 KiB)"));
}

TEST_CASE("ranked plans and the largest model", "[plan]") {
  Cluster c;
  c.gpu = gpu_preset("H100-SXM");
  c.gpus = 8;
  SettingsSpace space;
  auto ranked = rank_plans(gpt_preset("gpt2-xl"), c, space);
  REQUIRE(ranked.size() > 1);
  for (std::size_t i = 1; i < ranked.size(); ++i) {
    CHECK(ranked[i].fits);
    CHECK(ranked[i - 1].tokens_per_s >= ranked[i].tokens_per_s);
  }
  GptFamily f;
  MaxModel r = max_model(f, c, space);
  REQUIRE(r.found);
  CHECK(r.best.fits);
  // One width step (128) more fits under no setting.
  CHECK(rank_plans(f.shape(r.best.shape.n_embd + 128), c, space).empty());
}

TEST_CASE("user GPU presets from YAML", "[plan]") {
  auto dir = std::filesystem::temp_directory_path() / "zero_plan_test_presets";
  std::filesystem::create_directories(dir);
  auto path = (dir / "gpus.yaml").string();
  std::ofstream(path) << "gpus:\n"
                         "  - name: my-a100\n    base: A100-80GB\n    efficiency: 0.4\n"
                         "  - name: toy\n    memory_gb: 8\n    peak_tflops: 10\n    efficiency: 0.5\n"
                         "    hbm_gbps: 100\n    pcie_gbps: 8\n    nvlink_gbps: 20\n";
  auto user = load_gpu_presets(path);
  REQUIRE(user.size() == 2);
  GpuSpec a = gpu_preset("my-a100", user);
  CHECK(a.efficiency == 0.4);
  CHECK(a.peak_flops == 312e12);
  CHECK(gpu_preset("toy", user).memory_bytes == 8e9);
  std::ofstream(path) << "- name: bad\n  base: H100-SXM\n  peak_tflop: 3\n";
  CHECK_THROWS_WITH(load_gpu_presets(path), Catch::Contains("did you mean 'peak_tflops'"));
  std::ofstream(path) << "- name: partial\n  memory_gb: 8\n";
  CHECK_THROWS_WITH(load_gpu_presets(path), Catch::Contains("lacks peak_tflops"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("a CUDA device's name finds its preset, and only when one describes it", "[plan]") {
  const double GiB = 1024.0 * 1024.0 * 1024.0;
  auto kind = [&](const char* name, double gib) {
    const auto g = zero::plan::gpu_preset_for_device(name, gib * GiB);
    return g ? g->name : std::string("none");
  };
  // Names as the driver reports them (cudaDeviceProp::name) and their usable memory.
  CHECK(kind("NVIDIA H100 80GB HBM3", 79.1) == "H100-SXM");
  CHECK(kind("NVIDIA H200", 139.8) == "H200");
  CHECK(kind("NVIDIA A100-SXM4-80GB", 79.2) == "A100-80GB");
  CHECK(kind("NVIDIA A100-SXM4-40GB", 39.4) == "A100-40GB");
  CHECK(kind("Tesla V100-SXM2-32GB", 31.7) == "V100-32GB");
  CHECK(kind("Tesla V100-SXM2-16GB", 15.8) == "V100-16GB");
  // Other peaks than the presets': the PCIe and NVL H100s, and unknown kinds.
  CHECK(kind("NVIDIA H100 PCIe", 79.1) == "none");
  CHECK(kind("NVIDIA H100 NVL", 93.0) == "none");
  CHECK(kind("NVIDIA GeForce RTX 4090", 23.6) == "none");
  CHECK(zero::plan::gpu_preset_for_device("NVIDIA H100 80GB HBM3", 79.1 * GiB)->peak_flops == 989e12);
}
