// zero-plan: what fits, how fast and how many days, before the cluster time is spent.
//
// One configuration gives its memory in each place, step time, tokens/s, TFLOPs per GPU and
// days for a token budget; settings left open (several values, or "any") give a ranked table of
// every combination that fits; --max-model searches a GPT shape family for the largest model
// that fits. --json prints one JSON object instead of the tables.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "zero/config.hpp"
#include "zero/error.hpp"
#include "zero/util/log.hpp"
#include "zero/plan/plan.hpp"

using namespace zero;
using namespace zero::plan;

namespace {

constexpr double GB = 1e9;

// Plans count bytes in integers, capacities (from GB flags and presets) in doubles.
std::string bytes(std::int64_t b) { return format_bytes(static_cast<std::uint64_t>(b)); }
std::string bytes(double b) { return format_bytes(static_cast<std::uint64_t>(b)); }

std::string human_params(double p) {
  return p >= 1e9 ? fmt::format("{:.2f}B", p / 1e9) : fmt::format("{:.1f}M", p / 1e6);
}

OffloadDevice device_of(const std::string& s) {
  if (s == "none") return OffloadDevice::none;
  if (s == "cpu") return OffloadDevice::cpu;
  if (s == "nvme") return OffloadDevice::nvme;
  ZERO_THROW("zero-plan: offload device '" + s + "' is not one of none, cpu, nvme");
}

const char* device_name(OffloadDevice d) {
  return d == OffloadDevice::cpu ? "cpu" : d == OffloadDevice::nvme ? "nvme" : "none";
}

// Under tensor parallelism, what the optimizer sends over the tensor group in a step
// (tensor_group_traffic: Lamb's and Adafactor's statistics, Muon's split matrices), seen from the
// first tensor group's last rank on the first node (whose ring successor is on the next node when
// the group spans nodes), in the first pipeline part.
struct TensorGroupTraffic {
  int rank = 0;
  TrafficBytes bytes;
};
TensorGroupTraffic tensor_traffic(const Plan& p, int gpus_per_node) {
  const auto& st = p.settings;
  const int r = std::min(st.tensor_parallel, gpus_per_node) - 1;
  const Layout part = gpt_part_layout(p.shape, PipelinePart{st.tensor_parallel, st.pipeline_parallel, 0});
  return {r, tensor_group_traffic(part, st, p.data_parallel, gpus_per_node, r)};
}

nlohmann::json plan_json(const Plan& p, const Cluster& c) {
  const auto& m = p.memory;
  const auto& s = p.settings;
  nlohmann::json tensor_group;  // null without tensor parallelism
  if (s.tensor_parallel > 1) {
    const TensorGroupTraffic t = tensor_traffic(p, c.gpus_per_node);
    tensor_group = {{"rank", t.rank}, {"intra_node", t.bytes.intra_node}, {"inter_node", t.bytes.inter_node}};
  }
  return {{"fits", p.fits},
          {"why", p.why},
          {"params", p.params},
          {"model",
           {{"arch", arch_name(p.shape.arch)},
            {"n_layer", p.shape.n_layer},
            {"n_head", p.shape.n_head},
            {"n_kv_head", p.shape.kv_heads()},
            {"ffn_hidden", p.shape.mlp_hidden()},
            {"n_embd", p.shape.n_embd},
            {"seq_len", p.shape.seq_len},
            {"vocab_size", p.shape.vocab_size}}},
          {"settings",
           {{"stage", s.stage},
            {"offload_optimizer", device_name(s.offload_optimizer)},
            {"offload_param", device_name(s.offload_param)},
            {"micro_batch", s.micro_batch},
            {"gradient_accumulation_steps", s.grad_accum},
            {"activation_checkpointing", s.activation_checkpointing},
            {"dtype", std::string(dtype_name(s.dtype))},
            {"grad_accum_dtype", std::string(dtype_name(s.grad_dtype()))},
            {"tensor_parallel", s.tensor_parallel},
            {"pipeline_parallel", s.pipeline_parallel},
            {"hpz_partition_size", s.hpz_partition_size},
            {"quantized_weights", s.quantized_weights},
            {"quantized_gradients", s.quantized_gradients},
            {"mics_shard_size", s.mics_shard_size},
            {"powersgd_rank", s.powersgd() ? s.compression.rank : 0},
            {"powersgd_factor_dtype", std::string(dtype_name(s.compression.factor_dtype))},
            {"data_parallel", p.data_parallel}}},
          {"gpu_bytes", m.gpu_bytes},
          {"host_bytes", m.host_bytes},
          {"nvme_bytes", m.nvme_bytes},
          {"model_state_bytes", m.states.device()},
          {"hpz_secondary_bytes", m.states.secondary},
          {"qgz_error_feedback_bytes", m.states.error_feedback},
          {"optimizer_buffer_bytes", m.states.optimizer_buffers},
          {"activation_bytes", m.activations},
          {"memory_part", p.memory_part},
          {"step_s", p.time.step_s},
          {"compress_s", p.time.compress_s},
          {"newton_schulz_s", p.time.newton_schulz_s},
          {"tp_comm_s", p.time.tp_comm_s},
          {"pp_comm_s", p.time.pp_comm_s},
          {"tensor_group_optimizer_bytes", tensor_group},
          {"bubble", p.time.bubble},
          {"bubble_s", p.time.bubble_s},
          {"tokens_per_s", p.tokens_per_s},
          {"tflops_per_gpu", p.tflops_per_gpu},
          {"days", p.days},
          {"token_budget", p.token_budget}};
}

void print_plan(const Plan& p, const Cluster& c) {
  const auto& m = p.memory;
  fmt::print("model: {} parameters ({}, n_layer {}, n_head {}, n_embd {}, seq_len {}, vocab {})\n",
             human_params(static_cast<double>(p.params)), arch_name(p.shape.arch), p.shape.n_layer, p.shape.n_head,
             p.shape.n_embd, p.shape.seq_len, p.shape.vocab_size);
  fmt::print("cluster: {} x {}, {} per node, efficiency {:.0f}% of {:.0f} TFLOP/s\n", c.gpus, c.gpu.name,
             c.gpus_per_node, 100 * c.gpu.efficiency, c.gpu.peak_flops / 1e12);
  fmt::print("settings: {}, {}{}\n", p.settings.label(), dtype_name(p.settings.dtype),
             p.settings.grad_dtype() != p.settings.dtype
                 ? fmt::format(", gradients accumulate in {}", dtype_name(p.settings.grad_dtype()))
                 : std::string());
  const auto& st = p.settings;
  if (st.tensor_parallel * st.pipeline_parallel > 1)
    fmt::print(
        "grid: tensor {} x pipeline {} x data {}{}\n", st.tensor_parallel, st.pipeline_parallel, p.data_parallel,
        st.pipeline_parallel > 1
            ? fmt::format("; memory below is pipeline part {}'s (the larger of the first and last)", p.memory_part)
            : std::string());
  fmt::print("fits: {}{}{}\n", p.fits ? "yes" : "no", p.fits ? "" : " — ", p.why);
  fmt::print(
      "GPU  {:>10} = model states {} (params {}, grads {}, master+optimizer {}) + activations {}\n"
      "                 + comm buffers {} + stage-3 gathers {} + overhead {}   (of {})\n",
      bytes(m.gpu_bytes), bytes(m.states.device()), bytes(m.states.params), bytes(m.states.grads),
      bytes(m.states.master + m.states.optimizer), bytes(m.activations), bytes(m.comm_buffers), bytes(m.gathered),
      bytes(m.device_overhead), bytes(c.gpu.memory_bytes));
  if (m.states.secondary > 0) fmt::print("                 + hpZ secondary shards {}\n", bytes(m.states.secondary));
  if (m.states.error_feedback > 0)
    fmt::print("                 + qgZ error feedback {}\n", bytes(m.states.error_feedback));
  if (m.states.optimizer_buffers > 0)
    fmt::print("                 + 1-bit exchange buffers {}\n", bytes(m.states.optimizer_buffers));
  fmt::print("host {:>10} per GPU = offloaded states {} + pinned buffers {} + overhead {}   (of {})\n",
             bytes(m.host_bytes), bytes(m.states.host), bytes(m.pinned), bytes(m.host_overhead),
             bytes(c.host_bytes_per_gpu));
  fmt::print("NVMe {:>10} per node   (of {})\n", bytes(m.nvme_bytes), bytes(c.nvme_bytes_per_node));
  fmt::print(
      "step {:.3f} s = compute {:.3f} s + {}exposed comm {:.3f} s + {}optimizer {:.3f} s + offload {:.3f} s "
      "(comm {:.3f} s in all)\n",
      p.time.step_s, p.time.compute_s,
      st.pipeline_parallel > 1 ? fmt::format("pipeline bubble {:.3f} s + ", p.time.bubble_s) : std::string(),
      p.time.exposed_comm_s,
      p.time.compress_s > 0 ? fmt::format("PowerSGD compression {:.3f} s + ", p.time.compress_s) : std::string(),
      p.time.optimizer_s, p.time.offload_s, p.time.comm_s);
  if (st.tensor_parallel * st.pipeline_parallel > 1)
    fmt::print(
        "     comm: tensor all-reduces {:.3f} s, pipeline sends {:.3f} s{}\n", p.time.tp_comm_s, p.time.pp_comm_s,
        st.pipeline_parallel > 1 ? fmt::format("; bubble {:.1f}% of the pipeline, (P-1)/(m+P-1)", 100 * p.time.bubble)
                                 : std::string());
  if (st.tensor_parallel * st.pipeline_parallel == 1 && c.gpus > 1) {
    // The rank whose ring successor is on the next node sends the most across (the last of its node).
    const int r = std::min(c.gpus, c.gpus_per_node) - 1;
    const TrafficBytes t = step_traffic(gpt_layout(p.shape), st, c.gpus, c.gpus_per_node, r);
    fmt::print("     bytes per step (rank {}): {} inside its node, {} to other nodes\n", r, bytes(t.intra_node),
               bytes(t.inter_node));
  }
  if (st.tensor_parallel > 1) {
    const TensorGroupTraffic t = tensor_traffic(p, c.gpus_per_node);
    fmt::print("     optimizer bytes per step over the tensor group (rank {}): {} inside its node, {} to other nodes\n",
               t.rank, bytes(t.bytes.intra_node), bytes(t.bytes.inter_node));
  }
  fmt::print("{:.0f} tokens/s, {:.1f} TFLOP/s per GPU, {:.1f} days for {:.3g} tokens\n", p.tokens_per_s,
             p.tflops_per_gpu, p.days, p.token_budget);
}

void print_table(const std::vector<Plan>& ranked, std::size_t top) {
  fmt::print("{:<4} {:<36} {:>10} {:>10} {:>10} {:>9} {:>12} {:>8} {:>8}\n", "rank", "settings", "GPU", "host/GPU",
             "NVMe/node", "step s", "tokens/s", "TFLOP/s", "days");
  for (std::size_t i = 0; i < ranked.size() && i < top; ++i) {
    const Plan& p = ranked[i];
    fmt::print("{:<4} {:<36} {:>10} {:>10} {:>10} {:>9.3f} {:>12.0f} {:>8.1f} {:>8.1f}\n", i + 1, p.settings.label(),
               bytes(p.memory.gpu_bytes), bytes(p.memory.host_bytes), bytes(p.memory.nvme_bytes), p.time.step_s,
               p.tokens_per_s, p.tflops_per_gpu, p.days);
  }
  if (ranked.size() > top) fmt::print("... {} more (--top)\n", ranked.size() - top);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"zero-plan: which model and settings fit, how fast they run and how many days a token budget takes"};
  // Model
  std::string model, gpu_kind = "H100-SXM", gpu_file, config_path;
  GptShape shape;
  double params = 0;
  std::string preset_list, arch = "gpt2";
  for (const auto& p : gpt_presets()) preset_list += (preset_list.empty() ? "" : ", ") + p.name;
  app.add_option("--model", model, "model preset (" + preset_list + ")");
  auto* o_arch = app.add_option("--arch", arch, "architecture of an explicit shape: gpt2, bloom or llama");
  auto* o_kv = app.add_option("--n-kv-head", shape.n_kv_head, "llama: key/value heads (grouped-query attention)");
  auto* o_ffn = app.add_option("--ffn-hidden", shape.ffn_hidden, "the MLP's hidden width (default 4 n_embd)");
  auto* o_layer = app.add_option("--n-layer", shape.n_layer, "transformer blocks");
  auto* o_head = app.add_option("--n-head", shape.n_head, "attention heads");
  auto* o_embd = app.add_option("--n-embd", shape.n_embd, "model width");
  auto* o_seq = app.add_option("--seq-len", shape.seq_len, "sequence length");
  auto* o_vocab = app.add_option("--vocab", shape.vocab_size, "vocabulary size");
  app.add_option("--params", params, "a bare parameter count (e.g. 7e9): the closest shape of the family");
  GptFamily family;
  app.add_option("--aspect", family.aspect, "family for --params/--max-model: n_embd / n_layer")->default_val(128);
  app.add_option("--fix-layers", family.n_layer, "family: keep n_layer fixed, grow only the width");
  bool max_mode = false;
  app.add_flag("--max-model", max_mode, "the largest model of the family (--aspect, --seq-len, --vocab) that fits");
  // Cluster
  Cluster c;
  double intra = 0, inter = 25, host_gb = 64, host_bw = 200, nvme_gb = 0, nvme_bw = 6, efficiency = 0;
  app.add_option("--gpu", gpu_kind,
                 "GPU kind: V100-16GB, V100-32GB, A100-40GB, A100-80GB, H100-SXM, H200, "
                 "or one from --gpu-file")
      ->default_val("H100-SXM");
  app.add_option("--gpu-file", gpu_file,
                 "YAML with user GPU presets (name, base, memory_gb, peak_tflops, "
                 "efficiency, hbm_gbps, pcie_gbps, nvlink_gbps)");
  app.add_option("--gpus", c.gpus, "GPUs (data-parallel ranks)")->default_val(8)->check(CLI::PositiveNumber);
  app.add_option("--gpus-per-node", c.gpus_per_node, "GPUs per node")->default_val(8)->check(CLI::PositiveNumber);
  app.add_option("--intra-gbps", intra, "intra-node bus bandwidth per GPU, GB/s (default: the GPU's NVLink)");
  app.add_option("--inter-gbps", inter, "inter-node bandwidth per node, GB/s")->default_val(25);
  app.add_option("--host-gb", host_gb, "host memory per GPU, GB")->default_val(64);
  app.add_option("--host-mem-gbps", host_bw, "host DRAM bandwidth per node, GB/s (host AdamW)")->default_val(200);
  app.add_option("--nvme-gb", nvme_gb, "NVMe capacity per node, GB")->default_val(0);
  app.add_option("--nvme-gbps", nvme_bw, "NVMe bandwidth per node, GB/s")->default_val(6);
  app.add_option("--efficiency", efficiency,
                 "fraction of peak the compute reaches (default: the GPU kind's, "
                 "or a measured MFU)")
      ->check(CLI::Range(0.001, 1.0));
  // Settings
  std::vector<std::string> stages_s{"any"}, offload_s{"none"}, offload_param_s{"none"}, micro_s{"any"};
  std::vector<std::string> tp_s{"1"}, pp_s{"1"}, hpz_s{"1"};
  std::string qwz_s = "off", qgz_s = "off", psgd_dtype_s = "fp32";
  std::vector<std::string> mics_s{"-1"}, psgd_s{"0"};
  std::string ckpt_s = "any", dtype_s = "bf16";
  int accum = 1;
  std::int64_t space_global_batch = 0;
  double tokens = 100e9;
  std::size_t top = 15;
  bool json = false;
  app.add_option("-c,--config", config_path,
                 "a libzero/DeepSpeed config: its settings are fixed unless a flag opens them");
  auto* o_stage = app.add_option("--stage", stages_s, "ZeRO stages to consider (0..3 or any)")->delimiter(',');
  auto* o_off = app.add_option("--offload", offload_s, "optimizer offload: none, cpu, nvme, any")->delimiter(',');
  auto* o_offp = app.add_option("--offload-param", offload_param_s, "parameter offload (stage 3): none, nvme, cpu, any")
                     ->delimiter(',');
  auto* o_micro = app.add_option("--micro-batch", micro_s, "micro-batch sizes (or any: 1..32)")->delimiter(',');
  auto* o_accum = app.add_option("--accum", accum, "gradient accumulation steps")->check(CLI::PositiveNumber);
  auto* o_ckpt = app.add_option("--ckpt", ckpt_s, "activation checkpointing: on, off, any")
                     ->check(CLI::IsMember({"on", "off", "any"}));
  auto* o_dtype = app.add_option("--dtype", dtype_s, "compute dtype")->check(CLI::IsMember({"bf16", "fp16", "fp32"}));
  app.add_option("--tp", tp_s,
                 "tensor-parallel sizes (Megatron-style, inside a node when it fits; any: powers "
                 "of 2 up to the GPUs per node)")
      ->delimiter(',');
  app.add_option("--pp", pp_s,
                 "pipeline-parallel sizes (1F1B over the accumulation's micro-batches; any: powers "
                 "of 2 up to the GPU count); data parallel = GPUs / (tp x pp)")
      ->delimiter(',');
  auto* o_hpz = app.add_option("--hpz", hpz_s,
                               "stage 3: ZeRO++ hpZ group sizes (1: off; any: 1 and the GPUs per "
                               "node)")
                    ->delimiter(',');
  auto* o_qwz = app.add_option("--qwz", qwz_s, "stage 3: ZeRO++ qwZ int8 parameter gathers: on, off, any")
                    ->check(CLI::IsMember({"on", "off", "any"}));
  app.add_option("--global-batch", space_global_batch,
                 "sequences per optimizer step over all GPUs: sets the "
                 "accumulation for each micro-batch (overrides --accum)");
  auto* o_qgz = app.add_option("--qgz", qgz_s,
                               "stages 2-3: ZeRO++ qgZ quantized gradient reduce-scatter (int8 "
                               "inside the node, int4 across): on, off, any")
                    ->check(CLI::IsMember({"on", "off", "any"}));
  auto* o_mics = app.add_option("--mics-shard-size", mics_s,
                                "MiCS (stages 1-3): shard model states over groups of this many data-parallel "
                                "ranks, replicated across groups (zero_optimization.mics_shard_size; -1: off; "
                                "any: off and the GPUs per node)")
                     ->delimiter(',');
  auto* o_psgd = app.add_option("--powersgd-rank", psgd_s,
                                "stages 0-1: PowerSGD gradient compression ranks (gradient_compression.rank; 0: "
                                "off; any: off, 1, 4 and 16)")
                     ->delimiter(',');
  auto* o_psgd_dtype = app.add_option("--powersgd-factor-dtype", psgd_dtype_s,
                                      "PowerSGD's factors on the wire (gradient_compression.factor_dtype)")
                           ->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_option("--tokens", tokens, "token budget for the days figure")->default_val(100e9);
  app.add_option("--top", top, "rows of the ranked table")->default_val(15);
  app.add_flag("--json", json, "print one JSON object");
  CLI11_PARSE(app, argc, argv);

  try {
    std::vector<GpuSpec> user;
    if (!gpu_file.empty()) user = load_gpu_presets(gpu_file);
    c.gpu = gpu_preset(gpu_kind, user);
    if (efficiency > 0) c.gpu.efficiency = efficiency;
    c.intra_node_bytes_per_s = intra * GB;
    c.inter_node_bytes_per_s = inter * GB;
    c.host_bytes_per_gpu = host_gb * GB;
    c.host_mem_bytes_per_s = host_bw * GB;
    c.nvme_bytes_per_node = nvme_gb * GB;
    c.nvme_bytes_per_s = nvme_bw * GB;

    // Settings: a config file fixes what it says; flags given on the command line win.
    SettingsSpace space;
    space.global_batch = space_global_batch;
    bool from_config = !config_path.empty();
    if (from_config) space.base = settings_from(load_config(config_path));
    space.base.grad_accum = from_config && !o_accum->count() ? space.base.grad_accum : accum;
    if (!from_config || o_dtype->count())
      space.base.dtype = dtype_s == "fp32" ? DType::f32 : dtype_s == "fp16" ? DType::f16 : DType::bf16;
    const bool cfg_fixed = from_config;
    auto any = [](const std::vector<std::string>& v) { return v.size() == 1 && v[0] == "any"; };
    if (cfg_fixed && !o_stage->count())
      space.stages = {space.base.stage};
    else if (!any(stages_s)) {
      space.stages.clear();
      for (const auto& s : stages_s) space.stages.push_back(std::stoi(s));
    }
    auto devices = [&](const std::vector<std::string>& v, bool param) {
      std::vector<OffloadDevice> out;
      if (any(v))
        return param ? std::vector<OffloadDevice>{OffloadDevice::none, OffloadDevice::nvme}
                     : std::vector<OffloadDevice>{OffloadDevice::none, OffloadDevice::cpu, OffloadDevice::nvme};
      for (const auto& s : v) out.push_back(device_of(s));
      return out;
    };
    space.offload_optimizer =
        cfg_fixed && !o_off->count() ? std::vector{space.base.offload_optimizer} : devices(offload_s, false);
    space.offload_param =
        cfg_fixed && !o_offp->count() ? std::vector{space.base.offload_param} : devices(offload_param_s, true);
    if (cfg_fixed && !o_micro->count())
      space.micro_batches = {space.base.micro_batch};
    else if (!any(micro_s)) {
      space.micro_batches.clear();
      for (const auto& s : micro_s) space.micro_batches.push_back(std::stoi(s));
    }
    auto sizes = [&](const std::vector<std::string>& v, int upto, const char* flag) {
      std::vector<int> out;
      if (any(v)) {
        for (int k = 1; k <= upto; k *= 2) out.push_back(k);
        return out;
      }
      for (const auto& x : v) {
        int k = 0;
        try {
          k = std::stoi(x);
        } catch (const std::exception&) {
        }
        ZERO_CHECK(k >= 1, fmt::format("zero-plan: {} '{}' is not a positive size or any", flag, x));
        out.push_back(k);
      }
      return out;
    };
    space.tensor_parallel = sizes(tp_s, c.gpus_per_node, "--tp");
    space.pipeline_parallel = sizes(pp_s, c.gpus, "--pp");
    if (cfg_fixed && !o_hpz->count())
      space.hpz_partition_size = {space.base.hpz_partition_size};
    else if (any(hpz_s))
      space.hpz_partition_size = {1, c.gpus_per_node};
    else
      space.hpz_partition_size = sizes(hpz_s, c.gpus, "--hpz");
    if (cfg_fixed && !o_qwz->count())
      space.quantized_weights = {space.base.quantized_weights};
    else if (qwz_s == "any")
      space.quantized_weights = {false, true};
    else
      space.quantized_weights = {qwz_s == "on"};
    // Across nodes: an empty list keeps the config's (base's) value.
    auto ints = [&](const std::vector<std::string>& v, int lo, const char* flag) {
      std::vector<int> out;
      for (const auto& x : v) {
        int k = lo - 1;
        try {
          k = std::stoi(x);
        } catch (const std::exception&) {
        }
        ZERO_CHECK(k >= lo, fmt::format("zero-plan: {} '{}' is not a size, off or any", flag, x));
        out.push_back(k);
      }
      return out;
    };
    if (!cfg_fixed || o_qgz->count())
      space.quantized_gradients = qgz_s == "any" ? std::vector<bool>{false, true} : std::vector<bool>{qgz_s == "on"};
    if (!cfg_fixed || o_mics->count()) {
      space.mics_shard_size =
          any(mics_s) ? std::vector<int>{-1, c.gpus_per_node} : ints(mics_s, -1, "--mics-shard-size");
      for (int m : space.mics_shard_size)
        ZERO_CHECK(m == -1 || m >= 1,
                   fmt::format("zero-plan: --mics-shard-size {} is not -1 (off) or a group size", m));
    }
    if (!cfg_fixed || o_psgd->count())
      space.powersgd_rank = any(psgd_s) ? std::vector<int>{0, 1, 4, 16} : ints(psgd_s, 0, "--powersgd-rank");
    if (!cfg_fixed || o_psgd_dtype->count())
      space.base.compression.factor_dtype = psgd_dtype_s == "bf16" ? DType::bf16 : DType::f32;
    // The first value of each list stands for the base (the one-grid error below names it).
    if (!space.quantized_gradients.empty()) space.base.quantized_gradients = space.quantized_gradients.front();
    if (!space.mics_shard_size.empty()) space.base.mics_shard_size = space.mics_shard_size.front();
    if (!space.powersgd_rank.empty()) {
      const int r = space.powersgd_rank.front();
      space.base.compression.type = r > 0 ? CompressionType::powersgd : CompressionType::none;
      if (r > 0) space.base.compression.rank = r;
    }
    if (ckpt_s == "on")
      space.checkpointing = {true};
    else if (ckpt_s == "off" || (cfg_fixed && !o_ckpt->count()))
      space.checkpointing = {false};

    // Model
    if (o_seq->count()) family.seq_len = shape.seq_len;
    if (o_vocab->count()) family.vocab_size = shape.vocab_size;
    if (!model.empty()) {
      GptShape p = gpt_preset(model);
      if (o_seq->count()) p.seq_len = shape.seq_len;
      if (o_vocab->count()) p.vocab_size = shape.vocab_size;
      shape = p;
    } else if (params > 0) {
      shape = family.closest(params);
    } else if (!max_mode) {
      ZERO_CHECK(o_layer->count() && o_head->count() && o_embd->count(),
                 "zero-plan: give a model: --model <preset>, --n-layer/--n-head/--n-embd, --params <count>, "
                 "or --max-model");
      shape.arch = parse_arch(arch);
    }
    ZERO_CHECK(!(o_arch->count() || o_kv->count() || o_ffn->count()) || (model.empty() && params <= 0 && !max_mode),
               "zero-plan: --arch, --n-kv-head and --ffn-hidden describe an explicit shape (--n-layer/--n-head/"
               "--n-embd); a preset or --params brings its own");

    if (max_mode) {
      MaxModel r = max_model(family, c, space, tokens);
      if (json) {
        nlohmann::json j = r.found ? plan_json(r.best, c) : nlohmann::json{{"fits", false}};
        j["max_params"] = r.found ? r.best.params : 0;
        fmt::print("{}\n", j.dump(2));
      } else if (!r.found) {
        fmt::print("no model of the family fits any of the settings considered\n");
      } else {
        fmt::print("largest model that fits: {} parameters\n\n", human_params(static_cast<double>(r.best.params)));
        print_plan(r.best, c);
      }
      return r.found ? 0 : 1;
    }

    const auto candidates = space.expand(c.gpus);
    if (candidates.empty() && space.tensor_parallel.size() == 1 && space.pipeline_parallel.size() == 1) {
      // One grid asked for: make_plan's message says what is wrong with it.
      Settings s = space.base;
      s.tensor_parallel = space.tensor_parallel.front();
      s.pipeline_parallel = space.pipeline_parallel.front();
      s.stage = space.stages.front();
      make_plan(shape, c, s, tokens);
    }
    ZERO_CHECK(!candidates.empty(),
               "zero-plan: no setting to consider (parameter offload needs --stage 3; "
               "optimizer offload needs stage >= 1; tensor x pipeline must divide --gpus; "
               "a pipeline needs stage 0 or 1; --mics-shard-size needs stage >= 1, a divisor "
               "of the data-parallel ranks, and no --hpz; --qgz needs stage 2-3 and no MiCS; "
               "--powersgd-rank needs stage 0-1 and no MiCS)");
    if (candidates.size() == 1) {
      Plan p = make_plan(shape, c, candidates.front(), tokens);
      if (json)
        fmt::print("{}\n", plan_json(p, c).dump(2));
      else
        print_plan(p, c);
      return 0;
    }
    auto ranked = rank_plans(shape, c, space, tokens);
    if (json) {
      nlohmann::json j = ranked.empty() ? nlohmann::json{{"fits", false}} : plan_json(ranked.front(), c);
      j["candidates"] = candidates.size();
      j["fitting"] = ranked.size();
      fmt::print("{}\n", j.dump(2));
      return 0;
    }
    fmt::print("model: {} parameters (n_layer {}, n_head {}, n_embd {}, seq_len {}); {} x {}\n",
               human_params(static_cast<double>(shape.num_params())), shape.n_layer, shape.n_head, shape.n_embd,
               shape.seq_len, c.gpus, c.gpu.name);
    fmt::print("{} of {} combinations fit; fastest first:\n", ranked.size(), candidates.size());
    print_table(ranked, top);
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "zero-plan: {}\n", e.what());
    return 2;
  }
}
