// The engine's start-up reports, on the data-parallel group's rank 0: MiCS's groups, stage 3's
// sharded and persistent units, qgZ's plan, and the DeepSpeed settings that change nothing here.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/mpi_comm.hpp"
#include "engine/engine_impl.hpp"
#include "runtime/log.hpp"

namespace zero {

// The start-up line: MiCS's groups, and whether each stays inside a node (as it should: its
// parameter gathers and reduce-scatters then never cross a node boundary).
void EngineImpl::report_mics_groups() const {
  const int n = world_, groups = dp_world_ / world_;
  if (!mics_.shard) {
    log_info("MiCS: mics_shard_size {} = every data-parallel rank: one group, plain ZeRO stage {}", n, stage_);
    return;
  }
  // The node of every data-parallel rank (the host communicator knows them).
  const std::vector<int>& node = static_cast<const MpiCommunicator&>(dp_comm_).nodes();
  std::vector<std::string> shard_groups, replica_groups;
  bool inside_nodes = true;
  for (int g = 0; g < groups; ++g) {
    shard_groups.push_back(n == 1 ? fmt::format("{}", g) : fmt::format("{}-{}", g * n, g * n + n - 1));
    for (int k = 1; k < n; ++k)
      inside_nodes = inside_nodes && node[static_cast<std::size_t>(g * n + k)] == node[static_cast<std::size_t>(g * n)];
  }
  for (int k = 0; k < n; ++k) {
    std::vector<int> members;
    for (int g = 0; g < groups; ++g) members.push_back(g * n + k);
    replica_groups.push_back(fmt::format("{{{}}}", fmt::join(members, ",")));
  }
  log_info(
      "MiCS: mics_shard_size {}: stage {} model states sharded over {} groups of {} consecutive ranks ({}), "
      "replicated across groups; parameter gathers, reduce-scatters and the optimizer step stay in the group "
      "{}; gradients all-reduced across groups between ranks of the same position ({})",
      n, stage_, groups, n, fmt::join(shard_groups, ", "),
      inside_nodes ? "(each inside one node)" : "(groups span nodes: make mics_shard_size the ranks per node)",
      fmt::join(replica_groups, ", "));
}

// What qgZ does on this layout: its groups, the bytes it sends, what it pads, its buffers.
void EngineImpl::report_qgz() const {
  TrafficBytes per_step;
  std::int64_t padding = 0;
  for (const auto& s : shapes_) {
    per_step += qgz_->bytes_per_reduction(static_cast<std::size_t>(s.slice));
    padding += s.padded - s.numel;
  }
  // The reducer's buffers, already made: a Feedback made here to be measured would take (device)
  // memory on rank 0 alone, and stay cached there.
  const std::size_t feedback = reducer_.error_feedback_size() * sizeof(float);
  log_info(
      "qgZ (zero_quantized_gradients): gradient reduce-scatter inside each node with int8 blocks of {}, then "
      "across {} nodes x {} ranks between ranks of the same local rank with int4 blocks of {}, error feedback "
      "{} per rank (fp32); this rank sends {} inside its node and {} across nodes per micro-step. Padding: the "
      "units' own ({} elements in all, so that each splits into {} equal slices), and each message rounded up "
      "to whole 4-byte words; no other size is changed, none falls back to the plain reduce-scatter",
      qgz_->block(), qgz_->nodes(), qgz_->ranks_per_node(), qgz_->block(),
      format_bytes(static_cast<std::uint64_t>(feedback)), format_bytes(static_cast<std::uint64_t>(per_step.intra_node)),
      format_bytes(static_cast<std::uint64_t>(per_step.inter_node)), padding, world_);
}

// Stage 3 shards only the units at or above stage3_param_persistence_threshold (DeepSpeed's
// default 1e5 elements): on a small model that can be none, and stage 3 then keeps the
// parameters whole on every rank, as stage 2 does. Say which units are which, and warn then.
void EngineImpl::report_stage3_sharding() const {
  const std::int64_t threshold = cfg_.zero_optimization.stage3_param_persistence_threshold;
  std::vector<std::string> sharded, persistent;
  int largest = 0;
  for (int i = 0; i < layout_.num_units(); ++i) {
    const std::string entry = fmt::format("{} ({})", layout_.unit(i).name, shape(i).numel);
    (shape(i).sharded_params ? sharded : persistent).push_back(entry);
    if (shape(i).numel > shape(largest).numel) largest = i;
  }
  // A model of hundreds of units would fill screens: the first few of each list, then a count.
  auto listed = [](const std::vector<std::string>& names) {
    constexpr std::size_t kShown = 8;
    std::string out;
    for (std::size_t k = 0; k < std::min(kShown, names.size()); ++k) out += (k ? ", " : "") + names[k];
    if (names.size() > kShown) out += fmt::format(" and {} more", names.size() - kShown);
    return names.empty() ? std::string("none") : out;
  };
  log_info(
      "stage 3, stage3_param_persistence_threshold {}: {} of {} units sharded: {}; {} persistent (whole on "
      "every rank, fewer elements than the threshold): {}",
      threshold, sharded.size(), layout_.num_units(), listed(sharded), persistent.size(), listed(persistent));
  if (sharded.empty())
    log_warning(
        "stage 3 shards no unit's parameters: every unit has fewer elements than "
        "zero_optimization.stage3_param_persistence_threshold = {} (the largest, '{}', has {}), so each "
        "rank keeps all parameters as at stage 2; lower the threshold (0 shards every unit) to shard them",
        threshold, layout_.unit(largest).name, shape(largest).numel);
}

// Settings DeepSpeed users carry over that change nothing here. They are accepted so a
// ds_config.json loads as is, but a non-default value is said out loud (rank 0, once), never
// silently ignored.
void EngineImpl::report_inert_settings() const {
  const auto& z = cfg_.zero_optimization;
  const ZeroOptimizationConfig dz;
  const AioConfig da;
  std::vector<std::string> notes;
  if (z.contiguous_gradients != dz.contiguous_gradients)
    notes.push_back(
        "zero_optimization.contiguous_gradients: false has no effect: each unit's gradient is always one "
        "contiguous buffer");
  if (z.offload_optimizer.buffer_count != dz.offload_optimizer.buffer_count)
    notes.push_back(
        "zero_optimization.offload_optimizer.buffer_count has no effect: NVMe offload streams sub-groups "
        "through three buffers (read next, step current, write previous)");
  if (cfg_.aio.intra_op_parallelism != da.intra_op_parallelism || cfg_.aio.single_submit != da.single_submit ||
      cfg_.aio.overlap_events != da.overlap_events)
    notes.push_back(
        "aio.intra_op_parallelism / single_submit / overlap_events have no effect: one io_uring ring per "
        "rank submits in batches and overlaps completions; block_size and queue_depth are honoured");
  if (z.offload_param.device != OffloadDevice::none && (z.offload_param.buffer_count != dz.offload_param.buffer_count ||
                                                        z.offload_param.buffer_size != dz.offload_param.buffer_size ||
                                                        z.offload_param.max_in_cpu != dz.offload_param.max_in_cpu))
    notes.push_back(
        "zero_optimization.offload_param.buffer_count / buffer_size / max_in_cpu have no effect: a unit's "
        "slice is read from NVMe when its gather starts and released when the gather completes");
  if (z.offload_param.device == OffloadDevice::cpu)
    notes.push_back(
        "zero_optimization.offload_param.device: cpu: on the host backend parameters already live in host "
        "memory");
  if (dp_comm_.rank() == 0)
    for (const auto& n : notes) log_info("{}", n);
}

}  // namespace zero
