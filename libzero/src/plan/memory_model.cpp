// Model-state bytes as the engine accounts them (EngineImpl::memory: ParamStore, GradReducer and
// the optimizer stores), qgZ's scratch as its pool counts it, and the settings a Config asks for.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "optim/optimizer.hpp"
#include "plan/engine_sizes.hpp"
#include "zero/error.hpp"
#include "zero/optim.hpp"
#include "zero/plan/plan.hpp"

namespace zero::plan {

ModelStates model_states(const Layout& layout, const Settings& s, int data_parallel) {
  // MiCS: the engine partitions over its group (rank r owns slice r mod N, sized for N).
  const int world = s.shard_ranks(data_parallel);
  const std::int64_t es = static_cast<std::int64_t>(dtype_size(s.dtype));
  const std::int64_t state_per_elem = static_cast<std::int64_t>(sizeof(float)) * (1 + s.moments);
  const ReduceBuffers reducer = reduce_buffers(s);
  ModelStates m;
  std::vector<std::int64_t> slices;
  for (const UnitShape& u : unit_shapes(layout, s, data_parallel)) {
    slices.push_back(u.slice);
    // Stage 3 shards a unit's parameters unless it is below the persistence threshold.
    const std::int64_t pbytes = u.param_elements() * es;
    if (u.sharded_params && s.offload_param == OffloadDevice::nvme)
      m.nvme += pbytes;
    else if (u.sharded_params && s.offload_param == OffloadDevice::cpu)
      m.host += pbytes;
    else
      m.params += pbytes;
    m.grads += static_cast<std::int64_t>(reducer.stored_bytes(u));
    // hpZ: the rank's chunk of the gathered unit (padded for every rank), kept for the group.
    if (u.sharded_params && s.hpz_partition_size > 1) m.secondary += u.padded / s.hpz_partition_size * es;
    if (s.quantized_gradients) m.error_feedback += qgz_feedback_bytes(u.slice, world);
    // Stage 0 steps the whole (padded) unit on every rank; stages 1-3 step the owned slice.
    const std::int64_t own = u.own_len;
    switch (s.offload_optimizer) {
      case OffloadDevice::none:
        m.master += own * static_cast<std::int64_t>(sizeof(float));
        m.optimizer += own * static_cast<std::int64_t>(sizeof(float)) * s.moments;
        break;
      case OffloadDevice::cpu: m.host += own * state_per_elem; break;
      case OffloadDevice::nvme: m.nvme += own * state_per_elem; break;
    }
  }
  m.optimizer_buffers = optimizer_buffer_bytes(s.optimizer, layout, slices, world);
  return m;
}

namespace {

// BufferPool hands a freed buffer only to a request of its own size and keeps it otherwise, so
// what it holds is, for every size, that size times the most buffers of it in use at once:
// held = Σ_size size x most(size). Replaying a step's acquisitions and give-backs gives most();
// every later step repeats them (the step waits on all before it) and adds nothing.
class PoolReplay {
 public:
  void take(std::size_t bytes) {
    auto& [n, most] = sizes_[bytes];
    most = std::max(most, ++n);
  }
  void give(std::size_t bytes) { --sizes_[bytes].first; }
  std::int64_t held() const {
    std::int64_t h = 0;
    for (const auto& [bytes, use] : sizes_) h += static_cast<std::int64_t>(bytes) * use.second;
    return h;
  }

 private:
  std::map<std::size_t, std::pair<int, int>> sizes_;  // bytes -> (in use, most at once)
};

// The reducer's buckets (GradReducer::ready): units in backward order (the GPT trainer's: ln_f,
// the blocks from the last, the embeddings) until their padded elements reach
// reduce_bucket_size; the rest when the micro-step's last unit is reduced.
std::vector<std::vector<int>> reduce_buckets(const std::vector<UnitShape>& shapes, const Settings& s) {
  std::vector<std::vector<int>> buckets(1);
  std::int64_t pending = 0;
  for (int u = static_cast<int>(shapes.size()) - 1; u >= 0; --u) {
    buckets.back().push_back(u);
    pending += unit_at(shapes, u).padded;
    if (bucket_full(pending, s.reduce_bucket_size)) {
      buckets.emplace_back();
      pending = 0;
    }
  }
  if (buckets.back().empty()) buckets.pop_back();
  return buckets;
}

// The reductions of `micro_steps` micro-steps, in the reducer's order: each unit of a bucket
// becomes ready (its gradient written, GradReducer::grads then ready), then the flush starts
// every reduction of the bucket and (GradReducer::wait_in_flight) completes them in start
// order, or with overlap_comm those of the bucket before it (the previous micro-step's last at
// a micro-step's first), this one staying in flight. The step completes the last bucket.
template <class Ready, class Start, class Complete>
void replay_reductions(const std::vector<std::vector<int>>& buckets, bool overlap, int micro_steps, Ready ready,
                       Start start, Complete complete) {
  const std::vector<int>* in_flight = nullptr;
  for (int micro = 0; micro < micro_steps; ++micro)
    for (const auto& bucket : buckets) {
      for (int u : bucket) ready(u);
      for (int u : bucket) start(u);
      const std::vector<int>* wait = &bucket;
      if (overlap) std::swap(wait, in_flight);
      if (wait != nullptr)
        for (int u : *wait) complete(u);
    }
  if (in_flight != nullptr)
    for (int u : *in_flight) complete(u);
}

}  // namespace

std::int64_t qgz_buffer_bytes(const Layout& layout, const Settings& s, int data_parallel, int ranks_per_node) {
  if (!s.quantized_gradients) return 0;
  const std::int64_t D = data_parallel, L = std::min(D, static_cast<std::int64_t>(ranks_per_node));
  ZERO_CHECK(L >= 1 && D % L == 0,
             fmt::format("qgz_buffer_bytes: qgZ needs the same ranks on every node; {} data-parallel "
                         "ranks by {} per node",
                         D, ranks_per_node));
  const std::int64_t M = D / L;
  // The buffers QuantizedReduceScatter takes from its pool for a unit, sized by its own rule
  // (QuantizedReduceScatter::scratch_for), and when:
  //   send1, recv1 (L > 1): phase 1's messages, taken when the reduction starts, given back once
  //     phase 1 is summed;
  //   partial: taken when phase 1 is summed (send1 and recv1 still out), given back at the end;
  //   send2, recv2 (M > 1): phase 2's messages, taken after send1 and recv1 went back, given
  //     back at the end.
  // Without node peers (L = 1) start() sums and starts phase 2 at once; on one rank the partial
  // sum comes and goes inside start(). Only the waited reduction advances, phase 2 starting in
  // start order.
  using Unit = QuantizedReduceScatter::Scratch;
  const std::vector<UnitShape> shapes = unit_shapes(layout, s, data_parallel);
  std::vector<Unit> units;
  for (const UnitShape& shape : shapes)
    units.push_back(QuantizedReduceScatter::scratch_for(static_cast<std::size_t>(L), static_cast<std::size_t>(M),
                                                        static_cast<std::size_t>(shape.slice),
                                                        static_cast<std::size_t>(s.quantized_weights_block_size)));
  PoolReplay pool;
  auto start = [&](int unit) {
    const Unit& u = unit_at(units, unit);
    if (L > 1) {
      pool.take(u.phase1);  // send1
      pool.take(u.phase1);  // recv1
      return;
    }
    pool.take(u.partial);
    if (M == 1) {
      pool.give(u.partial);
      return;
    }
    pool.take(u.phase2);  // send2
    pool.take(u.phase2);  // recv2
  };
  auto complete = [&](int unit) {
    const Unit& u = unit_at(units, unit);
    if (L == 1 && M == 1) return;  // done inside start()
    if (L > 1) {
      pool.take(u.partial);
      pool.give(u.phase1);
      pool.give(u.phase1);
      if (M == 1) {
        pool.give(u.partial);
        return;
      }
      pool.take(u.phase2);
      pool.take(u.phase2);
    }
    pool.give(u.partial);
    pool.give(u.phase2);
    pool.give(u.phase2);
  };
  replay_reductions(
      reduce_buckets(shapes, s), s.overlap_comm, s.grad_accum, [](int) {}, start, complete);
  return pool.held();
}

std::int64_t reduce_buffer_bytes(const Layout& layout, const Settings& s, int data_parallel) {
  // The reducer's two pools (GradReducer: grad_pool_, scratch_pool_), each holding for itself,
  // replayed with the reducer's own buffer rules (engine/reduce_buffers.hpp):
  //   grad_pool_: a unit's micro-step gradient, where grads() hands one out. Stages 2/3: taken
  //     when the unit is ready, given back when its reduction completes. Stages 0/1 only when
  //     the gradients accumulate in another dtype: added into the sum and given back at once,
  //     so one buffer of each unit size.
  //   scratch_pool_: a reduction's scratch, taken when it starts, given back when it completes.
  // Stages 0/1 reduce once, at the step's last micro-step (not at all under PowerSGD, whose step
  // reduces the gradients itself); stages 2/3 every micro-step. Assumes the GPT trainer's
  // pattern: a unit's gradient is written just before it is reduced (grads(u), reduce(u)).
  const std::vector<UnitShape> shapes = unit_shapes(layout, s, data_parallel);
  const ReduceBuffers rule = reduce_buffers(s);
  auto micro = [&](int u) { return rule.micro_bytes(unit_at(shapes, u)); };
  auto scratch = [&](int u) { return rule.reduces(true) ? rule.scratch_bytes(unit_at(shapes, u)) : 0; };
  PoolReplay grad_pool, scratch_pool;
  auto ready = [&](int u) {
    if (!rule.pooled_micro()) return;
    grad_pool.take(micro(u));
    if (rule.separate_micro()) grad_pool.give(micro(u));
  };
  auto start = [&](int u) {
    if (scratch(u) > 0) scratch_pool.take(scratch(u));
  };
  auto complete = [&](int u) {
    if (scratch(u) > 0) scratch_pool.give(scratch(u));
    if (rule.stage >= 2) grad_pool.give(micro(u));
  };
  const int micro_steps = rule.stage <= 1 ? 1 : s.grad_accum;
  replay_reductions(reduce_buckets(shapes, s), s.overlap_comm, micro_steps, ready, start, complete);
  return grad_pool.held() + scratch_pool.held();
}

std::int64_t offload_staging_bytes(const Layout& layout, const Settings& s, int data_parallel) {
  if (s.offload_optimizer == OffloadDevice::none) return 0;
  const auto bytes = static_cast<std::int64_t>(dtype_size(s.grad_dtype()) + dtype_size(s.dtype));
  std::int64_t own = 0, largest = 0;
  for (const UnitShape& u : unit_shapes(layout, s, data_parallel)) {
    own += u.own_len;
    largest = std::max(largest, u.own_len);
  }
  // EngineImpl::update_owned_slices: the staging takes every unit's owned range at once, for
  // every optimizer (a multi-pass one reads the gradients copied once in each pass). Parameters
  // offloaded, it cannot serve, and the engine copies one sub-group (a unit's owned range cut
  // into sub_group_size pieces) at a time through one buffer.
  if (s.offload_param == OffloadDevice::none) return own * bytes;
  return std::min(std::max<std::int64_t>(1, s.sub_group_size), largest) * bytes;
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
  s.communication_data_type = cfg.communication_data_type;
  s.moments = optimizer_moments(cfg.optimizer);
  s.optimizer = cfg.optimizer;
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
  auto dev = [](OffloadDevice d) {
    return d == OffloadDevice::cpu ? "cpu" : d == OffloadDevice::nvme ? "nvme" : "none";
  };
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
