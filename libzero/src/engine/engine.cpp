// Engine construction, parameter initialisation and reports.
#include "zero/engine.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "comm/mpi_comm.hpp"
#include "engine/engine_impl.hpp"
#include "zero/groups.hpp"
#include "runtime/log.hpp"
#include "zero/error.hpp"

namespace zero {

// ---------------------------------------------------------------- EngineImpl

namespace {

// The engine counts micro-steps in an int; a Config built by hand could hold more.
int accumulation_steps(const Config& cfg) {
  ZERO_CHECK(cfg.gradient_accumulation_steps >= 1 && cfg.gradient_accumulation_steps <= INT32_MAX,
             fmt::format("Engine: gradient_accumulation_steps {} does not fit the engine's int counter; use the "
                         "Config that load_config and resolve() give",
                         cfg.gradient_accumulation_steps));
  return static_cast<int>(cfg.gradient_accumulation_steps);
}

}  // namespace

// The backend over the partition group: all ranks, groups->data(), or MiCS's shard group. A
// CUDA backend bootstraps its device communicator over that group's host communicator.
std::unique_ptr<Backend> make_engine_backend(Context& ctx, const Config& cfg, ProcessGroups* groups,
                                             Communicator* mics_shard) {
  if (mics_shard != nullptr) return make_backend(ctx, cfg, *mics_shard);
  return make_backend(ctx, cfg, groups ? groups->data() : ctx.comm());
}

// A communicator for backend memory over a host sub-group (hpZ's, MiCS's replica group): the
// backend's own kind over its ranks, or the host group itself (null) on the host backend.
namespace {
std::unique_ptr<Communicator> make_group_device_comm(Backend& backend, Communicator* group) {
  return group != nullptr ? backend.group_comm(*group) : nullptr;
}
}  // namespace

// hpZ's group (zero_hpz_partition_size consecutive ranks of the data-parallel group), or null.
std::unique_ptr<Communicator> make_hpz_comm(const Config& cfg, Communicator& host) {
  // qwZ's conditions are checked here too: both change stage 3's parameter gathers.
  if (cfg.zero_optimization.zero_quantized_weights) {
    ZERO_CHECK(cfg.zero_optimization.stage == 3,
               fmt::format("{}: zero_optimization.zero_quantized_weights applies to stage 3 only (it quantizes the "
                           "parameter all-gathers, which stage {} does not make); set it to false, or use stage 3",
                           cfg.source, cfg.zero_optimization.stage));
  }
  const std::int64_t n = cfg.zero_optimization.zero_hpz_partition_size;
  if (n == 1) return nullptr;
  const std::string key = fmt::format("{}: zero_optimization.zero_hpz_partition_size = {}", cfg.source, n);
  ZERO_CHECK(cfg.zero_optimization.stage == 3,
             fmt::format("{} applies to stage 3 only (a secondary shard of the parameters, which stage {} keeps "
                         "whole); set it to 1, or use stage 3",
                         key, cfg.zero_optimization.stage));
  ZERO_CHECK(host.size() % n == 0,
             fmt::format("{} does not divide the {} data-parallel ranks; use a divisor, normally the ranks per node",
                         key, host.size()));
  auto* mpi = dynamic_cast<MpiCommunicator*>(&host);
  ZERO_CHECK(mpi != nullptr, key + ": needs the host (MPI) communicator");
  return mpi->split(host.rank() / static_cast<int>(n), host.rank());
}

// qgZ's hierarchical quantized reduce-scatter over the data-parallel group, or null.
std::unique_ptr<QuantizedReduceScatter> make_qgz(const Config& cfg, Communicator& host, Backend& backend,
                                                 bool model_parallel) {
  const auto& z = cfg.zero_optimization;
  if (!z.zero_quantized_gradients) return nullptr;
  const std::string key = cfg.source + ": zero_optimization.zero_quantized_gradients";
  ZERO_CHECK(z.stage >= 2, fmt::format("{} applies to stages 2 and 3 (it quantizes the per-micro-step gradient "
                                       "reduce-scatter, which stage {} does not make); set it to false, or use stage "
                                       "2 or 3",
                                       key, z.stage));
  ZERO_CHECK(z.reduce_scatter, key + " quantizes the gradient reduce-scatter, and zero_optimization.reduce_scatter: "
                                     "false asks for an all-reduce instead; set reduce_scatter to true, or "
                                     "zero_quantized_gradients to false");
  // MiCS reduces inside its groups and then all-reduces across them; qgZ's two phases would have
  // to be rebuilt around that, so the combination is refused rather than half supported.
  ZERO_CHECK(z.mics_shard_size == -1,
             fmt::format("{} with zero_optimization.mics_shard_size = {} is not supported; use one of them",
                         key, z.mics_shard_size));
  // Its per-rank error-feedback files are named by data-parallel rank, which every grid position shares.
  ZERO_CHECK(!model_parallel, key + " runs without tensor or pipeline parallelism so far; use tensor and pipeline "
                                    "sizes of 1, or set it to false");
  auto* mpi = dynamic_cast<MpiCommunicator*>(&host);
  ZERO_CHECK(mpi != nullptr, key + ": needs the host (MPI) communicator");
  return std::make_unique<QuantizedReduceScatter>(*mpi, static_cast<std::size_t>(z.zero_quantized_weights_block_size),
                                                  &backend);
}

// gradient_compression's compressor, or null. The config loader refuses the bad combinations
// with the key's file and line; these checks catch a Config built by hand.
std::unique_ptr<PowerSgd> make_powersgd(const Config& cfg, Communicator& comm, const Layout& layout,
                                        const std::vector<UnitShape>& shapes, int rank, bool model_parallel) {
  if (cfg.gradient_compression.type == CompressionType::none) return nullptr;
  // Its per-rank state files are named by data-parallel rank, which every grid position shares.
  ZERO_CHECK(!model_parallel, cfg.source + ": gradient_compression.type = powersgd runs without tensor or pipeline "
                                           "parallelism so far; use tensor and pipeline sizes of 1, or type: none");
  ZERO_CHECK(cfg.zero_optimization.mics_shard_size == -1,
             cfg.source + ": gradient_compression.type = powersgd with zero_optimization.mics_shard_size is not "
                          "supported; use one of them");
  return std::make_unique<PowerSgd>(comm, layout, shapes, cfg.gradient_compression, cfg.grad_dtype(),
                                    cfg.zero_optimization.stage, rank == 0);
}

// MiCS (mics_shard_size N): groups of N consecutive data-parallel ranks, each holding the whole
// model state sharded N ways, and the replica groups of the ranks at the same position in every
// group. Off (-1) or N = every rank (plain ZeRO): no communicators.
MicsComms make_mics_comms(const Config& cfg, Communicator& dp) {
  const std::int64_t n = cfg.zero_optimization.mics_shard_size;
  if (n == -1) return {};
  const std::string key = fmt::format("{}: zero_optimization.mics_shard_size = {}", cfg.source, n);
  ZERO_CHECK(n >= 1, key + " is not a group size; use the ranks per node (a divisor of the data-parallel ranks), "
                           "or -1 for off");
  ZERO_CHECK(cfg.zero_optimization.stage >= 1,
             key + " applies to stages 1-3 (it shards the model states inside groups; stage 0 shards nothing); "
                   "set it to -1, or use stage 1, 2 or 3");
  ZERO_CHECK(dp.size() % n == 0,
             fmt::format("{} does not divide the {} data-parallel ranks; use a divisor, normally the ranks per node",
                         key, dp.size()));
  ZERO_CHECK(cfg.zero_optimization.zero_hpz_partition_size == 1,
             fmt::format("{} and zero_hpz_partition_size = {} together: hpZ's secondary shards are not built "
                         "inside MiCS groups; use one of them (MiCS keeps every parameter gather inside its group)",
                         key, cfg.zero_optimization.zero_hpz_partition_size));
  if (n == dp.size()) return {};  // one group of every rank: plain ZeRO
  auto* mpi = dynamic_cast<MpiCommunicator*>(&dp);
  ZERO_CHECK(mpi != nullptr, key + ": needs the host (MPI) communicator");
  const int size = static_cast<int>(n), r = dp.rank();
  MicsComms m;
  m.shard = mpi->split(r / size, r % size);
  m.replica = mpi->split(r % size, r / size);
  return m;
}

EngineImpl::EngineImpl(Context& ctx, const Config& cfg, Layout layout, ProcessGroups* groups)
    : ctx_(ctx),
      cfg_(cfg),
      layout_(std::move(layout)),
      dp_comm_(groups ? groups->data() : ctx.comm()),
      mics_(make_mics_comms(cfg, dp_comm_)),
      backend_(make_engine_backend(ctx, cfg, groups, mics_.shard.get())),
      comm_(backend_->comm()),
      host_comm_(mics_.shard ? *mics_.shard : dp_comm_),
      model_comm_(groups && groups->model().size() > 1 ? &groups->model() : nullptr),
      tensor_rank_(groups ? groups->coord().tensor : 0),
      groups_(groups),
      hpz_comm_(make_hpz_comm(cfg, host_comm_)),
      hpz_device_(make_group_device_comm(*backend_, hpz_comm_.get())),
      replica_device_(make_group_device_comm(*backend_, mics_.replica.get())),
      qgz_(make_qgz(cfg, host_comm_, *backend_, model_comm_ != nullptr)),
      rank_(comm_.rank()),
      world_(comm_.size()),
      stage_(cfg.zero_optimization.stage),
      gas_(accumulation_steps(cfg)),
      dp_world_(dp_comm_.size()),
      dtype_(cfg.compute_dtype()),
      shapes_(plan_units()),
      // The data-parallel rank names the NVMe swap directories: MiCS groups repeat rank_.
      opt_(make_optimizer_store(*backend_, cfg_, dp_comm_.rank(), [this] {
        std::vector<std::int64_t> owned;
        for (const auto& s : shapes_) owned.push_back(s.own_len);
        return owned;
      }())),
      params_(*backend_, cfg_, shapes_, dp_comm_.rank(), dtype_),
      gatherer_(*backend_, comm_, params_, layout_, shapes_, cfg_.zero_optimization, dtype_,
                hpz_device_ ? hpz_device_.get() : hpz_comm_.get()),
      reducer_(*backend_, comm_, layout_, shapes_, cfg_.zero_optimization, dtype_, cfg_.grad_dtype(), stage_,
               cfg_.gradient_compression.type != CompressionType::none,
               replica_device_ ? replica_device_.get() : mics_.replica.get(), qgz_.get()),
      // PowerSGD's factors are host vectors: the host communicator, on every backend.
      powersgd_(make_powersgd(cfg_, host_comm_, layout_, shapes_, rank_, model_comm_ != nullptr)),
      scaler_(cfg.fp16) {
  if (dp_comm_.rank() == 0 && cfg_.zero_optimization.mics_shard_size != -1) report_mics_groups();
  if (stage_ == 3 && dp_comm_.rank() == 0) report_stage3_sharding();
  if (qgz_ && dp_comm_.rank() == 0) report_qgz();
}

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
  log_info("MiCS: mics_shard_size {}: stage {} model states sharded over {} groups of {} consecutive ranks ({}), "
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
  log_info("qgZ (zero_quantized_gradients): gradient reduce-scatter inside each node with int8 blocks of {}, then "
           "across {} nodes x {} ranks between ranks of the same local rank with int4 blocks of {}, error feedback "
           "{} per rank (fp32); this rank sends {} inside its node and {} across nodes per micro-step. Padding: the "
           "units' own ({} elements in all, so that each splits into {} equal slices), and each message rounded up "
           "to whole 4-byte words; no other size is changed, none falls back to the plain reduce-scatter",
           qgz_->block(), qgz_->nodes(), qgz_->ranks_per_node(), qgz_->block(), format_bytes(static_cast<std::uint64_t>(feedback)),
           format_bytes(static_cast<std::uint64_t>(per_step.intra_node)),
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
  log_info("stage 3, stage3_param_persistence_threshold {}: {} of {} units sharded: {}; {} persistent (whole on "
           "every rank, fewer elements than the threshold): {}",
           threshold, sharded.size(), layout_.num_units(), listed(sharded), persistent.size(), listed(persistent));
  if (sharded.empty())
    log_warning("stage 3 shards no unit's parameters: every unit has fewer elements than "
                "zero_optimization.stage3_param_persistence_threshold = {} (the largest, '{}', has {}), so each "
                "rank keeps all parameters as at stage 2; lower the threshold (0 shards every unit) to shard them",
                threshold, layout_.unit(largest).name, shape(largest).numel);
}

void EngineImpl::claim_nvme_space(offload::NvmeSwapper* swapper) {
  // Every rank takes part, with or without a swapper. Per rank: a key of the host and the
  // filesystem, bytes needed, bytes free, capacity known; 32-bit words for one all-gather.
  // Over every rank of the job (not only this engine's data-parallel group): under model
  // parallelism the other groups' ranks share the filesystems too, and build their engines now.
  Communicator& job = ctx_.comm();
  const int ranks_in_job = job.size(), me = job.rank();
  constexpr std::size_t kWords = 8;
  std::vector<std::uint32_t> send(kWords, 0), all(kWords * static_cast<std::size_t>(ranks_in_job), 0);
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "?");
  offload::NvmeSwapper::Space mine;
  if (swapper) {
    mine = swapper->space();
    // One filesystem: the same device on the same host.
    const std::uint64_t key = std::hash<std::string>{}(fmt::format("{}:{}", host, mine.filesystem)) | 1;
    const std::uint64_t v[3] = {key, mine.needed, mine.free};
    for (std::size_t k = 0; k < 3; ++k) {
      send[2 * k] = static_cast<std::uint32_t>(v[k]);
      send[2 * k + 1] = static_cast<std::uint32_t>(v[k] >> 32);
    }
    send[6] = mine.capacity_known ? 1 : 0;
  }
  // Raw words through a float all-gather: the communicator copies them, it does not compute.
  job.all_gather(send.data(), all.data(), send.size(), DType::f32);
  auto word64 = [&](std::size_t at) { return std::uint64_t{all[at]} | (std::uint64_t{all[at + 1]} << 32); };
  struct Fs {
    std::uint64_t needed = 0, free = UINT64_MAX;
    bool known = true;
    std::vector<int> ranks;
  };
  std::map<std::uint64_t, Fs> filesystems;
  for (int r = 0; r < ranks_in_job; ++r) {
    const std::size_t at = static_cast<std::size_t>(r) * kWords;
    const std::uint64_t key = word64(at);
    if (key == 0) continue;
    Fs& f = filesystems[key];
    f.needed += word64(at + 2);
    f.free = std::min(f.free, word64(at + 4));  // each rank measured before any rank claimed space
    f.known = f.known && all[at + 6] != 0;
    f.ranks.push_back(r);
  }
  // Every rank judges every filesystem from the same figures, so all refuse or none does: no
  // rank claims space (or is killed holding its swap files) while another gives up.
  for (const auto& [key, f] : filesystems) {
    const bool one = f.ranks.size() == 1;
    const bool member = std::find(f.ranks.begin(), f.ranks.end(), me) != f.ranks.end();
    const std::string ranks = one ? fmt::format("rank {}", f.ranks[0]) : fmt::format("ranks {}", fmt::join(f.ranks, ", "));
    if (!f.known) {
      if (f.ranks.front() == me)
        log_warning("the filesystem of {} reports no capacity (ramfs?): the NVMe swap of {} ({}) is not checked "
                    "against free space",
                    mine.dir, ranks, format_bytes(f.needed));
      continue;
    }
    ZERO_CHECK(f.needed <= f.free,
               fmt::format("not enough disk space for NVMe swap: {} {} on one filesystem (rank {}'s nvme_path{}) and "
                           "need {} there in all, but {} are free (measured before any rank claimed space). Free "
                           "space there, give ranks nvme_paths on different devices, or offload to cpu instead of "
                           "nvme",
                           ranks, one ? "keeps its swap files" : "keep their swap files", f.ranks.front(),
                           member ? "; this rank's swap directory: " + mine.dir : std::string(), format_bytes(f.needed),
                           format_bytes(f.free)));
  }
  if (swapper) swapper->preallocate();
  // The next claim (the other store's) measures after every rank's files hold their space.
  ctx_.comm().barrier();
}

std::vector<UnitShape> EngineImpl::plan_units() const {
  ZERO_CHECK(cfg_.resolved, "Engine: the config is not resolved; call Config::resolve(world_size) first");
  ZERO_CHECK(layout_.num_units() > 0, "Engine: the layout has no units; declare the model with Layout::add_unit");
  ZERO_CHECK(cfg_.train_batch_size == cfg_.train_micro_batch_size_per_gpu * gas_ * dp_world_,
             fmt::format("Engine: the config was resolved for another world size (train_batch_size {} != micro {} x "
                         "accumulation {} x world {})",
                         cfg_.train_batch_size, cfg_.train_micro_batch_size_per_gpu, gas_, dp_world_));
  report_inert_settings();
  return make_unit_shapes(layout_, rank_, world_, stage_, cfg_.zero_optimization.stage3_param_persistence_threshold);
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
    notes.push_back("zero_optimization.contiguous_gradients: false has no effect: each unit's gradient is always one "
                    "contiguous buffer");
  if (z.offload_optimizer.buffer_count != dz.offload_optimizer.buffer_count)
    notes.push_back("zero_optimization.offload_optimizer.buffer_count has no effect: NVMe offload streams sub-groups "
                    "through three buffers (read next, step current, write previous)");
  if (cfg_.aio.intra_op_parallelism != da.intra_op_parallelism || cfg_.aio.single_submit != da.single_submit ||
      cfg_.aio.overlap_events != da.overlap_events)
    notes.push_back("aio.intra_op_parallelism / single_submit / overlap_events have no effect: one io_uring ring per "
                    "rank submits in batches and overlaps completions; block_size and queue_depth are honoured");
  if (z.offload_param.device != OffloadDevice::none && (z.offload_param.buffer_count != dz.offload_param.buffer_count ||
                                                       z.offload_param.buffer_size != dz.offload_param.buffer_size ||
                                                       z.offload_param.max_in_cpu != dz.offload_param.max_in_cpu))
    notes.push_back("zero_optimization.offload_param.buffer_count / buffer_size / max_in_cpu have no effect: a unit's "
                    "slice is read from NVMe when its gather starts and released when the gather completes");
  if (z.offload_param.device == OffloadDevice::cpu)
    notes.push_back("zero_optimization.offload_param.device: cpu: on the host backend parameters already live in host "
                    "memory");
  if (dp_comm_.rank() == 0)
    for (const auto& n : notes) log_info("{}", n);
}

void EngineImpl::init_params(const std::function<void(const ParamInfo&, std::span<float>)>& init) {
  std::vector<float> full;
  std::vector<char> staged;
  for (int i = 0; i < layout_.num_units(); ++i) {
    const UnitShape& u = shape(i);
    full.assign(static_cast<std::size_t>(u.padded), 0.0f);
    for (const auto& p : layout_.unit(i).params)
      init(p, std::span<float>(full.data() + p.offset, static_cast<std::size_t>(p.numel)));
    // Every rank must start from the same values; a rank-dependent initialiser would train
    // silently different models. One scalar all-reduce per unit checks it.
    const CommSiteScope site("init_params", &layout_.unit(i).name);
    double sum = 0.0;
    for (std::size_t k = 0; k < full.size(); ++k) sum += static_cast<double>(full[k]) * static_cast<double>((k % 7) + 1);
    double lo = -all_ranks().all_reduce_scalar(-sum, ReduceOp::max);
    double hi = all_ranks().all_reduce_scalar(sum, ReduceOp::max);
    ZERO_CHECK(lo == hi, "init_params: unit '" + layout_.unit(i).name +
                             "' got different initial values on different ranks; seed the initialiser "
                             "identically on every rank");
    opt_->write_master(i, full.data() + u.own_begin);
    // Round on the host, then copy to wherever the backend keeps parameters.
    std::size_t n = static_cast<std::size_t>(u.sharded_params ? u.slice : u.padded);
    staged.resize(n * esize());
    convert(full.data() + (u.sharded_params ? u.own_begin : 0), DType::f32, staged.data(), dtype_, n);
    params_.checkout(i, false);
    backend_->from_host(u.sharded_params ? params_.shard(i) : params_.full(i), staged.data(), staged.size());
    params_.checkin(i, true);
  }
  initialized_ = true;
}

MemoryReport EngineImpl::memory() const {
  MemoryReport r;
  params_.report(r);
  reducer_.report(r);
  // PowerSGD's error buffers, Q and factor staging: buffers of the gradients' communication.
  if (powersgd_) r.comm_buffers += static_cast<std::int64_t>(powersgd_->buffer_bytes());
  opt_->report(r);
  r.gathered = gatherer_.peak_bytes();
  r.secondary = gatherer_.secondary_bytes();
  return r;
}

std::vector<float> EngineImpl::full_master(int unit) {
  check_unit(unit, "full_master");
  const CommSiteScope site("full_master", &layout_.unit(unit).name);
  const UnitShape& u = shape(unit);
  std::vector<float> full(static_cast<std::size_t>(u.padded));
  opt_->read_master(unit, full.data() + u.own_begin);
  // `full` is host memory: gather it over the host (MPI) communicator, whatever the backend's
  // communicator is (NCCL takes device buffers only).
  if (stage_ > 0)
    host_comm_.all_gather(full.data() + u.own_begin, full.data(), static_cast<std::size_t>(u.slice), DType::f32);
  full.resize(static_cast<std::size_t>(u.numel));
  return full;
}

std::vector<float> EngineImpl::full_params(int unit) {
  check_unit(unit, "full_params");
  const CommSiteScope site("full_params", &layout_.unit(unit).name);
  const UnitShape& u = shape(unit);
  std::vector<float> full(static_cast<std::size_t>(u.padded));
  std::vector<char> host(static_cast<std::size_t>(u.padded) * esize());
  if (u.sharded_params) {
    Buffer gathered = backend_->alloc(host.size());
    params_.checkout(unit, true);
    comm_.all_gather(params_.shard(unit), gathered.get(), static_cast<std::size_t>(u.slice), dtype_);
    params_.checkin(unit, false);
    backend_->to_host(host.data(), gathered.get(), host.size());
  } else {
    backend_->to_host(host.data(), params_.full(unit), host.size());
  }
  convert(host.data(), dtype_, full.data(), DType::f32, full.size());
  full.resize(static_cast<std::size_t>(u.numel));
  return full;
}

// ---------------------------------------------------------------- views

float* TensorRef::f32() const {
  ZERO_CHECK(dtype == DType::f32, "TensorRef::f32: the tensor " + (info ? "'" + info->name + "' " : std::string()) +
                                      "holds " + std::string(dtype_name(dtype)) + ", not fp32");
  return static_cast<float*>(data);
}

static TensorRef make_ref(const UnitInfo& ui, void* base, DType t, int param) {
  ZERO_CHECK(param >= 0 && param < static_cast<int>(ui.params.size()),
             fmt::format("unit '{}' has no parameter #{} (it has {})", ui.name, param, ui.params.size()));
  const ParamInfo& p = ui.params[static_cast<std::size_t>(param)];
  return TensorRef{static_cast<char*>(base) + static_cast<std::size_t>(p.offset) * dtype_size(t), t, p.numel, &p};
}

static int param_index(const UnitInfo& ui, std::string_view name) {
  int i = ui.find_param(name);
  if (i < 0) {
    std::string names;
    for (const auto& p : ui.params) names += (names.empty() ? "" : ", ") + p.name;
    ZERO_THROW("unit '" + ui.name + "' has no parameter '" + std::string(name) + "' (it has: " + names + ")");
  }
  return i;
}

UnitParams::UnitParams(UnitParams&& o) noexcept { *this = std::move(o); }
UnitParams& UnitParams::operator=(UnitParams&& o) noexcept {
  if (this != &o) {
    release();
    engine_ = o.engine_;
    unit_ = o.unit_;
    data_ = o.data_;
    token_ = o.token_;
    o.engine_ = nullptr;
    o.data_ = nullptr;
    o.unit_ = -1;
  }
  return *this;
}
UnitParams::~UnitParams() { release(); }
void UnitParams::release() {
  if (engine_) {
    EngineImpl* e = engine_;
    engine_ = nullptr;
    e->release(unit_, token_);
  }
  data_ = nullptr;
}
TensorRef UnitParams::operator[](int param) const {
  ZERO_CHECK(engine_ != nullptr, "UnitParams: the handle is empty (released or moved from)");
  return make_ref(engine_->layout().unit(unit_), data_, engine_->dtype(), param);
}
TensorRef UnitParams::operator[](std::string_view name) const {
  ZERO_CHECK(engine_ != nullptr, "UnitParams: the handle is empty (released or moved from)");
  const UnitInfo& ui = engine_->layout().unit(unit_);
  return make_ref(ui, data_, engine_->dtype(), param_index(ui, name));
}
TensorRef UnitGrads::operator[](int param) const { return make_ref(*unit_, data_, dtype_, param); }
TensorRef UnitGrads::operator[](std::string_view name) const {
  return make_ref(*unit_, data_, dtype_, param_index(*unit_, name));
}

std::string MemoryReport::to_string() const {
  // Two decimals: scripts compare the stages' model state against the ZeRO formula to 1%.
  auto b = [](std::int64_t n) { return format_bytes(static_cast<std::uint64_t>(n), 2); };
  const std::string qgz = qgz_buffers ? fmt::format(" (qgZ {})", b(qgz_buffers)) : "";
  std::string s = fmt::format("model state {} (params {}, grads {}, master {}, optimizer {}); buffers: comm {}{}, gathered {}",
                              b(model_state()), b(params), b(grads), b(master), b(optimizer), b(comm_buffers), qgz,
                              b(gathered));
  if (secondary) s += fmt::format(", hpZ secondary {}", b(secondary));
  if (error_feedback) s += fmt::format(", qgZ error feedback {}", b(error_feedback));
  if (offloaded_host) s += fmt::format("; offloaded to host {}", b(offloaded_host));
  if (offloaded_nvme) s += fmt::format("; on nvme {}", b(offloaded_nvme));
  return s;
}

// ---------------------------------------------------------------- Engine

Engine::Engine(Context& ctx, const Config& cfg, Layout layout)
    : impl_(std::make_unique<EngineImpl>(ctx, cfg, std::move(layout), nullptr)) {}
Engine::Engine(Context& ctx, const Config& cfg, Layout layout, ProcessGroups& groups)
    : impl_(std::make_unique<EngineImpl>(ctx, cfg, std::move(layout), &groups)) {}
Engine::~Engine() = default;
Engine::Engine(Engine&&) noexcept = default;
Engine& Engine::operator=(Engine&&) noexcept = default;

void Engine::init_params(const std::function<void(const ParamInfo&, std::span<float>)>& init) {
  impl_->init_params(init);
}
UnitParams Engine::gather(int unit) { return impl_->gather(unit); }
GatheredModel Engine::gather_all() { return impl_->gather_all(); }
TrafficBytes Engine::traffic() const { return impl_->traffic(); }

TrafficBytes EngineImpl::traffic() const {
  TrafficBytes t = dp_comm_.traffic();  // device communicators' collectives count there too
  if (mics_.shard) {
    t += mics_.shard->traffic();
    t += mics_.replica->traffic();
  }
  if (hpz_comm_) t += hpz_comm_->traffic();
  if (qgz_) t += qgz_->traffic();
  if (model_comm_) t += model_comm_->traffic();
  return t;
}

GatheredModel& GatheredModel::operator=(GatheredModel&& o) noexcept {
  if (this != &o) {
    release();
    engine_ = o.engine_;
    was_eval_ = o.was_eval_;
    o.engine_ = nullptr;
  }
  return *this;
}

void GatheredModel::release() {
  if (EngineImpl* e = std::exchange(engine_, nullptr)) e->release_all(was_eval_);
}
UnitGrads Engine::grads(int unit) { return impl_->grads(unit); }
void Engine::reduce(int unit) { impl_->reduce(unit); }
StepResult Engine::step() { return impl_->step({}); }
StepResult Engine::step(const StepOptions& opts) { return impl_->step(opts); }
GradNorm Engine::grad_norm() { return impl_->grad_norm(); }
void Engine::set_lr(double lr) { impl_->set_lr(lr); }
double Engine::lr() const { return impl_->next_lr(); }
Backend& engine_backend(Engine& e) { return e.impl_->backend(); }

void Engine::set_stream(void* stream) { impl_->backend().set_compute_stream(stream); }
void* Engine::stream() const { return impl_->backend().compute_stream(); }
void Engine::set_eval(bool on) { impl_->set_eval(on); }
bool Engine::eval() const { return impl_->eval(); }
float Engine::loss_scale() const { return impl_->loss_scale(); }
const Layout& Engine::layout() const { return impl_->layout(); }
const Config& Engine::config() const { return impl_->config(); }
int Engine::micro_step() const { return impl_->micro_step(); }
std::int64_t Engine::global_step() const { return impl_->global_step(); }
MemoryReport Engine::memory() const { return impl_->memory(); }
std::vector<float> Engine::full_master(int unit) { return impl_->full_master(unit); }
std::vector<float> Engine::full_params(int unit) { return impl_->full_params(unit); }

}  // namespace zero
