// EngineImpl's construction: the communicators and roles the config asks for (MiCS's groups,
// hpZ's, qgZ, PowerSGD), each checked against the config where it is made, built in member order,
// and the NVMe swap space claimed before anything large is allocated.
#include <fmt/format.h>
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
#include "runtime/log.hpp"
#include "zero/error.hpp"
#include "zero/groups.hpp"

namespace zero {

namespace {

// The engine counts micro-steps in an int; a Config built by hand could hold more.
int accumulation_steps(const Config& cfg) {
  ZERO_CHECK(cfg.gradient_accumulation_steps >= 1 && cfg.gradient_accumulation_steps <= INT32_MAX,
             fmt::format("Engine: gradient_accumulation_steps {} does not fit the engine's int counter; use the "
                         "Config that load_config and resolve() give",
                         cfg.gradient_accumulation_steps));
  return static_cast<int>(cfg.gradient_accumulation_steps);
}

// The backend over the partition group: all ranks, groups->data(), or MiCS's shard group. A
// CUDA backend bootstraps its device communicator over that group's host communicator.
std::unique_ptr<Backend> make_engine_backend(Context& ctx, const Config& cfg, ProcessGroups* groups,
                                             Communicator* mics_shard) {
  if (mics_shard != nullptr) return make_backend(ctx, cfg, *mics_shard);
  return make_backend(ctx, cfg, groups ? groups->data() : ctx.comm());
}

// A communicator for backend memory over a host sub-group (MiCS's replica group, which reaches
// outside the backend's ranks): the backend's own kind over its ranks, or the host group itself
// (null) on the host backend. `split`: a group of a partition of the backend's ranks (hpZ's),
// split from the backend's communicator.
std::unique_ptr<Communicator> make_group_device_comm(Backend& backend, Communicator* group, bool split = false) {
  if (group == nullptr) return nullptr;
  return split ? backend.split_comm(*group) : backend.group_comm(*group);
}

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
  ZERO_CHECK(z.reduce_scatter, key +
                                   " quantizes the gradient reduce-scatter, and zero_optimization.reduce_scatter: "
                                   "false asks for an all-reduce instead; set reduce_scatter to true, or "
                                   "zero_quantized_gradients to false");
  // MiCS reduces inside its groups and then all-reduces across them; qgZ's two phases would have
  // to be rebuilt around that, so the combination is refused rather than half supported.
  ZERO_CHECK(z.mics_shard_size == -1,
             fmt::format("{} with zero_optimization.mics_shard_size = {} is not supported; use one of them", key,
                         z.mics_shard_size));
  // Its per-rank error-feedback files are named by data-parallel rank, which every grid position shares.
  ZERO_CHECK(!model_parallel, key +
                                  " runs without tensor or pipeline parallelism so far; use tensor and pipeline "
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
  ZERO_CHECK(!model_parallel, cfg.source +
                                  ": gradient_compression.type = powersgd runs without tensor or pipeline "
                                  "parallelism so far; use tensor and pipeline sizes of 1, or type: none");
  ZERO_CHECK(cfg.zero_optimization.mics_shard_size == -1,
             cfg.source +
                 ": gradient_compression.type = powersgd with zero_optimization.mics_shard_size is not "
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
  ZERO_CHECK(n >= 1, key +
                         " is not a group size; use the ranks per node (a divisor of the data-parallel ranks), "
                         "or -1 for off");
  ZERO_CHECK(cfg.zero_optimization.stage >= 1,
             key +
                 " applies to stages 1-3 (it shards the model states inside groups; stage 0 shards nothing); "
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

}  // namespace

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
      hpz_device_(make_group_device_comm(*backend_, hpz_comm_.get(), true)),
      replica_device_(make_group_device_comm(*backend_, mics_.replica.get())),
      qgz_(make_qgz(cfg, host_comm_, *backend_, model_comm_ != nullptr)),
      rank_(comm_.rank()),
      world_(comm_.size()),
      stage_(cfg.zero_optimization.stage),
      gas_(accumulation_steps(cfg)),
      dp_world_(dp_comm_.size()),
      dtype_(cfg.compute_dtype()),
      shapes_(plan_units()),
      optim_(make_engine_optimizer()),
      // The data-parallel rank names the NVMe swap directories: MiCS groups repeat rank_.
      opt_(make_optimizer_store(*backend_, cfg_, dp_comm_.rank(), optim_->moments(),
                                [this] {
                                  std::vector<std::int64_t> owned;
                                  for (const auto& s : shapes_) owned.push_back(s.own_len);
                                  return owned;
                                }())),
      params_(*backend_, cfg_, shapes_, dp_comm_.rank(), dtype_),
      gatherer_(
          *backend_, comm_, params_, layout_, shapes_,
          {.zero = cfg_.zero_optimization, .dtype = dtype_, .hpz = hpz_device_ ? hpz_device_.get() : hpz_comm_.get()}),
      reducer_(*backend_, comm_, layout_, shapes_,
               {.zero = cfg_.zero_optimization,
                .dtype = dtype_,
                .grad_dtype = cfg_.grad_dtype(),
                .comm_dtype = cfg_.comm_dtype(),
                // An optimizer that exchanges the local gradients itself keeps them whole at
                // stage 2 too, as stage 1 does (OneBitAdam, OneBitLamb: docs/optimizers.md).
                .stage = compressed_momentum(cfg_.optimizer.type) ? std::min(stage_, 1) : stage_,
                .deferred = cfg_.gradient_compression.type != CompressionType::none || optim_->local_gradients(1),
                .replica = replica_device_ ? replica_device_.get() : mics_.replica.get(),
                .qgz = qgz_.get()}),
      // PowerSGD's factors are host vectors: the host communicator, on every backend.
      powersgd_(make_powersgd(cfg_, host_comm_, layout_, shapes_, rank_, model_comm_ != nullptr)),
      scaler_(cfg.fp16) {
  if (dp_comm_.rank() == 0 && cfg_.zero_optimization.mics_shard_size != -1) report_mics_groups();
  if (stage_ == 3 && dp_comm_.rank() == 0) report_stage3_sharding();
  if (qgz_ && dp_comm_.rank() == 0) report_qgz();
}

// The optimizer over this engine's partition, refused where it cannot run as configured.
std::unique_ptr<Optimizer> EngineImpl::make_engine_optimizer() {
  OptimizerEnv env;
  env.layout = &layout_;
  for (const UnitShape& s : shapes_) env.slice.push_back(s.slice);
  env.rank = rank_;
  env.world = world_;
  env.stage = stage_;
  env.comm = world_ > 1 ? &host_comm_ : nullptr;
  // Statistics of tensors split by tensor parallelism are summed over the tensor group too.
  env.tensor = groups_ != nullptr && groups_->tensor_size() > 1 ? &groups_->tensor() : nullptr;
  std::unique_ptr<Optimizer> o = make_optimizer(cfg_.optimizer, env);
  const std::string why = o->unsupported(layout_);
  ZERO_CHECK(why.empty(), why);
  // Exchanging the local gradients replaces the data-parallel reduction only.
  if (o->local_gradients(INT64_MAX))
    ZERO_CHECK(model_comm_ == nullptr, fmt::format("optimizer.type {} exchanges the data-parallel gradients itself and "
                                                   "runs without tensor or pipeline parallelism",
                                                   o->name()));
  // State in device memory needs device kernels; offloaded state is stepped on the host, where
  // a device backend stages the gradients once for every pass (engine/step.cpp).
  const bool offloaded = cfg_.zero_optimization.offload_optimizer.device != OffloadDevice::none;
  // Offload is the other way out, except for optimizers exchanging their own gradients
  // (OneBitAdam, OneBitLamb): their exchange reads the gradients and keeps its buffers where the
  // backend's memory is, and the offloaded runs read its momentum from the host, so the two meet
  // only where the backend's memory is the host's (the configuration refuses backend: cuda).
  const bool can_offload = !o->local_gradients(INT64_MAX);
  if (offloaded && !can_offload)
    ZERO_CHECK(backend_->host_accessible(),
               fmt::format("optimizer.type {} with offload_optimizer runs on the host backend only (its exchange "
                           "works in {} memory, the offloaded state on the host): use backend: host, or remove "
                           "offload_optimizer",
                           o->name(), backend_->name()));
  if (!backend_->host_accessible() && !offloaded)
    ZERO_CHECK(o->device_kernels(),
               fmt::format("optimizer.type {} has no {} backend kernels yet: use the host backend{}", o->name(),
                           backend_->name(), can_offload ? ", or offload_optimizer.device: cpu or nvme" : ""));
  return o;
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
    const std::string ranks =
        one ? fmt::format("rank {}", f.ranks[0]) : fmt::format("ranks {}", fmt::join(f.ranks, ", "));
    if (!f.known) {
      if (f.ranks.front() == me)
        log_warning(
            "the filesystem of {} reports no capacity (ramfs?): the NVMe swap of {} ({}) is not checked "
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

}  // namespace zero
