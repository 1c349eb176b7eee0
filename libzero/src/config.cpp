// Loading, validating, resolving and emitting zero::Config. Every read goes through
// StrictSection (config_schema.hpp), the same reader applications use for their own sections,
// so typos, wrong types and ranges produce the same kind of message everywhere.
#include "zero/config.hpp"

#include <sys/stat.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <numbers>
#include <sstream>

#include "zero/config_schema.hpp"
#include "zero/error.hpp"

namespace zero {

namespace {

constexpr std::int64_t kNoMax = std::numeric_limits<std::int64_t>::max();

// Shortest text that reads back as the same double, so to_yaml() round-trips exactly.
std::string num(double v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

const std::vector<std::string> kDevices = {"none", "cpu", "nvme"};
const std::vector<std::string> kOptimizers = {"AdamW", "Adam", "SGD"};
const std::vector<std::string> kSchedulers = {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR"};
const std::vector<std::string> kWarmupTypes = {"log", "linear"};
const std::vector<std::string> kBackends = {"host", "cuda"};
const std::vector<std::string> kComms = {"nccl", "mpi"};

// The top-level keys libzero reads itself.
const std::vector<std::string> kTopLevel = {"train_batch_size",
                                            "train_micro_batch_size_per_gpu",
                                            "gradient_accumulation_steps",
                                            "steps_per_print",
                                            "gradient_clipping",
                                            "zero_optimization",
                                            "aio",
                                            "fp16",
                                            "bf16",
                                            "optimizer",
                                            "scheduler",
                                            "backend",
                                            "comm"};

OffloadDevice device_from(const std::string& s) {
  return s == "cpu" ? OffloadDevice::cpu
                    : (s == "nvme" ? OffloadDevice::nvme : OffloadDevice::none);
}
const char* device_name(OffloadDevice d) {
  return d == OffloadDevice::cpu ? "cpu" : (d == OffloadDevice::nvme ? "nvme" : "none");
}
const char* optimizer_name(OptimizerType t) {
  return t == OptimizerType::adam ? "Adam" : (t == OptimizerType::sgd ? "SGD" : "AdamW");
}
const char* scheduler_name(SchedulerType t) {
  switch (t) {
    case SchedulerType::warmup_lr:
      return "WarmupLR";
    case SchedulerType::warmup_decay_lr:
      return "WarmupDecayLR";
    case SchedulerType::warmup_cosine_lr:
      return "WarmupCosineLR";
    case SchedulerType::none:
      break;
  }
  return "none";
}
const char* warmup_name(WarmupType t) { return t == WarmupType::linear ? "linear" : "log"; }

// PyTorch's defaults, which DeepSpeed passes through: decoupled decay 0.01 for AdamW, none for
// Adam and SGD.
double default_weight_decay(OptimizerType t) { return t == OptimizerType::adamw ? 0.01 : 0.0; }

// DeepSpeed settings that libzero does not implement. Naming them gives a clearer message than
// "unknown key", and keeps them out of the did-you-mean suggestions.
constexpr const char* kDeepSpeedOnlyTop[] = {
    "wall_clock_breakdown", "memory_breakdown", "zero_allow_untested_optimizer",
    "zero_force_ds_cpu_optimizer", "prescale_gradients", "gradient_predivide_factor",
    "sparse_gradients", "communication_data_type", "amp", "activation_checkpointing",
    "flops_profiler", "tensorboard", "wandb", "csv_monitor", "comms_logger", "checkpoint",
    "data_types", "elasticity", "autotuning", "compression_training", "data_efficiency",
    "curriculum_learning", "sparse_attention", "dump_state", "torch_autocast",
    "load_universal_checkpoint", "use_node_local_storage"};
constexpr const char* kDeepSpeedOnlyZero[] = {
    "stage3_gather_16bit_weights_on_model_save", "stage3_gather_fp16_weights_on_model_save",
    "gather_16bit_weights_on_model_save", "round_robin_gradients", "elastic_checkpoint",
    "ignore_unused_parameters", "load_from_fp32_weights", "legacy_stage1", "cpu_offload",
    "cpu_offload_params", "cpu_offload_use_pin_memory", "zero_hpz_partition_size",
    "zero_quantized_weights", "zero_quantized_nontrainable_weights", "zero_quantized_gradients",
    "mics_shard_size", "mics_hierarchical_params_gather", "memory_efficient_linear",
    "use_multi_rank_bucket_allreduce", "stage3_module_granularity_threshold",
    "pipeline_loading_checkpoint", "override_module_apply", "log_trace_cache_warnings",
    "use_all_reduce_for_fetch_params"};

void reject_deepspeed_only(StrictSection& top, StrictSection* zero) {
  const std::string not_here = "is a DeepSpeed setting that libzero does not implement; remove it";
  for (const char* k : kDeepSpeedOnlyTop) top.reject(k, not_here);
  top.reject("bfloat16", "is DeepSpeed's older spelling; write bf16: {enabled: true}");
  if (zero) {
    for (const char* k : kDeepSpeedOnlyZero) zero->reject(k, not_here);
  }
}

// Reads the file sections into a Config. Each section is read completely, then finished, so
// the first unknown key in it is reported with the keys of that section as suggestions.
class Loader {
 public:
  Loader(Config& cfg, const LoadOptions& opts) : cfg_(cfg), opts_(opts) {}

  void load(StrictSection& top) {
    std::optional<StrictSection> zero = top.sub("zero_optimization");
    reject_deepspeed_only(top, zero ? &*zero : nullptr);
    // Unknown top-level keys first: a misspelt section name explains later surprises.
    for (const auto& k : kTopLevel) top.allow(k);
    for (const auto& k : opts_.extra_sections) top.allow(k);
    top.finish();

    batch(top);
    cfg_.steps_per_print = top.get_int("steps_per_print", cfg_.steps_per_print, 1, kNoMax);
    cfg_.gradient_clipping = double_or_auto(top, "gradient_clipping", cfg_.gradient_clipping,
                                            Range::at_least(0), "DeepSpeed default: clipping off");
    if (zero) {
      zero_optimization(*zero);
    } else {
      StrictSection empty = top.section("zero_optimization");
      zero_optimization(empty);
    }
    aio(top.section("aio"));
    precision(top);
    optimizer(top);
    scheduler(top);
    devices(top);
  }

 private:
  void note(const std::string& path, const std::string& value, const std::string& why) {
    cfg_.notes.push_back(path + ": \"auto\" -> " + value + " (" + why + ")");
  }
  std::int64_t int_or_auto(StrictSection& s, std::string_view key, std::int64_t def,
                           std::int64_t min, std::int64_t max) {
    if (s.is_auto(key)) {
      note(s.path_of(key), std::to_string(def), "DeepSpeed default");
      return def;
    }
    return s.get_int(key, def, min, max);
  }
  double double_or_auto(StrictSection& s, std::string_view key, double def, const Range& range,
                        const std::string& why = "DeepSpeed default") {
    if (s.is_auto(key)) {
      note(s.path_of(key), num(def), why);
      return def;
    }
    return s.get_double(key, def, range);
  }
  bool bool_or_auto(StrictSection& s, std::string_view key, bool def) {
    if (s.is_auto(key)) {
      note(s.path_of(key), def ? "true" : "false", "DeepSpeed default");
      return def;
    }
    return s.get_bool(key, def);
  }

  // 0 stands for "not given" or "auto"; resolve() derives it from the world size.
  void batch(StrictSection& top) {
    auto read = [&](const char* key) -> std::int64_t {
      if (top.is_auto(key)) return 0;
      return top.get_int(key, 0, 1, kNoMax);
    };
    cfg_.train_batch_size = read("train_batch_size");
    cfg_.train_micro_batch_size_per_gpu = read("train_micro_batch_size_per_gpu");
    cfg_.gradient_accumulation_steps = read("gradient_accumulation_steps");
  }

  void zero_optimization(StrictSection& z) {
    ZeroOptimizationConfig& c = cfg_.zero_optimization;
    c.stage = static_cast<int>(z.get_int("stage", c.stage, 0, 3));
    c.reduce_bucket_size = int_or_auto(z, "reduce_bucket_size", c.reduce_bucket_size, 1, kNoMax);
    c.allgather_bucket_size =
        z.get_int("allgather_bucket_size", c.allgather_bucket_size, 1, kNoMax);
    // DeepSpeed turns overlap_comm on by default at stage 3 only (its config validator does
    // this; the docs' table says false).
    c.overlap_comm = z.get_bool("overlap_comm", c.stage == 3);
    c.contiguous_gradients = z.get_bool("contiguous_gradients", c.contiguous_gradients);
    c.reduce_scatter = z.get_bool("reduce_scatter", c.reduce_scatter);
    c.stage3_prefetch_bucket_size =
        int_or_auto(z, "stage3_prefetch_bucket_size", c.stage3_prefetch_bucket_size, 0, kNoMax);
    c.stage3_param_persistence_threshold = int_or_auto(
        z, "stage3_param_persistence_threshold", c.stage3_param_persistence_threshold, 0, kNoMax);
    c.stage3_max_live_parameters =
        z.get_int("stage3_max_live_parameters", c.stage3_max_live_parameters, 1, kNoMax);
    c.stage3_max_reuse_distance =
        z.get_int("stage3_max_reuse_distance", c.stage3_max_reuse_distance, 0, kNoMax);
    c.sub_group_size = z.get_int("sub_group_size", c.sub_group_size, 1, kNoMax);

    StrictSection oo = z.section("offload_optimizer");
    c.offload_optimizer.device = device_from(oo.get_choice("device", "none", kDevices));
    c.offload_optimizer.nvme_path = oo.get_string("nvme_path", c.offload_optimizer.nvme_path);
    c.offload_optimizer.pin_memory = oo.get_bool("pin_memory", c.offload_optimizer.pin_memory);
    c.offload_optimizer.buffer_count =
        static_cast<int>(oo.get_int("buffer_count", c.offload_optimizer.buffer_count, 1, 1 << 20));
    oo.finish();
    if (c.offload_optimizer.device == OffloadDevice::nvme &&
        c.offload_optimizer.nvme_path.empty()) {
      oo.fail("device",
              "is nvme but nvme_path is not set; add nvme_path: <a directory on the "
              "NVMe drive> to this section, or use device: cpu");
    }

    StrictSection op = z.section("offload_param");
    c.offload_param.device = device_from(op.get_choice("device", "none", kDevices));
    c.offload_param.nvme_path = op.get_string("nvme_path", c.offload_param.nvme_path);
    c.offload_param.pin_memory = op.get_bool("pin_memory", c.offload_param.pin_memory);
    c.offload_param.buffer_count =
        static_cast<int>(op.get_int("buffer_count", c.offload_param.buffer_count, 1, 1 << 20));
    c.offload_param.buffer_size = op.get_int("buffer_size", c.offload_param.buffer_size, 1, kNoMax);
    c.offload_param.max_in_cpu = op.get_int("max_in_cpu", c.offload_param.max_in_cpu, 0, kNoMax);
    op.finish();
    if (c.offload_param.device == OffloadDevice::nvme && c.offload_param.nvme_path.empty()) {
      op.fail("device",
              "is nvme but nvme_path is not set; add nvme_path: <a directory on the "
              "NVMe drive> to this section, or use device: cpu");
    }
    z.finish();

    // Only stage 3 partitions parameters, so only there is a parameter shard to move off the
    // GPU; an optimizer shard exists from stage 1 on.
    if (c.offload_param.device != OffloadDevice::none && c.stage < 3) {
      op.fail("device", std::string("= ") + device_name(c.offload_param.device) +
                            " needs zero_optimization.stage 3, but stage is " +
                            std::to_string(c.stage) + " (" + z.where("stage") +
                            "); parameter offload exists only at stage 3: set stage: 3 or "
                            "offload_param.device: none");
    }
    if (c.offload_optimizer.device != OffloadDevice::none && c.stage == 0) {
      oo.fail("device", std::string("= ") + device_name(c.offload_optimizer.device) +
                            " needs zero_optimization.stage >= 1, but stage is 0 (" +
                            z.where("stage") +
                            "); set stage: 1 or higher, or "
                            "offload_optimizer.device: none");
    }
  }

  void aio(StrictSection a) {
    AioConfig& c = cfg_.aio;
    c.block_size = a.get_int("block_size", c.block_size, 4096, std::int64_t(1) << 30);
    if (c.block_size % 4096 != 0) {
      a.fail("block_size",
             "= " + std::to_string(c.block_size) +
                 " must be a multiple of 4096 (O_DIRECT transfers are 4 KiB aligned)");
    }
    c.queue_depth = static_cast<int>(a.get_int("queue_depth", c.queue_depth, 1, 65536));
    c.intra_op_parallelism =
        static_cast<int>(a.get_int("intra_op_parallelism", c.intra_op_parallelism, 1, 1024));
    c.single_submit = a.get_bool("single_submit", c.single_submit);
    c.overlap_events = a.get_bool("overlap_events", c.overlap_events);
    a.finish();
  }

  void precision(StrictSection& top) {
    StrictSection f = top.section("fp16");
    Fp16Config& c = cfg_.fp16;
    c.enabled = bool_or_auto(f, "enabled", c.enabled);
    c.loss_scale = f.get_double("loss_scale", c.loss_scale, Range::at_least(0));
    c.initial_scale_power =
        static_cast<int>(f.get_int("initial_scale_power", c.initial_scale_power, 0, 64));
    c.loss_scale_window =
        static_cast<int>(f.get_int("loss_scale_window", c.loss_scale_window, 1, 1 << 30));
    c.hysteresis = static_cast<int>(f.get_int("hysteresis", c.hysteresis, 1, 1 << 30));
    c.min_loss_scale = f.get_double("min_loss_scale", c.min_loss_scale, Range::above(0));
    f.finish();

    StrictSection b = top.section("bf16");
    cfg_.bf16_enabled = bool_or_auto(b, "enabled", cfg_.bf16_enabled);
    b.finish();

    if (c.enabled && cfg_.bf16_enabled) {
      b.fail("enabled", "is true and so is fp16.enabled (" + f.where("enabled") +
                            "); choose one compute precision: set one of them to false");
    }
  }

  void optimizer(StrictSection& top) {
    OptimizerConfig& c = cfg_.optimizer;
    std::optional<StrictSection> o = top.sub("optimizer");
    if (!o) return;
    if (!o->has("type")) {
      o->fail("type", "is missing; the optimizer section needs type: AdamW, Adam or SGD");
    }
    // DeepSpeed matches optimizer names case-insensitively ("adamw", "AdamW").
    std::string type = o->get_choice("type", "AdamW", kOptimizers, true);
    c.type = type == "SGD" ? OptimizerType::sgd
                           : (type == "Adam" ? OptimizerType::adam : OptimizerType::adamw);
    StrictSection p = o->section("params");
    c.lr = double_or_auto(p, "lr", c.lr, Range::at_least(0));
    if (c.type == OptimizerType::sgd) {
      p.reject("betas", "applies to Adam and AdamW, not SGD (use momentum)");
      p.reject("eps", "applies to Adam and AdamW, not SGD");
      c.momentum = p.get_double("momentum", c.momentum, Range::closed_open(0, 1));
    } else {
      p.reject("momentum",
               "applies to SGD only (optimizer.type is " + type + "; Adam's momentum is betas[0])");
      if (p.is_auto("betas")) {
        note(p.path_of("betas"), "[" + num(c.beta1) + ", " + num(c.beta2) + "]",
             "DeepSpeed default");
      } else {
        auto betas = p.get_doubles("betas", {c.beta1, c.beta2}, 2, Range::closed_open(0, 1));
        c.beta1 = betas[0];
        c.beta2 = betas[1];
      }
      c.eps = double_or_auto(p, "eps", c.eps, Range::above(0));
    }
    c.weight_decay = double_or_auto(p, "weight_decay", default_weight_decay(c.type),
                                    Range::at_least(0), std::string("default for ") + type);
    p.finish();
    o->finish();
  }

  void scheduler(StrictSection& top) {
    SchedulerConfig& c = cfg_.scheduler;
    std::optional<StrictSection> s = top.sub("scheduler");
    if (!s) return;
    if (!s->has("type")) {
      s->fail("type",
              "is missing; the scheduler section needs type: WarmupLR, WarmupDecayLR or "
              "WarmupCosineLR (or remove the section for a constant optimizer lr)");
    }
    if (YAML::Node t = s->raw("type");
        t.IsScalar() && (t.Scalar() == "OneCycle" || t.Scalar() == "LRRangeTest")) {
      s->fail("type", "= " + t.Scalar() +
                          " is a DeepSpeed scheduler that libzero does not implement; "
                          "use WarmupLR, WarmupDecayLR or WarmupCosineLR");
    }
    std::string type = s->get_choice("type", "WarmupLR", kSchedulers);
    c.type = type == "WarmupLR" ? SchedulerType::warmup_lr
                                : (type == "WarmupDecayLR" ? SchedulerType::warmup_decay_lr
                                                           : SchedulerType::warmup_cosine_lr);
    StrictSection p = s->section("params");
    // The parameter sets follow DeepSpeed's constructors, which reject each other's arguments.
    if (c.type == SchedulerType::warmup_cosine_lr) {
      p.reject("warmup_min_lr",
               "does not apply to WarmupCosineLR, which scales optimizer.params.lr "
               "by ratios; use warmup_min_ratio");
      p.reject("warmup_max_lr",
               "does not apply to WarmupCosineLR, which warms up to "
               "optimizer.params.lr; set that instead");
      c.warmup_min_ratio =
          double_or_auto(p, "warmup_min_ratio", c.warmup_min_ratio, Range::closed(0, 1));
      c.cos_min_ratio = double_or_auto(p, "cos_min_ratio", c.cos_min_ratio, Range::closed(0, 1));
    } else {
      for (const char* k : {"warmup_min_ratio", "cos_min_ratio"}) {
        p.reject(k, "applies to WarmupCosineLR only (scheduler.type is " + type + ")");
      }
      c.warmup_min_lr = double_or_auto(p, "warmup_min_lr", c.warmup_min_lr, Range::at_least(0));
      if (p.is_auto("warmup_max_lr")) {
        c.warmup_max_lr = cfg_.optimizer.lr;
        note(p.path_of("warmup_max_lr"), num(c.warmup_max_lr), "optimizer.params.lr");
      } else {
        c.warmup_max_lr = p.get_double("warmup_max_lr", c.warmup_max_lr, Range::at_least(0));
      }
    }
    c.warmup_num_steps = int_or_auto(p, "warmup_num_steps", c.warmup_num_steps, 0, kNoMax);
    if (p.is_auto("warmup_type")) {
      note(p.path_of("warmup_type"), warmup_name(c.warmup_type), "DeepSpeed default");
    } else {
      c.warmup_type =
          p.get_choice("warmup_type", warmup_name(c.warmup_type), kWarmupTypes) == "linear"
              ? WarmupType::linear
              : WarmupType::log;
    }
    if (c.type == SchedulerType::warmup_lr) {
      p.reject("total_num_steps",
               "does not apply to WarmupLR, which stays at warmup_max_lr after "
               "the warmup; use WarmupDecayLR or WarmupCosineLR to decay");
    } else if (p.is_auto("total_num_steps")) {
      if (opts_.total_num_steps <= 0) {
        p.fail("total_num_steps",
               "is \"auto\", but the application did not tell libzero the run "
               "length; write the number of optimizer steps");
      }
      c.total_num_steps = opts_.total_num_steps;
      note(p.path_of("total_num_steps"), std::to_string(c.total_num_steps),
           "the run length the application gave");
    } else if (!p.has("total_num_steps")) {
      p.fail("total_num_steps", "is missing; " + type +
                                    " decays over total_num_steps optimizer "
                                    "steps, so it needs the run length");
    } else {
      c.total_num_steps = p.get_int("total_num_steps", c.total_num_steps, 1, kNoMax);
    }
    p.finish();
    s->finish();
    if (c.type != SchedulerType::warmup_lr && c.total_num_steps < c.warmup_num_steps) {
      p.fail("total_num_steps",
             "= " + std::to_string(c.total_num_steps) +
                 " is less than warmup_num_steps = " + std::to_string(c.warmup_num_steps) +
                 ": the run would end inside the warmup; raise total_num_steps "
                 "or shorten the warmup");
    }
  }

  // backend / comm (CUDA backend). The host backend always communicates over MPI, so comm:
  // nccl next to backend: host would be a setting with no effect: an error, not ignored.
  void devices(StrictSection& top) {
    cfg_.backend =
        top.get_choice("backend", "host", kBackends) == "cuda" ? BackendKind::cuda : BackendKind::host;
    const bool comm_given = top.has("comm");
    cfg_.comm = top.get_choice("comm", "nccl", kComms) == "mpi" ? CommKind::mpi : CommKind::nccl;
    if (comm_given && cfg_.backend == BackendKind::host && cfg_.comm == CommKind::nccl) {
      const std::string how = top.has("backend") ? "set at " + top.where("backend") : "the default";
      top.fail("comm", "= nccl applies to backend: cuda, but backend is host (" + how +
                           "); the host backend always communicates over MPI: remove comm, or set "
                           "backend: cuda");
    }
  }

  Config& cfg_;
  const LoadOptions& opts_;
};

std::string trim(std::string_view s) {
  auto b = s.find_first_not_of(" \t");
  if (b == std::string_view::npos) return "";
  auto e = s.find_last_not_of(" \t");
  return std::string(s.substr(b, e - b + 1));
}

// Sets `root[path] = value` for one "a.b.c=value" override, creating sections on the way.
// The paths it creates or replaces are recorded in `locations`, so a message about them names
// the override rather than a line of the file.
void apply_override(YAML::Node root, const std::string& text, KeyLocations& locations) {
  const std::string origin = "--set " + text;
  auto eq = text.find('=');
  if (eq == std::string::npos) {
    throw Error(origin + ": expected key.path=value (for example zero_optimization.stage=3)");
  }
  std::string path = trim(std::string_view(text).substr(0, eq));
  std::string value = trim(std::string_view(text).substr(eq + 1));
  std::vector<std::string> parts;
  for (std::size_t start = 0;;) {
    auto dot = path.find('.', start);
    parts.push_back(path.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  for (const auto& p : parts) {
    if (p.empty()) {
      throw Error(origin + ": the key path '" + path +
                  "' has an empty part; write it like "
                  "zero_optimization.stage=3");
    }
  }
  YAML::Node v = parse_yaml(value, origin);

  YAML::Node cur = root;
  std::string so_far;
  for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
    so_far += (so_far.empty() ? "" : ".") + parts[i];
    const YAML::Node& view = cur;  // const lookup: does not insert the key
    YAML::Node child = view[parts[i]];
    if (!child.IsDefined() || child.IsNull()) {
      cur[parts[i]] = YAML::Node(YAML::NodeType::Map);
      locations[so_far] = origin;
    } else if (!child.IsMap()) {
      throw Error(origin + ": " + so_far + " is a value, not a section, so it has no key '" +
                  parts[i + 1] + "'; check the key path");
    }
    cur.reset(cur[parts[i]]);
  }
  cur[parts.back()] = v;
  locations[path] = origin;
}

// Records where every key of an extra section was set, walking into nested maps and lists.
void record_locations(const YAML::Node& n, const std::string& path, const std::string& origin,
                      const KeyLocations& overrides, KeyLocations& out) {
  auto where = [&](const std::string& p, const YAML::Mark& m) {
    for (std::string q = p; !q.empty();) {
      if (auto it = overrides.find(q); it != overrides.end()) return it->second;
      auto cut = q.find_last_of(".[");
      q = cut == std::string::npos ? std::string() : q.substr(0, cut);
    }
    return m.is_null() ? origin : origin + ":" + std::to_string(m.line + 1);
  };
  if (n.IsMap()) {
    for (auto it = n.begin(); it != n.end(); ++it) {
      if (!it->first.IsScalar()) continue;
      std::string p = path + "." + it->first.Scalar();
      out[p] = where(p, it->first.Mark());
      record_locations(it->second, p, origin, overrides, out);
    }
  } else if (n.IsSequence()) {
    for (std::size_t i = 0; i < n.size(); ++i) {
      record_locations(n[i], path + "[" + std::to_string(i) + "]", origin, overrides, out);
    }
  }
}

Config build(YAML::Node root, const std::string& origin, const LoadOptions& opts) {
  Config cfg;
  cfg.source = origin;
  for (const auto& name : opts.extra_sections) {
    bool ours = std::find(kTopLevel.begin(), kTopLevel.end(), name) != kTopLevel.end();
    if (ours || name.empty() || name.find_first_of(".[]= ") != std::string::npos) {
      throw Error("LoadOptions::extra_sections: '" + name + "' cannot be an application section (" +
                  (ours ? "libzero reads that key itself" : "it must be a plain key name") +
                  "); rename the section");
    }
  }
  if (!root.IsDefined() || root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  if (!root.IsMap()) StrictSection check(root, "", origin);  // throws: says what it got instead

  auto locations = std::make_shared<KeyLocations>();
  for (const auto& o : opts.overrides) apply_override(root, o, *locations);

  StrictSection top(root, "", origin, locations);
  Loader(cfg, opts).load(top);

  for (const auto& name : opts.extra_sections) {
    if (!top.has(name)) continue;
    YAML::Node n = top.raw(name);
    if (n.IsNull()) n = YAML::Node(YAML::NodeType::Map);
    YAML::Emitter out;
    out << n;
    cfg.extra_sections[name] = out.c_str();
    cfg.extra_locations[name] = top.where(name);
    record_locations(n, name, origin, *locations, cfg.extra_locations);
  }
  return cfg;
}

// Product of positive batch numbers, or an error when it does not fit (a typo of many zeros).
std::int64_t checked_mul(std::int64_t a, std::int64_t b, const std::string& shown) {
  std::int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) {
    throw Error("batch sizes overflow 64 bits: " + shown + "; check the batch settings");
  }
  return r;
}

// A directory the NVMe swapper will write into: it must exist, be a directory, and take a new
// file (access() alone says yes to root on a read-only directory, so a probe file decides).
void check_nvme_dir(const std::string& key, const std::string& path, const std::string& source) {
  const std::string at = source + ": " + key + " = " + path + ": ";
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    throw Error(at + "does not exist (" + std::strerror(errno) +
                "); create the directory, or point nvme_path at a directory on an NVMe drive");
  }
  if (!S_ISDIR(st.st_mode)) {
    throw Error(at + "is not a directory; nvme_path names a directory for swap files");
  }
  if (::access(path.c_str(), W_OK | X_OK) != 0) {
    throw Error(at + "is not writable (" + std::strerror(errno) +
                "); fix its permissions or choose another directory");
  }
  std::string probe = path + "/.libzero-probe-XXXXXX";
  int fd = ::mkstemp(probe.data());
  if (fd < 0) {
    throw Error(at + "is not writable: creating a file there failed (" + std::strerror(errno) +
                "); fix its permissions or choose another directory");
  }
  ::close(fd);
  ::unlink(probe.c_str());
}

}  // namespace

Config parse_config(const std::string& text, const std::string& origin, const LoadOptions& opts) {
  return build(parse_yaml(text, origin), origin, opts);
}

Config load_config(const std::string& path, const LoadOptions& opts) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw Error(path + ": cannot open the config file (" + std::strerror(errno) +
                "); check the path");
  }
  std::ostringstream text;
  text << in.rdbuf();
  return parse_config(text.str(), path, opts);
}

void Config::resolve(int world_size) {
  if (world_size < 1) {
    throw Error("Config::resolve: world size " + std::to_string(world_size) +
                " is not a number of ranks; pass the data-parallel world size (>= 1)");
  }
  const std::int64_t w = world_size;
  std::int64_t& tbs = train_batch_size;
  std::int64_t& mbs = train_micro_batch_size_per_gpu;
  std::int64_t& gas = gradient_accumulation_steps;
  auto val = [](std::int64_t v) { return v > 0 ? std::to_string(v) : std::string("auto"); };
  const std::string shown =
      "train_batch_size=" + val(tbs) + ", train_micro_batch_size_per_gpu=" + val(mbs) +
      ", gradient_accumulation_steps=" + val(gas) + ", world size=" + std::to_string(w);
  const std::string rule =
      "train_batch_size must equal train_micro_batch_size_per_gpu x gradient_accumulation_steps x "
      "world size";
  auto derive = [&](std::int64_t whole, std::int64_t part, const char* what) {
    if (whole % part != 0) {
      throw Error(source + ": batch sizes do not divide: " + shown + "; " + rule + ", so " + what +
                  " would be " + std::to_string(whole) + " / " + std::to_string(part) +
                  "; change train_batch_size or the other given number");
    }
    return whole / part;
  };
  std::string derived;
  if (tbs > 0 && mbs > 0 && gas > 0) {
    std::int64_t product = checked_mul(checked_mul(mbs, gas, shown), w, shown);
    if (product != tbs) {
      throw Error(source + ": inconsistent batch sizes: " + shown + "; " + rule +
                  " (= " + std::to_string(product) +
                  "). Fix one of them, or set one to \"auto\" to derive it");
    }
  } else if (tbs > 0 && mbs > 0) {
    gas = derive(tbs, checked_mul(mbs, w, shown), "gradient_accumulation_steps");
    derived = "gradient_accumulation_steps derived";
  } else if (tbs > 0 && gas > 0) {
    mbs = derive(tbs, checked_mul(gas, w, shown), "train_micro_batch_size_per_gpu");
    derived = "train_micro_batch_size_per_gpu derived";
  } else if (mbs > 0 && gas > 0) {
    tbs = checked_mul(checked_mul(mbs, gas, shown), w, shown);
    derived = "train_batch_size derived";
  } else if (tbs > 0) {
    gas = 1;
    mbs = derive(tbs, w, "train_micro_batch_size_per_gpu");
    derived = "only train_batch_size given: gradient_accumulation_steps 1";
  } else if (mbs > 0) {
    gas = 1;
    tbs = checked_mul(mbs, w, shown);
    derived = "only train_micro_batch_size_per_gpu given: gradient_accumulation_steps 1";
  } else if (gas > 0) {
    mbs = 1;
    tbs = checked_mul(gas, w, shown);
    derived = "only gradient_accumulation_steps given: micro batch 1";
  } else {
    mbs = 1;
    gas = 1;
    tbs = w;
    derived = "no batch size given: micro batch 1, gradient_accumulation_steps 1";
  }
  if (!derived.empty()) {
    notes.push_back("batch: train_batch_size " + std::to_string(tbs) +
                    " = train_micro_batch_size_per_gpu " + std::to_string(mbs) +
                    " x gradient_accumulation_steps " + std::to_string(gas) + " x world size " +
                    std::to_string(w) + " (" + derived + ")");
  }

  const auto& z = zero_optimization;
  if (z.offload_optimizer.device == OffloadDevice::nvme) {
    check_nvme_dir("zero_optimization.offload_optimizer.nvme_path", z.offload_optimizer.nvme_path,
                   source);
  }
  if (z.offload_param.device == OffloadDevice::nvme) {
    check_nvme_dir("zero_optimization.offload_param.nvme_path", z.offload_param.nvme_path, source);
  }
  resolved = true;
}

std::string Config::to_yaml() const {
  using YAML::BeginMap;
  using YAML::EndMap;
  using YAML::Key;
  using YAML::Value;
  YAML::Emitter out;
  auto batch = [&](const char* key, std::int64_t v) {
    out << Key << key << Value;
    if (v > 0) {
      out << static_cast<long long>(v);
    } else {
      out << "auto";
    }
  };
  auto i64 = [&](const char* key, std::int64_t v) {
    out << Key << key << Value << static_cast<long long>(v);
  };
  auto real = [&](const char* key, double v) { out << Key << key << Value << num(v); };
  auto flag = [&](const char* key, bool v) { out << Key << key << Value << v; };
  auto text = [&](const char* key, const std::string& v) { out << Key << key << Value << v; };

  out << BeginMap;
  batch("train_batch_size", train_batch_size);
  batch("train_micro_batch_size_per_gpu", train_micro_batch_size_per_gpu);
  batch("gradient_accumulation_steps", gradient_accumulation_steps);
  i64("steps_per_print", steps_per_print);
  real("gradient_clipping", gradient_clipping);

  const auto& z = zero_optimization;
  out << Key << "zero_optimization" << Value << BeginMap;
  i64("stage", z.stage);
  i64("reduce_bucket_size", z.reduce_bucket_size);
  i64("allgather_bucket_size", z.allgather_bucket_size);
  flag("overlap_comm", z.overlap_comm);
  flag("contiguous_gradients", z.contiguous_gradients);
  flag("reduce_scatter", z.reduce_scatter);
  i64("stage3_prefetch_bucket_size", z.stage3_prefetch_bucket_size);
  i64("stage3_param_persistence_threshold", z.stage3_param_persistence_threshold);
  i64("stage3_max_live_parameters", z.stage3_max_live_parameters);
  i64("stage3_max_reuse_distance", z.stage3_max_reuse_distance);
  i64("sub_group_size", z.sub_group_size);
  out << Key << "offload_optimizer" << Value << BeginMap;
  text("device", device_name(z.offload_optimizer.device));
  text("nvme_path", z.offload_optimizer.nvme_path);
  flag("pin_memory", z.offload_optimizer.pin_memory);
  i64("buffer_count", z.offload_optimizer.buffer_count);
  out << EndMap;
  out << Key << "offload_param" << Value << BeginMap;
  text("device", device_name(z.offload_param.device));
  text("nvme_path", z.offload_param.nvme_path);
  flag("pin_memory", z.offload_param.pin_memory);
  i64("buffer_count", z.offload_param.buffer_count);
  i64("buffer_size", z.offload_param.buffer_size);
  i64("max_in_cpu", z.offload_param.max_in_cpu);
  out << EndMap;
  out << EndMap;

  out << Key << "aio" << Value << BeginMap;
  i64("block_size", aio.block_size);
  i64("queue_depth", aio.queue_depth);
  i64("intra_op_parallelism", aio.intra_op_parallelism);
  flag("single_submit", aio.single_submit);
  flag("overlap_events", aio.overlap_events);
  out << EndMap;

  out << Key << "fp16" << Value << BeginMap;
  flag("enabled", fp16.enabled);
  real("loss_scale", fp16.loss_scale);
  i64("initial_scale_power", fp16.initial_scale_power);
  i64("loss_scale_window", fp16.loss_scale_window);
  i64("hysteresis", fp16.hysteresis);
  real("min_loss_scale", fp16.min_loss_scale);
  out << EndMap;
  out << Key << "bf16" << Value << BeginMap;
  flag("enabled", bf16_enabled);
  out << EndMap;

  const auto& o = optimizer;
  out << Key << "optimizer" << Value << BeginMap;
  text("type", optimizer_name(o.type));
  out << Key << "params" << Value << BeginMap;
  real("lr", o.lr);
  if (o.type == OptimizerType::sgd) {
    real("momentum", o.momentum);
  } else {
    out << Key << "betas" << Value << YAML::Flow << YAML::BeginSeq << num(o.beta1) << num(o.beta2)
        << YAML::EndSeq;
    real("eps", o.eps);
  }
  real("weight_decay", o.weight_decay);
  out << EndMap;
  out << EndMap;

  text("backend", backend == BackendKind::cuda ? "cuda" : "host");
  // comm only means something to the CUDA backend (the loader rejects comm: nccl with host).
  if (backend == BackendKind::cuda) text("comm", comm == CommKind::mpi ? "mpi" : "nccl");

  // No scheduler section means a constant lr; its parameters then keep their defaults.
  const auto& s = scheduler;
  if (s.type != SchedulerType::none) {
    out << Key << "scheduler" << Value << BeginMap;
    text("type", scheduler_name(s.type));
    out << Key << "params" << Value << BeginMap;
    if (s.type == SchedulerType::warmup_cosine_lr) {
      real("warmup_min_ratio", s.warmup_min_ratio);
      real("cos_min_ratio", s.cos_min_ratio);
    } else {
      real("warmup_min_lr", s.warmup_min_lr);
      real("warmup_max_lr", s.warmup_max_lr);
    }
    i64("warmup_num_steps", s.warmup_num_steps);
    text("warmup_type", warmup_name(s.warmup_type));
    if (s.type != SchedulerType::warmup_lr) i64("total_num_steps", s.total_num_steps);
    out << EndMap;
    out << EndMap;
  }

  for (const auto& [name, yaml] : extra_sections) {
    out << Key << name << Value
        << parse_yaml(yaml, (source.empty() ? "config" : source) + " (section " + name + ")");
  }
  out << EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace zero
