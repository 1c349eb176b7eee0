// The table of libzero's configuration keys (config/keys.hpp). Order matters: a key is read
// after the keys its default or applicability depends on (stage before overlap_comm,
// optimizer.type before its params), and to_yaml writes the keys in this order.
#include "config/keys.hpp"

#include <limits>
#include <string>
#include <vector>

namespace zero::keys {

namespace {

constexpr double kI32 = 2147483647.0;

std::string no_scheduler(const Config& c) {
  if (c.scheduler.type == SchedulerType::manual_lr)
    return "does not apply to ManualLR, whose rate the training loop sets (Engine::set_lr); remove "
           "scheduler.params";
  return c.scheduler.type == SchedulerType::none ? "needs a scheduler (scheduler.type)" : "";
}

std::string cosine_only(const Config& c) {
  if (!no_scheduler(c).empty()) return no_scheduler(c);
  return c.scheduler.type == SchedulerType::warmup_cosine_lr
             ? std::string()
             : "applies to WarmupCosineLR only (scheduler.type is " +
                   std::string(c.scheduler.type == SchedulerType::warmup_lr ? "WarmupLR" : "WarmupDecayLR") + ")";
}

std::string not_cosine(const Config& c) {
  if (!no_scheduler(c).empty()) return no_scheduler(c);
  return c.scheduler.type != SchedulerType::warmup_cosine_lr
             ? std::string()
             : "does not apply to WarmupCosineLR, which scales optimizer.params.lr by ratios "
               "(warmup_min_ratio, cos_min_ratio); set optimizer.params.lr instead";
}

std::string decaying_only(const Config& c) {
  if (!no_scheduler(c).empty()) return no_scheduler(c);
  return c.scheduler.type != SchedulerType::warmup_lr
             ? std::string()
             : "does not apply to WarmupLR, which stays at warmup_max_lr after the warmup; use "
               "WarmupDecayLR or WarmupCosineLR to decay";
}

std::string powersgd_only(const Config& c) {
  return c.gradient_compression.type == CompressionType::powersgd
             ? std::string()
             : "applies to gradient_compression.type: powersgd only";
}

}  // namespace

// null_is_default follows DeepSpeed 0.19 (deepspeed/runtime): the batch triple, steps_per_print
// and data_types.grad_accum_dtype default to None there (constants.py, read with .get), so null
// is the same as absent; overlap_comm and both nvme_path keys are Optional fields (zero/config.py,
// zero/offload_config.py). Every other key of the table is a plain typed field or a value
// DeepSpeed uses as given, where null fails or means something else (adam_w_mode: null is false).
const std::vector<Spec>& config_keys() {
  static const std::vector<Spec> table = [] {
    std::vector<Spec> t = {
      // ---- batch and top level
      {.path = "train_batch_size", .kind = Kind::integer,
       .slot = [](Config& c) -> Slot { return &c.train_batch_size; }, .range = ge(1),
       .auto_rule = Auto::derived,
       .doc = "Samples per optimizer step over all ranks: micro batch x accumulation x world size.",
       .default_text = "derived", .null_is_default = true},
      {.path = "train_micro_batch_size_per_gpu", .kind = Kind::integer,
       .slot = [](Config& c) -> Slot { return &c.train_micro_batch_size_per_gpu; },
       .range = between(1, kI32), .auto_rule = Auto::derived,
       .doc = "Samples per forward/backward on one rank.", .default_text = "derived",
       .null_is_default = true},
      {.path = "gradient_accumulation_steps", .kind = Kind::integer,
       .slot = [](Config& c) -> Slot { return &c.gradient_accumulation_steps; },
       .range = between(1, kI32), .auto_rule = Auto::derived,
       .doc = "Micro batches accumulated before each optimizer step.", .default_text = "derived",
       .null_is_default = true},
      {.path = "steps_per_print", .kind = Kind::integer,
       .slot = [](Config& c) -> Slot { return &c.steps_per_print; }, .range = ge(1),
       .doc = "Print progress every this many optimizer steps.", .null_is_default = true},
      {.path = "gradient_clipping", .kind = Kind::real,
       .slot = [](Config& c) -> Slot { return &c.gradient_clipping; }, .range = ge(0),
       .auto_rule = Auto::fallback, .doc = "Clip the global gradient norm to this value; 0: off.",
       // DeepSpeed's default became 1.0 in 0.19.3 (constants.py, GRADIENT_CLIPPING_DEFAULT); a
       // DeepSpeed JSON file gets that default (ConfigLoader), a YAML file keeps libzero's 0.
       .default_text = "`0`; a DeepSpeed JSON file `1`, as DeepSpeed >= 0.19.3"},
      {.path = "gradient_average", .kind = Kind::choice,
       .slot = [](Config&) -> Slot {
         return EnumRef{[](const Config& k) { return static_cast<int>(k.gradient_average); },
                        [](Config& k, int v) { k.gradient_average = GradientAverage(v); }};
       },
       .choices = {"steps_and_ranks", "ranks", "none"},
       .doc = "What `step()` divides the summed gradients by: `steps_and_ranks` (accumulation steps x "
              "data-parallel world size, as DeepSpeed), `ranks` (the loop's loss seed divides by its "
              "accumulation steps, as llm.c's does), `none` (the loop's gradients are already the mean "
              "of the global batch). Not DeepSpeed's `prescale_gradients` / `gradient_predivide_factor`, "
              "which only move where the same average is taken."},

      // ---- zero_optimization
      {.path = "zero_optimization.stage", .kind = Kind::integer,
       .slot = [](Config& c) -> Slot { return &c.zero_optimization.stage; }, .range = between(0, 3),
       .doc = "0: plain data parallel; 1: optimizer state sharded; 2: + gradients; 3: + parameters."},
      {.path = "zero_optimization.reduce_bucket_size", .kind = Kind::integer,
       .slot = [](Config& c) -> Slot { return &c.zero_optimization.reduce_bucket_size; },
       .range = ge(0), .auto_rule = Auto::fallback,
       .doc = "Elements per gradient reduce(-scatter) bucket (0: one bucket per unit)."},
      {.path = "zero_optimization.allgather_bucket_size", .kind = Kind::integer,
       .slot = [](Config& c) -> Slot { return &c.zero_optimization.allgather_bucket_size; },
       .range = ge(0), .auto_rule = Auto::fallback,
       .doc = "Elements per all-gather bucket (stages 1 and 2, updated parameters; 0: per unit)."},
      {.path = "zero_optimization.overlap_comm", .kind = Kind::flag,
       .slot = [](Config& c) -> Slot { return &c.zero_optimization.overlap_comm; },
       .auto_rule = Auto::fallback, .doc = "Overlap gradient reduction with the backward pass.",
       .default_text = "`true` at stage 3, else `false`",
       // DeepSpeed turns overlap_comm on by default at stage 3 only (its config validator does
       // this; the docs' table says false).
       .dynamic_default = [](Config& c) {
         c.zero_optimization.overlap_comm = c.zero_optimization.stage == 3;
       },
       .default_depends_on = "zero_optimization.stage", .null_is_default = true},
      {.path = "zero_optimization.contiguous_gradients", .kind = Kind::flag,
       .slot = [](Config& c) -> Slot { return &c.zero_optimization.contiguous_gradients; },
       .auto_rule = Auto::fallback,
       .doc = "Accepted for DeepSpeed; each unit's gradient is always one contiguous buffer."},
      {.path = "zero_optimization.reduce_scatter", .kind = Kind::flag,
       .slot = [](Config& c) -> Slot { return &c.zero_optimization.reduce_scatter; },
       .auto_rule = Auto::fallback,
       .doc = "Reduce gradients with reduce-scatter instead of all-reduce."},
      {.path = "zero_optimization.stage3_prefetch_bucket_size", .kind = Kind::integer,
       .slot = [](Config& c) -> Slot { return &c.zero_optimization.stage3_prefetch_bucket_size; },
       .range = ge(0), .auto_rule = Auto::fallback, .aliases = {"prefetch_bucket_size"},
       .doc = "Stage 3: elements of parameters to all-gather ahead of use."},
      {.path = "zero_optimization.stage3_param_persistence_threshold", .kind = Kind::integer,
       .slot = [](Config& c) -> Slot {
         return &c.zero_optimization.stage3_param_persistence_threshold;
       },
       .range = ge(0), .auto_rule = Auto::fallback, .aliases = {"param_persistence_threshold"},
       .doc = "Stage 3: units with fewer elements stay gathered."},
      {.path = "zero_optimization.stage3_max_live_parameters", .kind = Kind::integer,
       .slot = [](Config& c) -> Slot { return &c.zero_optimization.stage3_max_live_parameters; },
       .range = ge(0), .auto_rule = Auto::fallback, .aliases = {"max_live_parameters"},
       .doc = "Stage 3: most gathered parameter elements held at once (the unit in use always is)."},
      {.path = "zero_optimization.stage3_max_reuse_distance", .kind = Kind::integer,
       .slot = [](Config& c) -> Slot { return &c.zero_optimization.stage3_max_reuse_distance; },
       .range = ge(0), .auto_rule = Auto::fallback, .aliases = {"max_reuse_distance"},
       .doc = "Stage 3: keep a gathered unit if it is used again within this many elements."},
      {.path = "zero_optimization.zero_hpz_partition_size", .kind = Kind::integer,
       .slot = [](Config& c) -> Slot { return &c.zero_optimization.zero_hpz_partition_size; },
       .range = ge(1), .auto_rule = Auto::fallback,
       .doc = "Stage 3, ZeRO++ hpZ: ranks per group (consecutive, normally a node) keeping a secondary "
              "shard of the gathered parameters; gathers after the first in a step stay in the group. 1: off."},
      {.path = "zero_optimization.mics_shard_size", .kind = Kind::integer,
       .slot = [](Config& c) -> Slot { return &c.zero_optimization.mics_shard_size; },
       .range = ge(-1), .auto_rule = Auto::fallback,
       .doc = "Stages 1-3, MiCS / hybrid sharding: model states sharded over groups of this many consecutive "
              "ranks (normally a node), replicated across groups; gradients all-reduced across groups once per "
              "step. A divisor of the data-parallel ranks; -1: off."},
      {.path = "zero_optimization.zero_quantized_weights", .kind = Kind::flag,
       .slot = [](Config& c) -> Slot { return &c.zero_optimization.zero_quantized_weights; },
       .auto_rule = Auto::fallback,
       .doc = "Stage 3, ZeRO++ qwZ: parameter all-gathers send int8 with an fp32 scale per block (each value within "
              "max abs(x) / 254 of its block); the master weights are untouched."},
      {.path = "zero_optimization.zero_quantized_weights_block_size", .kind = Kind::integer,
       .slot = [](Config& c) -> Slot { return &c.zero_optimization.zero_quantized_weights_block_size; },
       .range = ge(1), .auto_rule = Auto::fallback,
       .doc = "qwZ and qgZ: elements per quantization block (one fp32 scale each)."},
      {.path = "zero_optimization.zero_quantized_gradients", .kind = Kind::flag,
       .slot = [](Config& c) -> Slot { return &c.zero_optimization.zero_quantized_gradients; },
       .auto_rule = Auto::fallback,
       .doc = "Stages 2-3, ZeRO++ qgZ: the gradient reduce-scatter runs inside each node with int8 blocks (each value "
              "within max abs(x) / 254 of its block), then across nodes with int4 blocks (within max abs(x) / 14), "
              "summed in fp32, with error feedback (each rank keeps the fp32 error of what it sent and adds it to "
              "the next reduction). Needs reduce_scatter: true; not with mics_shard_size or tensor/pipeline "
              "parallelism."},
      {.path = "zero_optimization.sub_group_size", .kind = Kind::integer,
       .slot = [](Config& c) -> Slot { return &c.zero_optimization.sub_group_size; },
       .range = ge(0), .auto_rule = Auto::fallback,
       .doc = "Elements per optimizer sub-group stepped at a time (bounds offload buffers)."},
      {.path = "zero_optimization.offload_optimizer.device", .kind = Kind::choice,
       .slot = [](Config&) -> Slot {
         return EnumRef{[](const Config& k) {
                          return static_cast<int>(k.zero_optimization.offload_optimizer.device);
                        },
                        [](Config& k, int v) {
                          k.zero_optimization.offload_optimizer.device = OffloadDevice(v);
                        }};
       },
       .choices = {"none", "cpu", "nvme"},
       .doc = "Where the optimizer state shard lives. Needs stage >= 1."},
      {.path = "zero_optimization.offload_optimizer.nvme_path", .kind = Kind::text,
       .slot = [](Config& c) -> Slot { return &c.zero_optimization.offload_optimizer.nvme_path; },
       .doc = "Directory for optimizer swap files; required with `nvme`, created if missing.",
       .default_text = "empty", .null_is_default = true},
      {.path = "zero_optimization.offload_optimizer.pin_memory", .kind = Kind::flag,
       .slot = [](Config& c) -> Slot { return &c.zero_optimization.offload_optimizer.pin_memory; },
       .doc = "Use pinned host memory for offloaded state."},
      {.path = "zero_optimization.offload_optimizer.buffer_count", .kind = Kind::integer,
       .slot = [](Config& c) -> Slot { return &c.zero_optimization.offload_optimizer.buffer_count; },
       .range = between(1, 1 << 20),
       .doc = "Accepted for DeepSpeed; NVMe offload streams through three buffers."},
      {.path = "zero_optimization.offload_param.device", .kind = Kind::choice,
       .slot = [](Config&) -> Slot {
         return EnumRef{
             [](const Config& k) { return static_cast<int>(k.zero_optimization.offload_param.device); },
             [](Config& k, int v) { k.zero_optimization.offload_param.device = OffloadDevice(v); }};
       },
       .choices = {"none", "cpu", "nvme"},
       .doc = "Where the parameter shard lives. Needs stage 3."},
      {.path = "zero_optimization.offload_param.nvme_path", .kind = Kind::text,
       .slot = [](Config& c) -> Slot { return &c.zero_optimization.offload_param.nvme_path; },
       .doc = "Directory for parameter swap files; required with `nvme`, created if missing.",
       .default_text = "empty", .null_is_default = true},
      {.path = "zero_optimization.offload_param.pin_memory", .kind = Kind::flag,
       .slot = [](Config& c) -> Slot { return &c.zero_optimization.offload_param.pin_memory; },
       .doc = "Use pinned host memory for offloaded parameters."},
      {.path = "zero_optimization.offload_param.buffer_count", .kind = Kind::integer,
       .slot = [](Config& c) -> Slot { return &c.zero_optimization.offload_param.buffer_count; },
       .range = between(1, 1 << 20),
       .doc = "Accepted for DeepSpeed; a slice is resident only while gathered."},
      {.path = "zero_optimization.offload_param.buffer_size", .kind = Kind::integer,
       .slot = [](Config& c) -> Slot { return &c.zero_optimization.offload_param.buffer_size; },
       .range = ge(1), .doc = "Accepted for DeepSpeed; a slice is resident only while gathered."},
      {.path = "zero_optimization.offload_param.max_in_cpu", .kind = Kind::integer,
       .slot = [](Config& c) -> Slot { return &c.zero_optimization.offload_param.max_in_cpu; },
       .range = ge(0), .doc = "Accepted for DeepSpeed; a slice is resident only while gathered."},

      // ---- gradient_compression (PowerSGD, with PyTorch's PowerSGDState names as aliases)
      {.path = "gradient_compression.type", .kind = Kind::choice,
       .slot = [](Config&) -> Slot {
         return EnumRef{[](const Config& k) { return static_cast<int>(k.gradient_compression.type); },
                        [](Config& k, int v) { k.gradient_compression.type = CompressionType(v); }};
       },
       .choices = {"none", "powersgd"}, .any_case = true,
       .doc = "`powersgd`: low-rank compression of the gradient all-reduce with error feedback (Vogels et "
              "al. 2019, PyTorch's `powerSGD_hook`), stages 0 and 1; on `backend: cuda` host-staged; see the "
              "PowerSGD section of docs/multi-node.md."},
      {.path = "gradient_compression.rank", .kind = Kind::integer,
       .slot = [](Config& c) -> Slot { return &c.gradient_compression.rank; }, .range = between(1, 1 << 16),
       .aliases = {"matrix_approximation_rank"},
       .doc = "PowerSGD: rank of each matrix's approximation (columns of P and Q).", .inapplicable = powersgd_only},
      {.path = "gradient_compression.start_step", .kind = Kind::integer,
       .slot = [](Config& c) -> Slot { return &c.gradient_compression.start_step; }, .range = ge(0),
       .aliases = {"start_powerSGD_iter"},
       .doc = "PowerSGD: steps (counted from 0, skipped ones included) reduced plainly before compressing.",
       .inapplicable = powersgd_only},
      {.path = "gradient_compression.min_compression_rate", .kind = Kind::real,
       .slot = [](Config& c) -> Slot { return &c.gradient_compression.min_compression_rate; }, .range = ge(0),
       .doc = "PowerSGD: compress a matrix only where rows x cols > this x (rows + cols) x rank.",
       .inapplicable = powersgd_only},
      {.path = "gradient_compression.warm_start", .kind = Kind::flag,
       .slot = [](Config& c) -> Slot { return &c.gradient_compression.warm_start; },
       .doc = "PowerSGD: start each step's power iteration from the previous step's Q (false: a new random Q).",
       .inapplicable = powersgd_only},
      {.path = "gradient_compression.factor_dtype", .kind = Kind::choice,
       .slot = [](Config&) -> Slot {
         return EnumRef{[](const Config& k) { return static_cast<int>(k.gradient_compression.factor_dtype); },
                        [](Config& k, int v) { k.gradient_compression.factor_dtype = DType(v); }};
       },
       .choices = {"fp32", "bf16"},
       .doc = "PowerSGD: the dtype the factors P and Q are all-reduced in; `bf16` (as PyTorch's "
              "`bf16_compress_wrapper`) halves their counted bytes and keeps the rounding in the error "
              "buffers; the MPI wire still carries them as fp32 (docs/multi-node.md, PowerSGD).",
       .inapplicable = powersgd_only},

      // ---- aio
      {.path = "aio.block_size", .kind = Kind::integer,
       .slot = [](Config& c) -> Slot { return &c.aio.block_size; },
       .range = between(4096, 1 << 30), .doc = "Bytes per NVMe I/O request; a multiple of 4096."},
      {.path = "aio.queue_depth", .kind = Kind::integer,
       .slot = [](Config& c) -> Slot { return &c.aio.queue_depth; }, .range = between(1, 65536),
       .doc = "NVMe requests in flight."},
      {.path = "aio.intra_op_parallelism", .kind = Kind::integer,
       .slot = [](Config& c) -> Slot { return &c.aio.intra_op_parallelism; },
       .range = between(1, 1024), .aliases = {"thread_count"},
       .doc = "Accepted for DeepSpeed; one io_uring ring per rank does the transfers."},
      {.path = "aio.single_submit", .kind = Kind::flag,
       .slot = [](Config& c) -> Slot { return &c.aio.single_submit; },
       .doc = "Accepted for DeepSpeed; requests are submitted in batches."},
      {.path = "aio.overlap_events", .kind = Kind::flag,
       .slot = [](Config& c) -> Slot { return &c.aio.overlap_events; },
       .doc = "Accepted for DeepSpeed; completions always overlap submissions."},

      // ---- precision
      {.path = "fp16.enabled", .kind = Kind::flag,
       .slot = [](Config& c) -> Slot { return &c.fp16.enabled; }, .auto_rule = Auto::fallback,
       .doc = "Compute in fp16 with fp32 master weights and loss scaling."},
      {.path = "fp16.loss_scale", .kind = Kind::real,
       .slot = [](Config& c) -> Slot { return &c.fp16.loss_scale; }, .range = ge(0),
       .doc = "0: dynamic loss scaling; > 0: this static scale."},
      {.path = "fp16.initial_scale_power", .kind = Kind::integer,
       .slot = [](Config& c) -> Slot { return &c.fp16.initial_scale_power; },
       .range = between(0, 64), .doc = "Dynamic scaling starts at 2^this."},
      {.path = "fp16.loss_scale_window", .kind = Kind::integer,
       .slot = [](Config& c) -> Slot { return &c.fp16.loss_scale_window; },
       .range = between(1, 1 << 30), .doc = "Overflow-free steps before the scale doubles."},
      {.path = "fp16.hysteresis", .kind = Kind::integer,
       .slot = [](Config& c) -> Slot { return &c.fp16.hysteresis; }, .range = between(1, 1 << 30),
       .doc = "Overflows tolerated before the scale halves."},
      {.path = "fp16.min_loss_scale", .kind = Kind::real,
       .slot = [](Config& c) -> Slot { return &c.fp16.min_loss_scale; }, .range = Range::above(0),
       .doc = "The scale never drops below this."},
      {.path = "bf16.enabled", .kind = Kind::flag,
       .slot = [](Config& c) -> Slot { return &c.bf16_enabled; }, .auto_rule = Auto::fallback,
       .doc = "Compute in bf16 with fp32 master weights. Not together with fp16. DeepSpeed's "
              "`bfloat16` section is the same."},
      {.path = "data_types.grad_accum_dtype", .kind = Kind::choice,
       .slot = [](Config&) -> Slot {
         return EnumRef{[](const Config& k) { return static_cast<int>(k.grad_accum_dtype); },
                        [](Config& k, int v) { k.grad_accum_dtype = GradAccumDType(v); }};
       },
       .choices = {"auto", "fp32", "fp16", "bf16"},
       .doc = "What gradients accumulate in across micro-steps: `fp32` (fp32 buffers; at stages 0 "
              "and 1 the boundary's reduction is then in fp32 too) or the compute dtype. `auto`: "
              "fp32 on the CUDA backend when gradient_accumulation_steps > 1 with fp16/bf16 "
              "compute, else the compute dtype. A 16-bit dtype other than the compute dtype is an "
              "error.",
       .null_is_default = true},
      {.path = "communication_data_type", .kind = Kind::choice,
       .slot = [](Config&) -> Slot {
         return EnumRef{[](const Config& k) { return static_cast<int>(k.communication_data_type); },
                        [](Config& k, int v) { k.communication_data_type = CommDataType(v); }};
       },
       .choices = {"auto", "fp32", "fp16", "bf16"},
       .doc = "What stages 0 and 1 reduce gradients accumulated in fp32 in. `auto` (DeepSpeed's None): "
              "fp32, twice the bytes of bf16. The compute dtype (`bf16` or `fp16`): each rank's fp32 sum is "
              "rounded to it once, just before the reduction, which then sends half the bytes; the "
              "result is widened back to fp32. Elsewhere gradients are reduced in their own dtype "
              "already (stages 2 and 3: each micro-step's, in the compute dtype); another value "
              "is a note at start. MiCS's sum across its groups stays in fp32.",
       .null_is_default = true},

    };
    // ---- optimizer (keys_optimizer.cpp)
    for (Spec& k : optimizer_keys()) t.push_back(std::move(k));
    std::vector<Spec> after = {
        // ---- devices
        {.path = "debug.audit_interval",
         .kind = Kind::integer,
         .slot = [](Config& c) -> Slot { return &c.audit_interval; },
         .range = ge(0),
         .doc = "Every this many steps, check each unit's reduced gradient against a plain all-reduce of "
                "the ranks' local gradients and stop, naming the unit, on a difference beyond rounding; "
                "0: off. Costs a stage-0 all-reduce and a host copy of the local gradients on those steps. "
                "Not with PowerSGD, qgZ, OneBitAdam or OneBitLamb, whose reductions are lossy by design."},
        {.path = "backend",
         .kind = Kind::choice,
         .slot = [](Config&) -> Slot {
           return EnumRef{[](const Config& k) { return static_cast<int>(k.backend); },
                          [](Config& k, int v) { k.backend = BackendKind(v); }};
         },
         .choices = {"host", "cuda"},
         .doc = "Where parameters and gradients live, so what the pointers of `gather()` / "
                "`grads()` point to: host memory (MPI, runs everywhere) or device memory (one GPU "
                "per rank, kernels, NCCL). `cuda` needs a build with `-DZERO_CUDA=ON`."},
        {.path = "comm",
         .kind = Kind::choice,
         .slot = [](Config&) -> Slot {
           return EnumRef{[](const Config& k) { return static_cast<int>(k.comm); },
                          [](Config& k, int v) { k.comm = CommKind(v); }};
         },
         .choices = {"nccl", "mpi"},
         .doc = "The CUDA backend's communicator: NCCL (one GPU per rank), or MPI through pinned "
                "host copies (several ranks may share one GPU). `nccl` with the host backend is an "
                "error.",
         // comm only means something to the CUDA backend; written out, comm: nccl would not load.
         .omitted = [](const Config& c) { return c.backend != BackendKind::cuda; }},

        // ---- scheduler
        {.path = "scheduler.type",
         .kind = Kind::choice,
         .slot = [](Config&) -> Slot {
           return EnumRef{[](const Config& k) { return static_cast<int>(k.scheduler.type); },
                          [](Config& k, int v) { k.scheduler.type = SchedulerType(v); }};
         },
         .choices = {"", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "ManualLR"},
         .doc = "Learning-rate schedule; no section: constant `optimizer.params.lr`. `ManualLR`: the "
                "training loop sets the rate of each step (`Engine::set_lr`), checkpoints keep it.",
         .default_text = "none",
         .omitted = [](const Config& c) { return c.scheduler.type == SchedulerType::none; },
         .refused_values = {{"OneCycle", "is a DeepSpeed scheduler that libzero does not implement"},
                            {"LRRangeTest", "is a DeepSpeed scheduler that libzero does not implement"}}},
        {.path = "scheduler.params.warmup_min_lr",
         .kind = Kind::real,
         .slot = [](Config& c) -> Slot { return &c.scheduler.warmup_min_lr; },
         .range = ge(0),
         .auto_rule = Auto::fallback,
         .doc = "WarmupLR, WarmupDecayLR: lr at step 0 (and the end of the decay).",
         .inapplicable = not_cosine},
        {.path = "scheduler.params.warmup_max_lr",
         .kind = Kind::real,
         .slot = [](Config& c) -> Slot { return &c.scheduler.warmup_max_lr; },
         .range = ge(0),
         .auto_rule = Auto::fallback,
         .auto_from = "optimizer.params.lr",
         .doc = "WarmupLR, WarmupDecayLR: lr after the warmup (these ignore `optimizer.params.lr`).",
         .inapplicable = not_cosine},
        {.path = "scheduler.params.warmup_min_ratio",
         .kind = Kind::real,
         .slot = [](Config& c) -> Slot { return &c.scheduler.warmup_min_ratio; },
         .range = between(0, 1),
         .auto_rule = Auto::fallback,
         .doc = "WarmupCosineLR: lr ratio at step 0.",
         .inapplicable = cosine_only},
        {.path = "scheduler.params.cos_min_ratio",
         .kind = Kind::real,
         .slot = [](Config& c) -> Slot { return &c.scheduler.cos_min_ratio; },
         .range = between(0, 1),
         .auto_rule = Auto::fallback,
         .doc = "WarmupCosineLR: lr ratio at the end of the cosine.",
         .inapplicable = cosine_only},
        {.path = "scheduler.params.warmup_num_steps",
         .kind = Kind::integer,
         .slot = [](Config& c) -> Slot { return &c.scheduler.warmup_num_steps; },
         .range = ge(0),
         .auto_rule = Auto::fallback,
         .doc = "Warmup length in optimizer steps (at least 2 are used, as in DeepSpeed).",
         .inapplicable = no_scheduler},
        {.path = "scheduler.params.warmup_type",
         .kind = Kind::choice,
         .slot = [](Config&) -> Slot {
           return EnumRef{[](const Config& k) { return static_cast<int>(k.scheduler.warmup_type); },
                          [](Config& k, int v) { k.scheduler.warmup_type = WarmupType(v); }};
         },
         .choices = {"log", "linear"},
         .auto_rule = Auto::fallback,
         .doc = "Warmup curve: `log(step+1)/log(warmup)` or `step/warmup`.",
         .inapplicable = no_scheduler},
        {.path = "scheduler.params.total_num_steps",
         .kind = Kind::integer,
         .slot = [](Config& c) -> Slot { return &c.scheduler.total_num_steps; },
         .range = ge(1),
         .auto_rule = Auto::required,
         .doc = "WarmupDecayLR, WarmupCosineLR: run length, at least the warmup; the decay ends here.",
         .default_text = "required",
         .inapplicable = decaying_only},
    };
    for (Spec& k : after) t.push_back(std::move(k));
    return t;
  }();
  return table;
}

const std::vector<SectionAlias>& section_aliases() {
  static const std::vector<SectionAlias> table = {{"bf16", "bfloat16"}};
  return table;
}

// DeepSpeed: bf16 falls back to bfloat16 and then {} when None (precision_config.py); aio is
// read only when not None (swap_tensor/aio_config.py); offload_param and offload_optimizer are
// Optional (zero/config.py); optimizer.params is read as `params or {}` (engine.py). fp16,
// zero_optimization, optimizer, scheduler and data_types set to null fail there (a None where a
// dict is expected), so they are errors here too.
const std::vector<std::string_view>& null_default_sections() {
  static const std::vector<std::string_view> table = {"bf16", "aio", "zero_optimization.offload_optimizer",
                                                      "zero_optimization.offload_param", "optimizer.params"};
  return table;
}

}  // namespace zero::keys
