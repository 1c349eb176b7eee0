// The planner's formulas against values worked out by hand: the ZeRO model-state formula,
// padding, the persistence threshold, offload, the GPT parameter count and activations, the
// step time and the derived figures, fitting, user GPU presets and the max-model search.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include "zero/plan/autotune.hpp"
#include "zero/error.hpp"
#include "zero/plan/plan.hpp"

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

// `gpus` of one kind, `per_node` to a node, `inter` bytes/s between nodes.
Cluster cluster_of(const char* kind, int gpus, int per_node, double inter) {
  Cluster c;
  c.gpu = gpu_preset(kind);
  c.gpus = gpus;
  c.gpus_per_node = per_node;
  c.inter_node_bytes_per_s = inter;
  return c;
}

// A100-80GB at half the peak (312 TFLOP/s, NVLink 300 GB/s): round numbers for the times.
Cluster a100_at_half(int gpus) {
  Cluster c = cluster_of("A100-80GB", gpus, 8, 25e9);
  c.gpu.efficiency = 0.5;
  return c;
}

// V100-32GB nodes of 4 GPUs (NVLink 150 GB/s), 50 GB/s between nodes, as in the validation.
Cluster v100_nodes(int gpus) { return cluster_of("V100-32GB", gpus, 4, 50e9); }

Settings bf16_stage(int stage) {
  Settings s;
  s.stage = stage;
  s.dtype = DType::bf16;
  s.persistence_threshold = 0;
  return s;
}

// One micro-batch size, no checkpointing; qgZ off and on, MiCS off and 8 ranks, PowerSGD off and rank 4.
SettingsSpace across_nodes_space(int micro) {
  SettingsSpace space;
  space.micro_batches = {micro};
  space.checkpointing = {false};
  space.quantized_gradients = {false, true};
  space.mics_shard_size = {-1, 8};
  space.powersgd_rank = {0, 4};
  return space;
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

TEST_CASE("MiCS and hpZ memory per rank: the stage formulas with the group size, hpZ's 2 Psi / N", "[plan]") {
  const Layout l = aligned_layout();
  // MiCS over groups of 2 of 8 data-parallel ranks: the formulas with N = 2, not 8.
  for (int stage = 1; stage <= 3; ++stage) {
    Settings s = bf16_stage(stage);
    s.mics_shard_size = 2;
    CHECK(model_states(l, s, 8).device() == model_states(l, bf16_stage(stage), 2).device());
  }
  Settings s = bf16_stage(3);
  s.mics_shard_size = 2;
  CHECK(model_states(l, s, 8).device() == 16 * kPsi / 2);
  // hpZ over groups of 4 of 8 ranks: the stage-3 states, plus 2 bytes x Psi / 4.
  s = bf16_stage(3);
  s.hpz_partition_size = 4;
  const ModelStates h = model_states(l, s, 8);
  CHECK(h.device() == 16 * kPsi / 8);
  CHECK(h.secondary == 2 * kPsi / 4);
  CHECK(model_states(l, bf16_stage(3), 8).secondary == 0);
  // qgZ: fp32 error feedback of world - 1 slices (7/8 of Psi at 8 ranks), at stages 2 and 3.
  for (int stage : {2, 3}) {
    s = bf16_stage(stage);
    s.quantized_gradients = true;
    CHECK(model_states(l, s, 8).error_feedback == 4 * kPsi / 8 * 7);
    CHECK(model_states(l, s, 8).device() == model_states(l, bf16_stage(stage), 8).device());
  }
  CHECK(model_states(l, bf16_stage(3), 8).error_feedback == 0);
  // The engine's rules, named after the keys: {stage, mics, hpz} and the message.
  struct Bad {
    int stage, mics, hpz;
    const char* says;
  };
  for (const Bad& b :
       {Bad{0, 2, 1, "mics_shard_size 2 applies to stages 1-3"},
        Bad{2, 3, 1, "mics_shard_size 3 does not divide the 8 data-parallel ranks"}, Bad{3, 2, 2, "with hpZ"}}) {
    s = bf16_stage(b.stage);
    s.mics_shard_size = b.mics;
    s.hpz_partition_size = b.hpz;
    CHECK_THROWS_WITH(check_groups(s, 8), Catch::Contains(b.says));
  }
  s = bf16_stage(3);
  s.hpz_partition_size = 2;
  CHECK_NOTHROW(check_groups(s, 8));
}

TEST_CASE("MiCS moves the gradient sums across groups once per step, and fewer bytes through the slow links",
          "[plan]") {
  // 1.5B parameters on 2 nodes of 8 with a slow link: stage 3's gathers and reduce-scatters
  // cross it every micro-step, MiCS's only the slice's all-reduce at the end of the step.
  Cluster c;
  c.gpu = gpu_preset("H100-SXM");
  c.gpus = 16;
  c.gpus_per_node = 8;
  c.inter_node_bytes_per_s = 12.5e9;
  Settings s;
  s.stage = 3;
  s.micro_batch = 4;
  s.grad_accum = 4;
  s.activation_checkpointing = true;
  const Plan plain = make_plan(gpt_preset("gpt2-xl"), c, s);
  s.mics_shard_size = 8;
  const Plan mics = make_plan(gpt_preset("gpt2-xl"), c, s);
  CHECK(mics.time.comm_s < plain.time.comm_s);
  CHECK(mics.memory.states.device() > plain.memory.states.device());  // sharded 8 ways, not 16
  CHECK(mics.settings.label().find("mics 8") != std::string::npos);
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
  // The published parameter counts of the BLOOM and Llama checkpoints (their vocabularies need
  // no padding to 128): the shapes describe those models exactly.
  CHECK(gpt_preset("bloom-7b1").num_params() == 7069016064);
  CHECK(gpt_preset("bloom-560m").num_params() == 559214592);
  CHECK(gpt_preset("llama2-7b").num_params() == 6738415616);
  CHECK(gpt_preset("llama3-8b").num_params() == 8030261248);
  CHECK(gpt_preset("llama3.2-1b").num_params() == 1235814400);
  for (const char* name : {"bloom-7b1", "llama2-7b", "llama3-8b", "llama3.2-1b"})
    CHECK(gpt_layout(gpt_preset(name)).num_params() == gpt_preset(name).num_params());
  // Tensor parallelism cuts grouped-query heads by their key/value heads, or replicates those when
  // the tensor size is a multiple of them: then the attention's projections are whole on each
  // rank, and its qkv activation holds 32 / 16 query heads and one key and value head.
  CHECK_NOTHROW(check_split(gpt_preset("llama3-8b"), 8, 1));
  CHECK_FALSE(gpt_preset("llama3-8b").kv_replicated(8));
  CHECK(gpt_preset("llama3-8b").qkv_part_width(8) == (32 + 2 * 8) * 128 / 8);
  CHECK_NOTHROW(check_split(gpt_preset("llama3-8b"), 16, 1));
  CHECK(gpt_preset("llama3-8b").qkv_part_width(16) == (2 + 2) * 128);
  const Layout kv16 = gpt_part_layout(gpt_preset("llama3-8b"), PipelinePart{16, 1, 0});
  const UnitInfo& h0 = kv16.unit(kv16.find_unit("h.0"));
  for (const char* name : {"h.0.attn.c_attn.weight", "h.0.attn.c_proj.weight"}) {
    const ParamInfo& p = h0.params[static_cast<std::size_t>(h0.find_param(name))];
    CHECK(p.replicated);
    CHECK(p.numel == (std::string(name).find("c_attn") != std::string::npos ? 4096 * 6144 : 4096 * 4096));
  }
  const ParamInfo& fc = h0.params[static_cast<std::size_t>(h0.find_param("h.0.mlp.c_fc.weight"))];
  CHECK(fc.numel == 4096 * 2 * 14336 / 16);
  GptShape six = gpt_preset("llama3.2-1b");  // 32 query heads over 8 key/value heads
  six.n_head = 12;
  six.n_kv_head = 4;
  six.n_embd = 768;
  CHECK_THROWS_WITH(check_split(six, 6, 1), Catch::Contains("key/value heads divide neither way"));
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
  Cluster c = a100_at_half(1);
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
  Cluster c = v100_nodes(32);
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

// ---- Model parallelism: tensor x pipeline x data -----------------------------------------------

namespace {

// L 4, 4 heads, C 256, seq 16, vocab 100 (padded 128): every unit of a TP 2 part is a multiple of
// 128 elements, so sharding over 2 data-parallel ranks pads nothing.
GptShape small_grid_shape() { return GptShape{"", 4, 4, 256, 16, 100}; }

}  // namespace

TEST_CASE("grid: a rank's part of the model, split as Megatron splits it", "[plan][grid]") {
  const GptShape s = small_grid_shape();
  // A block on one of 2 TP ranks: qkv 256 x 384 + 384, proj 128 x 256 (+ 256 bias, replicated),
  // fc 256 x 512 + 512, fc proj 512 x 256 (+ 256 bias), LayerNorms 4 x 256 replicated.
  const std::int64_t block = 256 * 384 + 384 + 128 * 256 + 256 + 256 * 512 + 512 + 512 * 256 + 256 + 4 * 256;
  REQUIRE(block == 395648);
  const std::int64_t wte = 64 * 256, wpe = 16 * 256, ln_f = 512;
  // PP 2: blocks 0-1 and the embedding in part 0; blocks 2-3, ln_f and the tied head's copy in 1.
  const Layout first = gpt_part_layout(s, PipelinePart{2, 2, 0});
  const Layout last = gpt_part_layout(s, PipelinePart{2, 2, 1});
  CHECK(first.num_params() == wte + wpe + 2 * block);
  CHECK(last.num_params() == wte + 2 * block + ln_f);
  CHECK(first.num_units() == 3);
  CHECK(last.unit(last.num_units() - 2).name == "lm_head");
  // Summed over the TP ranks of one pipeline part: the whole model's blocks plus one more copy of what
  // is replicated (6 x C per block, wpe).
  const Layout whole = gpt_layout(s);
  const Layout tp1 = gpt_part_layout(s, PipelinePart{});
  CHECK(tp1.num_params() == whole.num_params());
  const Layout tp2 = gpt_part_layout(s, PipelinePart{2, 1, 0});
  CHECK(2 * tp2.num_params() == whole.num_params() + 4 * 6 * 256 + wpe + ln_f);
  // 5 blocks in 2 parts: 3 in the first, 2 in the last.
  GptShape five = s;
  five.n_layer = 5;
  CHECK(PipelinePart{1, 2, 0}.blocks(five) == 3);
  CHECK(PipelinePart{1, 2, 1}.blocks(five) == 2);
}

TEST_CASE("grid: per-rank memory of TP 2 x PP 2 x DP 2, worked by hand", "[plan][grid]") {
  const GptShape s = small_grid_shape();
  Cluster c;
  c.gpu = gpu_preset("A100-80GB");
  c.gpus = 8;
  Settings st = bf16_stage(1);
  st.tensor_parallel = 2;
  st.pipeline_parallel = 2;
  st.micro_batch = 1;
  st.grad_accum = 4;  // gradients accumulate in fp32
  const Plan p = make_plan(s, c, st);
  CHECK(p.data_parallel == 2);
  // Part 0: 811776 parameters; ZeRO stage 1: 2 x bf16 params, 4 x fp32 grads, 12 / 2 sharded.
  const std::int64_t part0 = 20480 + 2 * 395648;
  CHECK(p.memory_part == 0);
  CHECK(p.memory.states.params == 2 * part0);
  CHECK(p.memory.states.grads == 4 * part0);
  CHECK(p.memory.states.master + p.memory.states.optimizer == 12 * part0 / 2);
  // Activations of part 0, bf16, row statistics: N = 16 tokens, NC = 4096, per block 3 widths
  // replicated + 12 / 2 split = 9 x 4096 elements and 4 x 16 + 64 heads-rows / 2 fp32; kept per
  // micro-batch: 2 blocks, 3 residual boundaries, 16 token ids + 16 targets; 1F1B holds 2 micro-
  // batches (P 2 < m 4) in part 0. Once: dres, dtmp, dqkv / 2, dfc / 2 and 32 fp32 of scratch.
  const std::int64_t per_micro = (2 * 9 * 4096 + 3 * 4096) * 2 + 2 * (64 + 32) * 4 + 32 * 4;
  const std::int64_t once = (2 * 4096 + 3 * 4096 / 2 + 4 * 4096 / 2) * 2 + 32 * 4;
  CHECK(p.memory.activations == 2 * per_micro + once);
  // With one micro-batch per step, one is in flight.
  st.grad_accum = 1;
  CHECK(make_plan(s, c, st).memory.activations == per_micro + once);

  // TP 2 x DP 2 at stage 3 (no pipeline): the whole model's TP half, sharded over 2.
  c.gpus = 4;
  Settings z3 = bf16_stage(3);
  z3.tensor_parallel = 2;
  const Plan p3 = make_plan(s, c, z3);
  CHECK(p3.data_parallel == 2);
  CHECK(p3.memory.states.device() == 16 * (20480 + 4 * 395648 + 512) / 2);
}

TEST_CASE("grid: the 1F1B bubble and the model-parallel traffic in the step time", "[plan][grid]") {
  CHECK(pipeline_bubble(1, 8) == 0.0);
  CHECK(pipeline_bubble(4, 12) == Approx(3.0 / 15));
  CHECK(pipeline_bubble(16, 256) == Approx(15.0 / 271));
  CHECK_THROWS_AS(pipeline_bubble(0, 4), Error);

  const GptShape shape = gpt_preset("gpt2");  // 12 blocks, C 768
  const double psi = 124475904;
  const Cluster c = a100_at_half(2);
  // PP 2 x DP 1, stage 0, 6 micro-batches of 1: (6 + 1) slots of a forward and a backward of
  // half the model plus one send of 1024 x 768 bf16 each way over NVLink (300 GB/s).
  Settings s = bf16_stage(0);
  s.pipeline_parallel = 2;
  s.grad_accum = 6;
  Plan p = make_plan(shape, c, s);
  const double act = 1024.0 * 768 * 2;
  const double slot = 6 * psi / 2 * 1024 / (312e12 * 0.5) + 2 * act / 300e9;
  // After the drain the tied embedding's fp32 gradient (50304 x 768) is all-reduced between the
  // two parts: each rank sends and receives it once.
  const double tied = 50304.0 * 768 * 4 / 300e9;
  CHECK(p.time.bubble == Approx(1.0 / 7));
  CHECK(p.time.bubble_s == Approx(slot));
  CHECK(p.time.pp_comm_s == Approx(6 * 2 * act / 300e9 + tied));
  CHECK(p.time.step_s - p.time.optimizer_s == Approx(7 * slot + tied));
  // Tokens per step count the data-parallel replicas only: 6 x 1024.
  CHECK(p.tokens_per_s == Approx(6 * 1024 / p.time.step_s));

  // TP 2 x DP 1, stage 0, one micro-batch: half the compute per rank plus 4 all-reduces per block
  // of 1024 x 768 bf16 over 2 ranks (each moves half of it twice).
  s = bf16_stage(0);
  s.tensor_parallel = 2;
  p = make_plan(shape, c, s);
  const double tp = 12 * 4 * (2 * 0.5 * act / 300e9);
  CHECK(p.time.tp_comm_s == Approx(tp));
  CHECK(p.time.bubble_s == 0.0);
  CHECK(p.time.step_s - p.time.optimizer_s == Approx(6 * psi / 2 * 1024 / (312e12 * 0.5) + tp));
}

TEST_CASE("grid: a group's bandwidth, inside a node or sharing its NICs", "[plan][grid]") {
  const Cluster c = v100_nodes(64);
  CHECK(c.group_bytes_per_s(4, 1) == Approx(150e9));                  // TP 4 inside the node
  CHECK(c.group_bytes_per_s(16, 4) == Approx(50e9 / 4));              // DP 16 beside TP 4: four rings per node
  CHECK(c.group_bytes_per_s(64, 1) == Approx(c.ring_bytes_per_s()));  // the flat ring
  CHECK(c.group_bytes_per_s(32, 2) == Approx(50e9 / 2));
}

TEST_CASE("grid: invalid grids and stage combinations are clear errors", "[plan][grid]") {
  const GptShape gpt2 = gpt_preset("gpt2");  // 12 heads, 12 blocks
  struct Bad {
    int gpus, stage, tp, pp;
    const char* message;
  };
  const Bad cases[] = {
      {6, 1, 4, 1, "6 GPUs do not divide into tensor 4 x pipeline 1"},
      {8, 1, 8, 1, "n_head 12 is not a multiple"},
      {8, 2, 1, 2, "stage 2 with pipeline parallelism 2 is refused"},
      {8, 3, 1, 2, "stage 3 with pipeline parallelism 2 is refused"},
      {16, 1, 1, 16, "more pipeline parts than the 12 blocks"},
  };
  for (const Bad& b : cases) {
    Cluster c = a100_at_half(b.gpus);
    Settings s = bf16_stage(b.stage);
    s.tensor_parallel = b.tp;
    s.pipeline_parallel = b.pp;
    CHECK_THROWS_WITH(make_plan(gpt2, c, s), Catch::Contains(b.message));
  }
  // The enumeration leaves out what cannot be run.
  SettingsSpace space;
  space.tensor_parallel = {1, 3};
  space.pipeline_parallel = {1, 2};
  for (const Settings& e : space.expand(8)) {
    CHECK(e.tensor_parallel == 1);
    CHECK((e.pipeline_parallel == 1 || e.stage <= 1));
  }
}

TEST_CASE("grid: ranked plans take TP and PP only where they pay", "[plan][grid]") {
  Cluster c = v100_nodes(64);
  SettingsSpace space;
  space.base.dtype = DType::f16;
  space.tensor_parallel = {1, 2, 4};
  space.pipeline_parallel = {1, 2, 4, 8, 16};
  space.micro_batches = {1, 4};
  space.global_batch = 512;
  // A small model runs fastest as plain data parallelism: TP and PP only add traffic and bubble.
  auto small = rank_plans(gpt_preset("gpt2-medium"), c, space);
  REQUIRE_FALSE(small.empty());
  CHECK(small.front().settings.tensor_parallel == 1);
  CHECK(small.front().settings.pipeline_parallel == 1);
  // 13B at stages 0-1 fits only split across tensor and pipeline ranks (stage 1 over 64 ranks
  // keeps 6 bytes a parameter: 78 GB).
  space.stages = {0, 1};
  auto big = rank_plans(gpt_preset("gpt3-13b"), c, space);
  REQUIRE_FALSE(big.empty());
  for (const Plan& p : big) CHECK(p.settings.tensor_parallel * p.settings.pipeline_parallel > 1);
  // The largest model under TP 4 x PP 4 on 16 GPUs grows with the grid.
  c.gpus = 16;
  SettingsSpace mp;
  mp.stages = {0};
  mp.micro_batches = {1};
  mp.checkpointing = {true};
  mp.base.grad_accum = 4;
  GptFamily f;
  const MaxModel dp_only = max_model(f, c, mp);
  mp.tensor_parallel = {4};
  mp.pipeline_parallel = {4};
  const MaxModel grid = max_model(f, c, mp);
  REQUIRE(grid.found);
  REQUIRE(dp_only.found);
  CHECK(grid.best.params > 8 * dp_only.best.params);
  CHECK(grid.best.settings.tensor_parallel == 4);
}

TEST_CASE("grid: autotune's fit verdict is a rank's of the grid", "[plan][grid]") {
  const Cluster c = v100_nodes(64);
  Config cfg;
  cfg.zero_optimization.stage = 1;
  cfg.train_micro_batch_size_per_gpu = 1;
  cfg.gradient_accumulation_steps = 4;
  std::string why;
  // 13B at stage 1 over 64 data-parallel ranks: 6 bytes a parameter stay on every rank.
  CHECK_FALSE(plan_fits(gpt_preset("gpt3-13b"), c)(cfg, {}, why));
  CHECK_THAT(why, Catch::Contains("GPU memory"));
  // As one rank of TP 4 x PP 4 x DP 4 it holds 1/16 of the model.
  CHECK(plan_fits(gpt_preset("gpt3-13b"), c)(cfg, {4, 4}, why));
  // Stage 2 with a pipeline: the planner refuses it (autotune lists the candidate as refused).
  cfg.zero_optimization.stage = 2;
  CHECK_THROWS_WITH(plan_fits(gpt_preset("gpt3-13b"), c)(cfg, {4, 4}, why),
                    Catch::Contains("ZeRO stage 2 with pipeline parallelism 4 is refused"));
}

TEST_CASE("ZeRO++: hpZ and qwZ lead the ranking when the inter-node link is slow, and only then", "[plan]") {
  Cluster c;
  c.gpu = gpu_preset("H100-SXM");
  c.gpus = 16;
  c.gpus_per_node = 8;
  SettingsSpace space;
  space.stages = {3};
  space.micro_batches = {4};
  space.checkpointing = {true};
  space.hpz_partition_size = {1, 8};
  space.quantized_weights = {false, true};
  c.inter_node_bytes_per_s = 2e9;  // 16 Gbit/s per node: stage 3's gathers dominate
  auto slow = rank_plans(gpt_preset("gpt2-xl"), c, space);
  REQUIRE(slow.size() == 4);
  CHECK(slow.front().settings.hpz_partition_size == 8);
  CHECK(slow.front().settings.quantized_weights);
  CHECK(slow.back().settings.hpz_partition_size == 1);
  CHECK_FALSE(slow.back().settings.quantized_weights);
  CHECK(slow.front().time.step_s < 0.6 * slow.back().time.step_s);
  // Inside one node the links are all NVLink: hpZ saves nothing there.
  c.gpus = 8;
  space.quantized_weights = {false};
  auto one_node = rank_plans(gpt_preset("gpt2-xl"), c, space);
  REQUIRE(one_node.size() == 2);
  CHECK(one_node[0].time.step_s == Approx(one_node[1].time.step_s).epsilon(1e-9));
  // Other stages do not gather parameters; a group that does not divide the ranks is refused.
  Settings s;
  s.stage = 2;
  s.hpz_partition_size = 8;
  REQUIRE_THROWS_WITH(make_plan(gpt_preset("gpt2-xl"), c, s), Catch::Matchers::Contains("only stage 3"));
  s.stage = 3;
  s.hpz_partition_size = 3;
  REQUIRE_THROWS_WITH(make_plan(gpt_preset("gpt2-xl"), c, s),
                      Catch::Matchers::Contains("does not divide the 8 data-parallel ranks"));
}

TEST_CASE("across nodes: the candidates of qgZ, MiCS and PowerSGD follow the engine's rules", "[plan]") {
  const SettingsSpace space = across_nodes_space(4);
  // 16 ranks: stage 0 plain or PowerSGD; stage 1 plain, PowerSGD or MiCS (not both); stages 2
  // and 3 plain, qgZ or MiCS (not both).
  const auto all = space.expand(16);
  REQUIRE(all.size() == 2 + 3 + 3 + 3);
  for (const Settings& s : all) {
    CHECK_NOTHROW(check_groups(s, 16));
    CHECK((!s.powersgd() || s.stage <= 1));
    CHECK((!s.quantized_gradients || s.stage >= 2));
    CHECK((s.mics_shard_size == -1 || s.stage >= 1));
    CHECK(int(s.powersgd()) + int(s.quantized_gradients) + int(s.mics_shard_size != -1) <= 1);
    if (s.powersgd()) CHECK(s.label().find("powersgd 4") != std::string::npos);
  }
  // On 8 ranks a group of 8 is plain sharding: listed once, as plain.
  for (const Settings& s : space.expand(8)) CHECK(s.mics_shard_size == -1);
  // A lone qgZ or PowerSGD value (a config's) applies where it can and is off elsewhere.
  SettingsSpace cfg;
  cfg.micro_batches = {4};
  cfg.checkpointing = {false};
  cfg.base.quantized_gradients = true;
  cfg.base.compression.type = CompressionType::powersgd;
  cfg.base.compression.rank = 2;
  const auto fixed = cfg.expand(16);
  REQUIRE(fixed.size() == 4);
  for (const Settings& s : fixed) {
    CHECK(s.quantized_gradients == (s.stage >= 2));
    CHECK(s.powersgd() == (s.stage <= 1));
  }
  // What the engine refuses, named after its keys.
  Settings s;
  s.stage = 2;
  s.compression.type = CompressionType::powersgd;
  CHECK_THROWS_WITH(check_groups(s, 16), Catch::Contains("applies to stages 0 and 1"));
  s.stage = 1;
  s.mics_shard_size = 8;
  CHECK_THROWS_WITH(check_groups(s, 16), Catch::Contains("PowerSGD (gradient_compression) with MiCS"));
}

TEST_CASE("step time: qgZ's two phases and PowerSGD's factors, worked by hand", "[plan]") {
  Cluster c = cluster_of("A100-80GB", 16, 8, 1.25e9);  // two nodes, 10 Gbit/s each
  const GptShape shape = gpt_preset("gpt2");
  const Layout layout = gpt_layout(shape);
  auto padded = [&](int world) {
    double total = 0;
    for (int u = 0; u < layout.num_units(); ++u) total += static_cast<double>(layout.padded_numel(u, world));
    return total;
  };
  const double nvlink = c.gpu.nvlink_bytes_per_s, nic = c.inter_node_bytes_per_s;
  Settings s;
  s.overlap_comm = false;  // every collective on the step's critical path
  s.micro_batch = 4;
  s.grad_accum = 2;
  // qgZ at stage 2: per micro-step the bf16 ring reduce-scatter over 16 ranks (the whole NIC for
  // the one ring that leaves each node) becomes 7/8 of the gradient as int8 + scales over NVLink
  // and one slice (1/16) to the other node as int4 + scales over the rank's eighth of the NIC.
  s.stage = 2;
  const Plan plain2 = make_plan(shape, c, s);
  s.quantized_gradients = true;
  const Plan qgz = make_plan(shape, c, s);
  const double n = padded(16), scale = 4.0 / 256;
  const double ring = 15.0 / 16 * n * 2 / nic;
  const double two_phase = 7.0 / 8 * n * (1 + scale) / nvlink + 1.0 / 16 * n * (0.5 + scale) / (nic / 8);
  CHECK(plain2.time.step_s - qgz.time.step_s == Approx(2 * (ring - two_phase)).epsilon(1e-6));
  // PowerSGD at stage 0: the fp32 boundary all-reduce of the whole gradient (grad_accum 2: fp32
  // accumulation) becomes the all-reduce of the plain rest (fp32) and the factors (bf16), after
  // the backward, plus the compression compute.
  s = Settings{};
  s.overlap_comm = false;
  s.micro_batch = 4;
  s.grad_accum = 2;
  s.stage = 0;
  const Plan plain0 = make_plan(shape, c, s);
  s.compression.type = CompressionType::powersgd;
  s.compression.rank = 4;
  s.compression.factor_dtype = DType::bf16;
  const Plan psgd = make_plan(shape, c, s);
  const PowerSgdElements e = powersgd_elements(layout, s.compression);
  // wte [50304, 768], wpe [1024, 768] and every block's four matrices ([768, 2304], [768, 768],
  // [768, 3072], [3072, 768]) are compressed at rank 4; the rest are vectors.
  CHECK(e.compressed == 50304LL * 768 + 1024 * 768 + 12LL * (768 * 2304 + 768 * 768 + 768 * 3072 + 3072 * 768));
  CHECK(e.p == 4 * (50304 + 1024 + 12LL * (768 + 768 + 768 + 3072)));
  CHECK(e.q == 4 * (768 + 768 + 12LL * (2304 + 768 + 3072 + 768)));
  CHECK(e.compressed + e.plain == layout.num_params());
  CHECK(e.flops == Approx(4.0 * 4 * static_cast<double>(e.compressed)));
  const double all_reduce = 2.0 * 15 / 16 * n * 4 / nic;
  const double factors = 2.0 * 15 / 16 * (static_cast<double>(e.plain) * 4 + static_cast<double>(e.p + e.q) * 2) / nic;
  const double compute =
      e.flops / (c.gpu.peak_flops * c.gpu.efficiency) + static_cast<double>(e.compressed) * 40 / c.gpu.hbm_bytes_per_s;
  CHECK(psgd.time.compress_s == Approx(compute).epsilon(1e-9));
  CHECK(plain0.time.step_s - psgd.time.step_s == Approx(all_reduce - factors - compute).epsilon(1e-6));
  CHECK(psgd.time.step_s < 0.5 * plain0.time.step_s);
  // Its buffers in GPU memory: the fp32 error and Q of every compressed matrix, the fp32 P and
  // summed Q, the plain rest in fp32 (accumulated gradients), the bf16 wire copy of P or Q.
  const std::int64_t buffers = 4 * (e.compressed + 2 * e.q + e.p) + 4 * e.plain + 2 * std::max(e.p, e.q);
  CHECK(psgd.memory.comm_buffers - plain0.memory.comm_buffers == buffers);
  CHECK(psgd.memory.gpu_bytes - plain0.memory.gpu_bytes == buffers);
}

// qgZ's scratch (the engine's MemoryReport::qgz_buffers, test_plan_engine) for GPT-2 124M on
// two nodes of 8 GPUs (L 8, M 2), its 14 units in one reduce bucket (the default 5e8 elements).
// The reducer starts ln_f, h.11 .. h.0, embeddings, each taking its phase-1 messages (8 int8
// messages of its 2 slices sent, 8 received, in two buffers), then completes them in that order:
// the partial sum and the phase-2 messages of one unit at a time, given back to the pool, which
// reuses them for the next unit of the same size only.
TEST_CASE("memory: qgZ's scratch in comm_buffers, GPT-2 124M worked by hand", "[plan]") {
  const GptShape shape = gpt_preset("gpt2");
  const Layout layout = gpt_layout(shape);
  const Cluster c = cluster_of("A100-80GB", 16, 8, 1.25e9);
  Settings s;
  s.stage = 2;
  s.micro_batch = 4;
  REQUIRE(s.overlap_comm);
  REQUIRE(s.grad_accum == 1);
  REQUIRE(s.reduce_bucket_size > layout.num_params());
  // Slices for 16 ranks, in whole 64-element runs: embeddings 39419904 / 16, a block
  // 7087872 / 16 = 442992 -> 443008, ln_f 1536 / 16 = 96 -> 128.
  REQUIRE(layout.slice_numel(0, 16) == 2463744);
  REQUIRE(layout.slice_numel(1, 16) == 443008);
  REQUIRE(layout.slice_numel(13, 16) == 128);
  // Phase 1: a buffer of 8 int8 messages of 2 slices (a byte per value and a 4-byte scale per
  // 256, in whole words), two per unit, all out at once: 2.03 bytes per element of the bucket.
  const std::int64_t emb1 = 8 * (4927488 + 4 * 19248), block1 = 8 * (886016 + 4 * 3461), lnf1 = 8 * (256 + 4);
  const std::int64_t phase1 = 2 * (emb1 + 12 * block1 + lnf1);
  CHECK(phase1 == 252848960);
  // One at a time, per unit size: the fp32 partial sum of 2 slices, and two buffers of 2 int4
  // messages of one slice (half a byte per value and a 4-byte scale per 256).
  const std::int64_t partials = 4 * 2 * (2463744 + 443008 + 128);
  const std::int64_t phase2 = 2 * 2 * ((1231872 + 4 * 9624) + (221504 + 4 * 1731) + (64 + 4));
  const std::int64_t held = phase1 + partials + phase2;
  CHECK(held == 282099456);  // 269.0 MiB, 2.27 bytes per element of the model
  const Plan plain = make_plan(shape, c, s);
  s.quantized_gradients = true;
  const Plan qgz = make_plan(shape, c, s);
  CHECK(qgz_buffer_bytes(layout, s, 16, 8) == held);
  // Besides qgZ's pool, the reducer's scratch for each unit of the bucket (all out at once) is
  // an fp32 sum beside the slice in the compute dtype: 4 more bytes per element of a slice.
  const std::int64_t sums = 4 * (2463744 + 12 * 443008 + 128);
  CHECK(qgz.memory.comm_buffers - plain.memory.comm_buffers == held + sums);
  // And the node's and the cross-node group's communicators, split from the backend's.
  CHECK(qgz.memory.nccl_bytes - plain.memory.nccl_bytes == 2 * kNcclSharedCommBytes);
  CHECK(qgz.memory.gpu_bytes - plain.memory.gpu_bytes ==
        held + sums + qgz.memory.states.error_feedback + 2 * kNcclSharedCommBytes);
  // Two micro-steps with overlap_comm: the first micro-step's bucket is still in flight (all its
  // phase-1 messages out) when the second one's starts; without overlap it is not.
  s.grad_accum = 2;
  CHECK(qgz_buffer_bytes(layout, s, 16, 8) == held + phase1);
  s.overlap_comm = false;
  CHECK(qgz_buffer_bytes(layout, s, 16, 8) == held);
  // Nodes that split the ranks unevenly are refused, as by the engine.
  CHECK_THROWS_WITH(qgz_buffer_bytes(layout, s, 16, 6), Catch::Contains("same ranks on every node"));
  s.quantized_gradients = false;
  CHECK(qgz_buffer_bytes(layout, s, 16, 8) == 0);
}

TEST_CASE("across nodes: qgZ, MiCS and PowerSGD lead their stages on a slow link, and not on one node", "[plan]") {
  Cluster c = cluster_of("A100-80GB", 16, 8, 1.25e9);  // two nodes, 10 Gbit/s each
  const SettingsSpace space = across_nodes_space(8);
  const GptShape shape = gpt_preset("gpt2-medium");
  auto plain = [](const Plan& p) {
    return !p.settings.quantized_gradients && p.settings.mics_shard_size == -1 && !p.settings.powersgd();
  };
  // The fastest plan of each stage, and the plain one of that stage.
  auto best = [&](const std::vector<Plan>& ranked, int stage, bool want_plain) {
    for (const Plan& p : ranked)
      if (p.settings.stage == stage && plain(p) == want_plain) return p;
    FAIL("no plan at stage " << stage);
    return Plan{};
  };
  const auto slow = rank_plans(shape, c, space);
  REQUIRE(slow.size() == 11);
  CHECK_FALSE(plain(slow.front()));
  for (int stage = 0; stage <= 3; ++stage) {
    const Plan with = best(slow, stage, false), without = best(slow, stage, true);
    INFO("stage " << stage << ": " << with.settings.label());
    CHECK(with.tokens_per_s > 1.3 * without.tokens_per_s);
  }
  CHECK(best(slow, 0, false).settings.powersgd());
  // qgZ on its own beats plain stages 2 and 3 there.
  for (const Plan& p : slow)
    if (p.settings.quantized_gradients) CHECK(p.tokens_per_s > 1.2 * best(slow, p.settings.stage, true).tokens_per_s);
  // Inside one node every link is NVLink: nothing ranks ahead of plain at its stage.
  c.gpus = 8;
  const auto one_node = rank_plans(shape, c, space);
  for (int stage = 0; stage <= 3; ++stage) {
    INFO("stage " << stage);
    for (const Plan& p : one_node)
      if (p.settings.stage == stage && !plain(p)) CHECK(p.tokens_per_s <= best(one_node, stage, true).tokens_per_s);
  }
}

// Every NCCL communicator a rank creates takes device memory the model states do not show:
// the planner counts the ones a configuration creates on the CUDA backend (comm: nccl) and
// adds an allowance for each to the device overhead, less for those split from the backend's.
TEST_CASE("memory: an allowance for each NCCL communicator a configuration creates", "[plan]") {
  auto count = [](const Settings& s, int D, int per_node) {
    const NcclCommunicators n = nccl_communicators(s, D, per_node);
    return std::pair{n.own, n.shared};
  };
  Settings s = bf16_stage(3);
  CHECK(count(s, 8, 8) == std::pair{1, 0});  // the backend's
  CHECK(count(s, 1, 8) == std::pair{1, 0});
  s.hpz_partition_size = 8;
  CHECK(count(s, 16, 8) == std::pair{1, 1});  // hpZ's group, split
  s.hpz_partition_size = 1;
  s.quantized_gradients = true;
  CHECK(count(s, 16, 8) == std::pair{1, 2});  // qgZ's node and cross-node groups, split
  CHECK(count(s, 8, 8) == std::pair{1, 1});   // one node: no cross-node group
  CHECK(count(s, 4, 1) == std::pair{1, 1});   // a rank per node: no node group
  s.quantized_gradients = false;
  s.mics_shard_size = 8;
  CHECK(count(s, 16, 8) == std::pair{2, 0});  // MiCS's replica group, its own
  CHECK(count(s, 8, 8) == std::pair{1, 0});   // one group: no replicas
  s.mics_shard_size = -1;
  s.stage = 1;
  s.pipeline_parallel = 2;
  CHECK(count(s, 4, 8) == std::pair{2, 0});  // the trainer's pipeline group
  s.tensor_parallel = 2;
  CHECK(count(s, 4, 8) == std::pair{3, 0});  // and the trainer's tensor group
  CHECK(nccl_communicators(s, 4, 8).bytes() == 3 * kNcclCommBytes);

  // In the plan: the device overhead holds the allowance, and hpZ adds its group's.
  const GptShape shape = gpt_preset("gpt2");
  const Cluster c = cluster_of("A100-80GB", 16, 8, 1.25e9);
  Settings z3;
  z3.stage = 3;
  const Plan plain = make_plan(shape, c, z3);
  CHECK(plain.memory.nccl.own == 1);
  CHECK(plain.memory.nccl_bytes == kNcclCommBytes);
  CHECK(plain.memory.device_overhead == kDeviceOverheadBytes + kNcclCommBytes);
  z3.hpz_partition_size = 8;
  const Plan hpz = make_plan(shape, c, z3);
  CHECK(hpz.memory.device_overhead - plain.memory.device_overhead == kNcclSharedCommBytes);
}
