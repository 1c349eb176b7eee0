// The engine's configuration: DeepSpeed's key names and defaults, loaded strictly, resolved once
// against the world size and then immutable. Each key is declared once, in src/config/keys.cpp;
// see docs/architecture.md, note config (the keys: docs/configuration.md).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "zero/dtype.hpp"

namespace YAML {
class Node;
}

namespace zero {

enum class OffloadDevice { none, cpu, nvme };
enum class OptimizerType { adamw, adam, sgd, lamb, lion, adafactor, muon, onebit_adam, onebit_lamb };
// The optimizers that replace the gradient reduction with a compressed momentum exchange
// (DeepSpeed's OneBitAdam and OneBitLamb).
constexpr bool compressed_momentum(OptimizerType t) {
  return t == OptimizerType::onebit_adam || t == OptimizerType::onebit_lamb;
}
// Muon's update scale for a [rows, cols] matrix (PyTorch's adjust_lr_fn): original,
// sqrt(max(1, rows/cols)); match_rms_adamw, 0.2 sqrt(max(rows, cols)) (Moonlight).
enum class MuonScale { original, match_rms_adamw };
// manual_lr ("ManualLR"): the training loop sets the rate itself (Engine::set_lr).
enum class SchedulerType { none, warmup_lr, warmup_decay_lr, warmup_cosine_lr, manual_lr };
enum class WarmupType { log, linear };
// Where parameters and gradients live (what the pointers of gather()/grads() point to).
enum class BackendKind { host, cuda };
// How the CUDA backend moves device buffers: NCCL, or MPI through pinned host copies (lets
// several ranks share one GPU).
enum class CommKind { nccl, mpi };
// data_types.grad_accum_dtype: what gradients accumulate in across micro-steps. automatic is
// decided by resolve() (grad_accum_dtype_for); the others are DeepSpeed's spellings.
enum class GradAccumDType { automatic, fp32, fp16, bf16 };
// communication_data_type (DeepSpeed's top-level key): what the reductions of accumulated
// gradients send at stages 0 and 1 (communication_dtype_for); automatic: their own dtype.
enum class CommDataType { automatic, fp32, fp16, bf16 };
// What step() divides the summed gradients by (gradient_average): the micro-steps and the
// data-parallel ranks (as DeepSpeed does), the ranks only (the loop's seed already divides by
// its accumulation steps, as llm.c's does), or nothing (the loop's gradients are already the
// mean over the global batch).
enum class GradientAverage { steps_and_ranks, ranks, none };
// gradient_compression.type: none, or PowerSGD's low-rank compression of the gradient all-reduce
// (stages 0 and 1; engine/powersgd.hpp).
enum class CompressionType { none, powersgd };

// Each enum's name as the config file spells it; the one spelling for messages, printed
// configs and checkpoint metadata.
constexpr const char* to_string(OffloadDevice d) {
  switch (d) {
    case OffloadDevice::none: return "none";
    case OffloadDevice::cpu: return "cpu";
    case OffloadDevice::nvme: return "nvme";
  }
  return "?";
}
constexpr const char* to_string(OptimizerType t) {
  switch (t) {
    case OptimizerType::adamw: return "AdamW";
    case OptimizerType::adam: return "Adam";
    case OptimizerType::sgd: return "SGD";
    case OptimizerType::lamb: return "Lamb";
    case OptimizerType::lion: return "Lion";
    case OptimizerType::adafactor: return "Adafactor";
    case OptimizerType::muon: return "Muon";
    case OptimizerType::onebit_adam: return "OneBitAdam";
    case OptimizerType::onebit_lamb: return "OneBitLamb";
  }
  return "?";
}
constexpr const char* to_string(MuonScale s) {
  switch (s) {
    case MuonScale::original: return "original";
    case MuonScale::match_rms_adamw: return "match_rms_adamw";
  }
  return "?";
}
constexpr const char* to_string(SchedulerType t) {
  switch (t) {
    case SchedulerType::none: return "none";
    case SchedulerType::warmup_lr: return "WarmupLR";
    case SchedulerType::warmup_decay_lr: return "WarmupDecayLR";
    case SchedulerType::warmup_cosine_lr: return "WarmupCosineLR";
    case SchedulerType::manual_lr: return "ManualLR";
  }
  return "?";
}
constexpr const char* to_string(CompressionType t) { return t == CompressionType::powersgd ? "powersgd" : "none"; }
constexpr const char* to_string(WarmupType t) { return t == WarmupType::linear ? "linear" : "log"; }
constexpr const char* to_string(BackendKind k) { return k == BackendKind::cuda ? "cuda" : "host"; }
constexpr const char* to_string(CommKind k) { return k == CommKind::mpi ? "mpi" : "nccl"; }
constexpr const char* to_string(GradAccumDType g) {
  switch (g) {
    case GradAccumDType::automatic: return "auto";
    case GradAccumDType::fp32: return "fp32";
    case GradAccumDType::fp16: return "fp16";
    case GradAccumDType::bf16: return "bf16";
  }
  return "?";
}
constexpr const char* to_string(CommDataType c) {
  switch (c) {
    case CommDataType::automatic: return "auto";
    case CommDataType::fp32: return "fp32";
    case CommDataType::fp16: return "fp16";
    case CommDataType::bf16: return "bf16";
  }
  return "?";
}

// The dtype gradients accumulate in. Given: that one (fp32, or the compute dtype itself). auto:
// fp32 on the CUDA backend when gradient_accumulation_steps > 1 and the compute dtype is 16-bit
// (as Megatron does: with 32 micro-steps a bf16 sum keeps about 3 significant bits of the last
// micro-batches' gradients), else the compute dtype (one micro-step rounds once either way; the
// host backend keeps its memory and its results as they were unless asked).
DType grad_accum_dtype_for(GradAccumDType setting, DType compute, std::int64_t accumulation_steps, BackendKind backend);
// The dtype stages 0 and 1 reduce the accumulated gradients in (`grad`: what they accumulate
// in). The 16-bit compute dtype when communication_data_type names it and they accumulate in
// fp32: each rank's fp32 sum is rounded to it once, just before the reduction, which then
// sends half the bytes. Otherwise `grad` (fp32 accumulation reduces in fp32: twice the bytes
// of bf16). Stages 2 and 3 reduce each micro-step's gradient in the compute dtype anyway.
DType communication_dtype_for(CommDataType setting, DType compute, DType grad);

struct OffloadOptimizerConfig {
  OffloadDevice device = OffloadDevice::none;
  std::string nvme_path;
  bool pin_memory = false;
  int buffer_count = 4;
};

struct OffloadParamConfig {
  OffloadDevice device = OffloadDevice::none;
  std::string nvme_path;
  bool pin_memory = false;
  int buffer_count = 5;
  std::int64_t buffer_size = 100000000;
  std::int64_t max_in_cpu = 1000000000;
};

struct ZeroOptimizationConfig {
  int stage = 0;
  std::int64_t reduce_bucket_size = 500000000;     // elements
  std::int64_t allgather_bucket_size = 500000000;  // elements
  bool overlap_comm = false;
  bool contiguous_gradients = true;
  bool reduce_scatter = true;
  std::int64_t stage3_prefetch_bucket_size = 50000000;
  std::int64_t stage3_param_persistence_threshold = 100000;
  std::int64_t stage3_max_live_parameters = 1000000000;
  std::int64_t stage3_max_reuse_distance = 1000000000;
  // ZeRO++ hpZ (stage 3): ranks per group keeping a secondary 16-bit shard of the gathered
  // parameters, so the backward's all-gathers stay inside the group (normally a node). 1: off.
  std::int64_t zero_hpz_partition_size = 1;
  // MiCS / hybrid sharding (stages 1-3): model states sharded over groups of this many
  // consecutive ranks (normally a node) and replicated across the groups. -1: off.
  std::int64_t mics_shard_size = -1;
  // ZeRO++ qwZ (stage 3): parameter all-gathers send int8 values with one fp32 scale per block
  // of zero_quantized_weights_block_size elements (comm/quantize.hpp); master weights untouched.
  bool zero_quantized_weights = false;
  std::int64_t zero_quantized_weights_block_size = 256;  // qwZ's and qgZ's block
  // ZeRO++ qgZ (stages 2-3): hierarchical gradient reduce-scatter, int8 inside a node and int4
  // across nodes, with error feedback (engine/quantized_reduce_scatter.hpp).
  bool zero_quantized_gradients = false;
  std::int64_t sub_group_size = 1000000000;
  OffloadOptimizerConfig offload_optimizer;
  OffloadParamConfig offload_param;
};

// PowerSGD (Vogels et al. 2019), named as PyTorch's PowerSGDState: every matrix-shaped gradient
// whose rank-`rank` factors are at least min_compression_rate times smaller than it is all-reduced
// as two factors P and Q, with error feedback (engine/powersgd.hpp); the rest plainly.
struct GradientCompressionConfig {
  CompressionType type = CompressionType::none;
  int rank = 1;                       // PyTorch: matrix_approximation_rank
  std::int64_t start_step = 0;        // PyTorch: start_powerSGD_iter; plain all-reduce before it
  double min_compression_rate = 2.0;  // as PyTorch's
  bool warm_start = true;             // Q starts from the previous step's
  // What the factors P and Q are all-reduced in: fp32, or bf16 (half the bytes; as PyTorch's
  // bf16_compress_wrapper around powerSGD_hook). The error buffers see the rounded factors.
  DType factor_dtype = DType::f32;
};

struct AioConfig {
  std::int64_t block_size = 1048576;
  int queue_depth = 8;
  int intra_op_parallelism = 1;
  bool single_submit = false;
  bool overlap_events = true;
};

struct Fp16Config {
  bool enabled = false;
  double loss_scale = 0.0;  // 0: dynamic; > 0: static scale
  int initial_scale_power = 16;
  int loss_scale_window = 1000;
  int hysteresis = 2;
  double min_loss_scale = 1.0;
};

struct OptimizerConfig {
  OptimizerType type = OptimizerType::adamw;
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;  // DeepSpeed/PyTorch: AdamW 0.01, Adam 0, SGD 0 (set per type when absent)
  double momentum = 0.0;       // SGD; Muon (default 0.95)
  // DeepSpeed's switch for type Adam: true (its default) decays decoupled, as AdamW; false adds
  // the decay to the gradient. AdamW always decouples.
  bool adam_w_mode = true;
  bool bias_correction = true;                // Adam, AdamW, Lamb: divide the moments by 1 - beta^t
  double max_coeff = 10.0, min_coeff = 0.01;  // Lamb: the trust ratio's bounds (DeepSpeed's)
  // Adafactor (Hugging Face's): eps1 joins g^2, eps2 bounds the parameter scale from below;
  // beta1 0 keeps no first moment.
  double eps1 = 1e-30, eps2 = 1e-3;
  double clip_threshold = 1.0, decay_rate = -0.8, adafactor_beta1 = 0.0;
  bool scale_parameter = false, relative_step = false, warmup_init = false;
  // Muon: Nesterov momentum, Newton-Schulz iterations, the update scale.
  bool nesterov = true;
  int ns_steps = 5;
  MuonScale adjust_lr_fn = MuonScale::original;
  // OneBitAdam, OneBitLamb: exact steps before the compressed momentum exchange starts (DeepSpeed's).
  std::int64_t freeze_step = 100000;
  // OneBitLamb (DeepSpeed's): the warm-up's moving average of each tensor's trust ratio, and the
  // bounds of the factor that modulates the frozen ratio afterwards (its range, and its change
  // from one step to the next).
  double coeff_beta = 0.9, factor_max = 4.0, factor_min = 0.5, factor_threshold = 0.1;
  // True when the update decays decoupled from the gradient (AdamW, or Adam in adam_w_mode).
  bool decoupled_decay() const { return type == OptimizerType::adamw || (type == OptimizerType::adam && adam_w_mode); }
};

struct SchedulerConfig {
  SchedulerType type = SchedulerType::none;
  double warmup_min_lr = 0.0;
  double warmup_max_lr = 1e-3;
  std::int64_t warmup_num_steps = 1000;
  WarmupType warmup_type = WarmupType::log;
  std::int64_t total_num_steps = 0;  // WarmupDecayLR / WarmupCosineLR (required there)
  double warmup_min_ratio = 0.0;     // WarmupCosineLR
  double cos_min_ratio = 0.0001;     // WarmupCosineLR
};

struct Config {
  // Batch triple; 0 means "not given" (or "auto") until resolve() fills it.
  std::int64_t train_batch_size = 0;
  std::int64_t train_micro_batch_size_per_gpu = 0;
  std::int64_t gradient_accumulation_steps = 0;
  std::int64_t steps_per_print = 10;
  double gradient_clipping = 0.0;  // 0: off; a DeepSpeed JSON file defaults to 1.0, as DeepSpeed >= 0.19.3
  GradientAverage gradient_average = GradientAverage::steps_and_ranks;
  ZeroOptimizationConfig zero_optimization;
  GradientCompressionConfig gradient_compression;
  AioConfig aio;
  Fp16Config fp16;
  bool bf16_enabled = false;
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  // backend: host | cuda. Explicit, not detected: the training loop must know whether the
  // engine hands it host or device pointers.
  BackendKind backend = BackendKind::host;
  // comm: nccl | mpi (the CUDA backend's communicator).
  CommKind comm = CommKind::nccl;
  // data_types.grad_accum_dtype; resolve() replaces automatic with the dtype it chose.
  GradAccumDType grad_accum_dtype = GradAccumDType::automatic;
  // communication_data_type (communication_dtype_for).
  CommDataType communication_data_type = CommDataType::automatic;
  // debug.audit_interval: every this many steps (0: never) step() checks each unit's reduced
  // gradient against a plain all-reduce of the ranks' local gradients (docs/training-loop.md).
  std::int64_t audit_interval = 0;

  // Sections owned by the application (for example the GPT trainer's model/data/run), kept as
  // their YAML text; the application validates them with its own schema (config_schema.hpp).
  std::map<std::string, std::string> extra_sections;

  // Where the settings came from (the file path, or parse_config's origin), for messages.
  std::string source;
  // For every key of the extra sections, where it was set ("run.yaml:12", or the --set string
  // that set it): the sections are kept as re-emitted text, whose own line numbers mean nothing.
  std::map<std::string, std::string> extra_locations;

  bool resolved = false;
  // What loading and resolve() decided on the user's behalf ("auto" values, the derived batch
  // triple, DeepSpeed keys handled another way), one line each, printed at start.
  std::vector<std::string> notes;
  // What each "auto" became and where the value came from ("the application", "DeepSpeed
  // default", "optimizer.params.lr", "derived from the world size").
  struct AutoValue {
    std::string path, value, source;
  };
  std::vector<AutoValue> autos;
  // The block applications print at start: one line per "auto" (empty when there was none).
  std::string auto_block() const;

  // Compute dtype implied by fp16 / bf16.
  DType compute_dtype() const { return fp16.enabled ? DType::f16 : (bf16_enabled ? DType::bf16 : DType::f32); }
  // The dtype gradients accumulate in (grad_accum_dtype_for; final once resolved).
  DType grad_dtype() const {
    return grad_accum_dtype_for(grad_accum_dtype, compute_dtype(), gradient_accumulation_steps, backend);
  }
  // The dtype stages 0 and 1 reduce the accumulated gradients in (communication_dtype_for).
  DType comm_dtype() const { return communication_dtype_for(communication_data_type, compute_dtype(), grad_dtype()); }
  // The learning rate at a step: zero::lr_at (zero/optim.hpp).

  // Fills the batch triple for `world_size` data-parallel ranks and checks contradictions that
  // need the machine (nvme_path exists and is writable). Throws zero::Error.
  void resolve(int world_size);

  // YAML text of every setting (resolved values included); loading it gives an equal Config.
  std::string to_yaml() const;
};

struct LoadOptions {
  // Top-level sections the application accepts in the same file (e.g. {"model","data","run"}).
  std::vector<std::string> extra_sections;
  // "key.path=value" overrides applied after the file, validated like the file.
  std::vector<std::string> overrides;
  // The run length in optimizer steps, when the application knows it: what
  // scheduler.params.total_num_steps "auto" becomes. 0: unknown ("auto" there is an error).
  std::int64_t total_num_steps = 0;
  // The application's values for "auto", by key path ("optimizer.params.lr" -> "3e-4"), as
  // Hugging Face's Trainer fills them from its arguments. Each is validated like the file's
  // value; a key that is "auto" and missing here gets DeepSpeed's default.
  std::map<std::string, std::string> auto_values;
};

// Loads a YAML or JSON file. Throws zero::Error with path/line/suggestion on any bad input.
Config load_config(const std::string& path, const LoadOptions& opts = {});
// Same, from text; `origin` names the source in messages.
Config parse_config(const std::string& text, const std::string& origin, const LoadOptions& opts = {});

// The configuration reference generated from the key table: docs/configuration.md's key table and
// its lists of DeepSpeed keys accepted silently, noted, and refused (Markdown).
std::string config_reference_markdown();
// One line per key (path, type, default) for an application's --help.
std::string config_keys_help();

}  // namespace zero
