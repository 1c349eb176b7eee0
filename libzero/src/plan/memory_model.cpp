// Model-state bytes as the engine accounts them (EngineImpl::memory: ParamStore, GradReducer and
// the optimizer stores), qgZ's scratch as its pool counts it, and the settings a Config asks for.
#include <fmt/format.h>

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "comm/quantize.hpp"
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

std::int64_t qgz_buffer_bytes(const Layout& layout, const Settings& s, int data_parallel, int ranks_per_node) {
  if (!s.quantized_gradients) return 0;
  const std::int64_t D = data_parallel, L = std::min(D, static_cast<std::int64_t>(ranks_per_node)), M = D / std::max<std::int64_t>(L, 1);
  ZERO_CHECK(L >= 1 && D % L == 0, fmt::format("qgz_buffer_bytes: qgZ needs the same ranks on every node; {} data-parallel "
                                               "ranks by {} per node", D, ranks_per_node));
  const auto block = static_cast<std::size_t>(s.quantized_weights_block_size);
  auto packed = [&](std::int64_t n, quant::Bits bits) {
    return static_cast<std::int64_t>(quant::packed_bytes(static_cast<std::size_t>(n), block, bits));
  };
  const int N = s.shard_ranks(data_parallel);
  // What QuantizedReduceScatter takes from its pool for a unit of `slice` elements per rank
  // (BufferPool::peak counts the bytes handed out; which freed buffer of equal size is reused
  // does not change it):
  //   phase 1 (L > 1): send1 and recv1, L int8 messages of M slices each: P1 = 2 L packed8(M slice),
  //     taken when the reduction starts, given back once phase 1 is summed;
  //   partial: the node's fp32 sum of the M slices this rank serves, Q = 4 M slice, taken when
  //     phase 1 is summed (while send1 and recv1 are still out), given back at the end;
  //   phase 2 (M > 1): send2 and recv2, M int4 messages of one slice: P2 = 2 M packed4(slice),
  //     taken after phase 1's buffers went back, given back at the end.
  // An op holds `held` from its start until it is waited on, and at most `top` while it completes:
  // with L > 1, held = P1 and top = Q + max(P1, P2); with L = 1 there is no phase 1 and start()
  // runs phase 2 at once, so held = top = Q + P2 (M > 1), or the partial sum comes and goes
  // inside start() (one rank: held 0, top Q).
  struct Op {
    std::int64_t held = 0, top = 0;
  };
  // The reducer's buckets (GradReducer::ready): units in backward order until their padded
  // elements reach reduce_bucket_size, the rest when the micro-step's last unit is reduced.
  std::vector<std::vector<Op>> buckets(1);
  std::int64_t pending = 0;
  for (int u = layout.num_units() - 1; u >= 0; --u) {
    const std::int64_t slice = layout.slice_numel(u, N);
    const std::int64_t p1 = L > 1 ? 2 * L * packed(M * slice, quant::Bits::int8) : 0;
    const std::int64_t q = 4 * M * slice;
    const std::int64_t p2 = M > 1 ? 2 * M * packed(slice, quant::Bits::int4) : 0;
    if (L > 1) buckets.back().push_back({p1, q + std::max(p1, p2)});
    else if (M > 1) buckets.back().push_back({q + p2, q + p2});
    else buckets.back().push_back({0, q});
    pending += slice * N;
    if (pending >= s.reduce_bucket_size) {
      buckets.emplace_back();
      pending = 0;
    }
  }
  if (buckets.back().empty()) buckets.pop_back();
  // A bucket starts all its ops, then waits on them in start order: completing op i (phase 2
  // starts in start order, so only op i advances) holds the later ops' `held` besides its own
  // `top`: complete(b) = max_i (Σ_{j>i} held_j + top_i). The bucket's total `held` is what it
  // holds while in flight. Without overlap_comm each bucket completes before the next starts:
  // the peak is the largest complete(b). With it the next bucket is started (in full) before
  // this one is waited on: complete(b) + held(next), for consecutive buckets of a micro-step
  // and, with gradient accumulation, the last bucket and the next micro-step's first (the
  // step waits on everything before it, so nothing spans steps); the last bucket of the step
  // completes alone.
  std::vector<std::int64_t> complete(buckets.size()), held(buckets.size());
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    std::int64_t later = 0;
    for (auto op = buckets[b].rbegin(); op != buckets[b].rend(); ++op) {
      complete[b] = std::max(complete[b], later + op->top);
      later += op->held;
    }
    held[b] = later;
  }
  std::int64_t peak = 0;
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    peak = std::max(peak, complete[b]);
    if (!s.overlap_comm) continue;
    if (b + 1 < buckets.size()) peak = std::max(peak, complete[b] + held[b + 1]);
    else if (s.grad_accum > 1) peak = std::max(peak, complete[b] + held[0]);
  }
  return peak;
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
