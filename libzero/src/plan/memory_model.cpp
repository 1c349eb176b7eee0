// Model-state bytes as the engine accounts them (EngineImpl::memory: ParamStore, GradReducer and
// the optimizer stores), and the settings a Config asks for.
#include <fmt/format.h>

#include <algorithm>
#include <sstream>
#include <string>

#include "zero/error.hpp"
#include "zero/optim.hpp"
#include "zero/plan.hpp"

namespace zero::plan {

ModelStates model_states(const Layout& layout, const Settings& s, int data_parallel) {
  // MiCS: the engine partitions over its group (rank r owns slice r mod N, sized for N).
  const int world = s.shard_ranks(data_parallel);
  const std::int64_t es = static_cast<std::int64_t>(dtype_size(s.dtype));
  const std::int64_t ges = static_cast<std::int64_t>(dtype_size(s.grad_dtype()));
  const std::int64_t state_per_elem = static_cast<std::int64_t>(sizeof(float)) * (1 + s.moments);
  ModelStates m;
  for (int i = 0; i < layout.num_units(); ++i) {
    const std::int64_t numel = layout.unit(i).numel;
    const std::int64_t slice = layout.slice_numel(i, world);
    const std::int64_t padded = slice * world;
    // Stage 3 shards a unit's parameters unless it is below the persistence threshold.
    const bool sharded = s.stage == 3 && numel >= s.persistence_threshold;
    const std::int64_t pbytes = (sharded ? slice : padded) * es;
    if (sharded && s.offload_param == OffloadDevice::nvme) m.nvme += pbytes;
    else if (sharded && s.offload_param == OffloadDevice::cpu) m.host += pbytes;
    else m.params += pbytes;
    m.grads += (s.stage <= 1 ? padded : slice) * ges;
    // hpZ: the rank's chunk of the gathered unit (padded for every rank), kept for the group.
    if (sharded && s.hpz_partition_size > 1) m.secondary += padded / s.hpz_partition_size * es;
    if (s.quantized_gradients) m.error_feedback += (world - 1) * slice * static_cast<std::int64_t>(sizeof(float));
    // Stage 0 steps the whole (padded) unit on every rank; stages 1-3 step the owned slice.
    const std::int64_t own = s.stage == 0 ? padded : slice;
    switch (s.offload_optimizer) {
      case OffloadDevice::none:
        m.master += own * static_cast<std::int64_t>(sizeof(float));
        m.optimizer += own * static_cast<std::int64_t>(sizeof(float)) * s.moments;
        break;
      case OffloadDevice::cpu: m.host += own * state_per_elem; break;
      case OffloadDevice::nvme: m.nvme += own * state_per_elem; break;
    }
  }
  return m;
}

void check_groups(const Settings& s, int data_parallel) {
  if (s.mics_shard_size != -1) {
    const std::string key = fmt::format("zero-plan: mics_shard_size {}", s.mics_shard_size);
    ZERO_CHECK(s.mics_shard_size >= 1, key + " is not a group size; use a divisor of the data-parallel ranks, or -1");
    ZERO_CHECK(s.stage >= 1, fmt::format("{} applies to stages 1-3 (got stage {})", key, s.stage));
    ZERO_CHECK(data_parallel % s.mics_shard_size == 0,
               fmt::format("{} does not divide the {} data-parallel ranks", key, data_parallel));
    ZERO_CHECK(s.hpz_partition_size == 1, key + " with hpZ: the engine takes one of them");
  }
  if (s.quantized_gradients) {
    const std::string key = "zero-plan: zero_quantized_gradients (qgZ)";
    ZERO_CHECK(s.stage >= 2, fmt::format("{} applies to stages 2 and 3 (got stage {})", key, s.stage));
    ZERO_CHECK(s.reduce_scatter, key + " quantizes the gradient reduce-scatter; it needs reduce_scatter on");
    ZERO_CHECK(s.mics_shard_size == -1, key + " with MiCS: the engine takes one of them");
  }
  if (s.powersgd()) {
    const std::string key = "zero-plan: PowerSGD (gradient_compression)";
    ZERO_CHECK(s.stage <= 1, fmt::format("{} applies to stages 0 and 1 (got stage {})", key, s.stage));
    ZERO_CHECK(s.mics_shard_size == -1, key + " with MiCS: the engine takes one of them");
    ZERO_CHECK(s.tensor_parallel == 1 && s.pipeline_parallel == 1,
               key + " runs without tensor or pipeline parallelism, as the engine does");
    ZERO_CHECK(s.compression.rank >= 1, fmt::format("{}: rank {} must be at least 1", key, s.compression.rank));
  }
}

Settings settings_from(const Config& cfg) {
  const auto& z = cfg.zero_optimization;
  Settings s;
  s.stage = z.stage;
  s.offload_optimizer = z.offload_optimizer.device;
  s.offload_param = z.offload_param.device;
  s.micro_batch = static_cast<int>(std::max<std::int64_t>(1, cfg.train_micro_batch_size_per_gpu));
  s.grad_accum = static_cast<int>(std::max<std::int64_t>(1, cfg.gradient_accumulation_steps));
  s.dtype = cfg.compute_dtype();
  s.grad_accum_dtype = cfg.grad_accum_dtype;  // concrete once the config is resolved
  s.moments = optimizer_moments(cfg.optimizer.type);
  s.reduce_bucket_size = z.reduce_bucket_size;
  s.allgather_bucket_size = z.allgather_bucket_size;
  s.prefetch_bucket_size = z.stage3_prefetch_bucket_size;
  s.max_live_parameters = z.stage3_max_live_parameters;
  s.persistence_threshold = z.stage3_param_persistence_threshold;
  s.sub_group_size = z.sub_group_size;
  s.overlap_comm = z.overlap_comm;
  s.reduce_scatter = z.reduce_scatter;
  s.max_reuse_distance = z.stage3_max_reuse_distance;
  s.hpz_partition_size = static_cast<int>(z.zero_hpz_partition_size);
  s.quantized_weights = z.zero_quantized_weights;
  s.quantized_weights_block_size = z.zero_quantized_weights_block_size;
  s.quantized_gradients = z.zero_quantized_gradients;
  s.mics_shard_size = static_cast<int>(z.mics_shard_size);
  s.compression = cfg.gradient_compression;
  return s;
}

std::string Settings::label() const {
  auto dev = [](OffloadDevice d) { return d == OffloadDevice::cpu ? "cpu" : d == OffloadDevice::nvme ? "nvme" : "none"; };
  // (a stream, not string concatenation: GCC 12 at -O3 misreports the latter as -Wrestrict)
  std::ostringstream l;
  l << "stage " << stage;
  if (offload_optimizer != OffloadDevice::none) l << ", opt " << dev(offload_optimizer);
  if (offload_param != OffloadDevice::none) l << ", param " << dev(offload_param);
  if (tensor_parallel > 1) l << ", tp " << tensor_parallel;
  if (pipeline_parallel > 1) l << ", pp " << pipeline_parallel;
  if (hpz_partition_size > 1) l << ", hpz " << hpz_partition_size;
  if (quantized_weights) l << ", qwz";
  if (quantized_gradients) l << ", qgz";
  if (mics_shard_size != -1) l << ", mics " << mics_shard_size;
  if (powersgd()) l << ", powersgd " << compression.rank;
  l << ", mb " << micro_batch;
  if (grad_accum > 1) l << "x" << grad_accum;
  if (activation_checkpointing) l << ", ckpt";
  return l.str();
}

}  // namespace zero::plan
