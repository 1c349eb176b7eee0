// EngineImpl: the schedule behind zero::Engine, over three roles that own the state.
//
// As FSDP2 separates shard state, schedule and collectives, the engine is split by role:
//   ParamStore     (engine/param_store.hpp)     the compute-dtype parameters: full copies or the
//                                               rank's slice, on NVMe with offload_param;
//   ParamGatherer  (engine/gather.hpp)          stage 3: the recorded gather order, prefetch, live set;
//   GradReducer    (engine/reduce.hpp)          gradient storage, buckets, reduce-scatters in flight;
//   OptimizerStore (engine/optimizer_store.hpp) the owned ranges' fp32 master and moments, offload;
//   PowerSgd       (engine/powersgd.hpp)        with gradient_compression, the stage-0/1 reduction.
// EngineImpl keeps what ties them together: the micro-step and step counters, eval mode, the
// loss scaler, and the checks that turn misuse into errors. Files: engine/engine_setup.cpp
// (construction), engine/startup_report.cpp (what rank 0 says at start), engine/engine.cpp
// (zero::Engine's calls, init, whole-model reads, reports), engine/handles.cpp (the loop's
// views), engine/loop.cpp (gather, grads, reduce), engine/step.cpp (the optimizer step),
// engine/state.cpp (checkpoint support: zero::EngineState).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "backend/backend.hpp"
#include "engine/gather.hpp"
#include "engine/optimizer_store.hpp"
#include "engine/param_store.hpp"
#include "engine/powersgd.hpp"
#include "engine/reduce.hpp"
#include "engine/unit_shape.hpp"
#include "optim/optimizer.hpp"
#include "zero/config.hpp"
#include "zero/context.hpp"
#include "zero/engine.hpp"
#include "zero/engine_state.hpp"
#include "zero/loss_scaler.hpp"
#include "zero/optim.hpp"

namespace zero {

// The backend an engine runs on (the backends' tests compare it with what the engine reports).
Backend& engine_backend(Engine& e);

// MiCS's two communicators (engine/engine_setup.cpp, make_mics_comms).
struct MicsComms {
  std::unique_ptr<Communicator> shard, replica;
};

class EngineImpl {
 public:
  EngineImpl(Context& ctx, const Config& cfg, Layout layout, ProcessGroups* groups);
  // The roles hold references to the shapes, the store and the backend: the engine stays put.
  EngineImpl(const EngineImpl&) = delete;
  EngineImpl& operator=(const EngineImpl&) = delete;

  // ---- what zero::Engine forwards (engine/engine.cpp, engine/loop.cpp, engine/step.cpp) ----
  void init_params(const std::function<void(const ParamInfo&, std::span<float>)>& init);
  UnitParams gather(int unit);
  GatheredModel gather_all();
  TrafficBytes traffic() const;
  void release_all(bool was_eval);              // GatheredModel's destructor
  void release(int unit, std::uint64_t token);  // UnitParams' destructor
  UnitGrads grads(int unit);
  void reduce(int unit);
  StepResult step(const StepOptions& opts);
  GradNorm grad_norm();
  void set_lr(double lr);
  double next_lr() const;
  // The config lets the loop set the rate: no scheduler, or ManualLR.
  bool loop_sets_lr() const;
  void set_eval(bool on);
  bool eval() const { return eval_mode_; }
  MemoryReport memory() const;
  std::vector<float> full_master(int unit);
  std::vector<float> full_params(int unit);
  Backend& backend() { return *backend_; }
  const Backend& backend() const { return *backend_; }
  const Layout& layout() const { return layout_; }
  const Config& config() const { return cfg_; }
  DType dtype() const { return dtype_; }
  float loss_scale() const { return static_cast<float>(scaler_.scale()); }
  int micro_step() const { return micro_; }
  std::int64_t global_step() const { return step_; }

  const UnitShape& shape(int unit) const { return unit_at(shapes_, unit); }

 private:
  friend class EngineState;  // checkpoint support (engine/state.cpp) reads and restores the state

  // Called while the members are built: checks the config against the world and the layout,
  // reports inert settings, then partitions the units (before anything large is allocated).
  std::vector<UnitShape> plan_units() const;
  void check_unit(int unit, const char* what) const;
  void report_inert_settings() const;
  void report_stage3_sharding() const;
  void report_qgz() const;
  void report_mics_groups() const;
  // Collectives that every rank of the data-parallel group must agree on (the init check, the
  // step's decisions): the partition group's communicator, or with MiCS the whole group.
  Communicator& all_ranks() { return mics_.shard ? dp_comm_ : comm_; }
  // Collective: checks the NVMe swap space of every filesystem against all the ranks that share
  // it, then each rank claims its own; a refusal leaves nothing claimed on any rank.
  void claim_nvme_space(offload::NvmeSwapper* swapper);
  std::size_t esize() const { return dtype_size(dtype_); }
  bool stage3_training() const { return stage_ == 3 && !eval_mode_; }

  // The step (engine/step.cpp), in the order step() calls them.
  void check_step_ready(const char* what) const;  // what: "step()", "grad_norm()"
  // Refuses a training call in eval mode, naming a live GatheredModel when that is the cause.
  void check_training(const char* what) const;
  double grad_denominator() const;
  GradNorm pre_step_norm(const char* what);
  void reduce_powersgd();  // powersgd_'s reduction of the full gradients
  double global_grad_sumsq();
  double clip_coefficient(double norm) const;
  void check_ranks_agree(double lr, const StepOptions& opts);
  std::unique_ptr<Optimizer> make_engine_optimizer();
  // The next update's gradients stay on their rank (Optimizer::local_gradients), and the reducer
  // defers accordingly; called between steps.
  bool local_gradients() const;
  void follow_optimizer();
  double local_grad_sumsq();
  // The gradient audit (debug.audit_interval; engine/audit.cpp): the local gradients of an
  // audited step kept at reduce(), then compared with the reduction at the step.
  bool audit_step() const { return cfg_.audit_interval > 0 && (step_ + 1) % cfg_.audit_interval == 0; }
  void audit_add(int unit);
  void audit_check();
  void update_owned_slices(const StepHyper& h);
  void update_range(int pass, int unit, std::int64_t begin, std::int64_t len, float* master, float* const* state,
                    OffloadStaging* async_staging);
  void all_gather_updated();
  void refresh_params_from_master();  // collective: compute params = round(master)

  Context& ctx_;
  const Config cfg_;
  const Layout layout_;
  // Every rank of the data-parallel group (host memory, MPI): checkpoints, agreement checks.
  Communicator& dp_comm_;
  // MiCS (mics_shard_size N): the engine partitions over `shard`, its N consecutive ranks;
  // `replica` joins the ranks at the same position in every group. Both null when off.
  MicsComms mics_;
  std::unique_ptr<Backend> backend_;  // host or cuda, as cfg.backend says (backend/factory.cpp)
  // The partition group: every rank of dp_comm_, or with MiCS its shard group.
  Communicator& comm_;
  // Host-memory collectives over the partition group (the backend's comm_ may be NCCL).
  Communicator& host_comm_;
  // The other ranks holding parts of this model replica (tensor x pipeline), or null.
  Communicator* model_comm_;
  const int tensor_rank_;        // replicated parameters count in the norm on tensor rank 0 only
  ProcessGroups* const groups_;  // the grid the engine was built on, or null (checkpoints read it)
  // hpZ's group of zero_hpz_partition_size consecutive ranks, or null (engine/gather.hpp).
  std::unique_ptr<Communicator> hpz_comm_;
  // The device communicators over hpZ's group and MiCS's replica group on a device backend
  // (Backend::group_comm); null on the host backend, where the host groups move backend memory.
  // Their traffic and collective checks stay with the host groups above.
  std::unique_ptr<Communicator> hpz_device_, replica_device_;
  // qgZ's hierarchical quantized gradient reduce-scatter, or null (engine/quantized_reduce_scatter.hpp).
  std::unique_ptr<QuantizedReduceScatter> qgz_;
  // rank_ and world_ are the partition group's: the rank owns slice rank_ of world_ slices.
  const int rank_, world_, stage_, gas_;
  const int dp_world_;  // the data-parallel ranks the gradient sums over (world_ x MiCS replicas)
  const DType dtype_;
  const std::vector<UnitShape> shapes_;
  // The optimizer optimizer.type names (optim/optimizer.hpp), over this partition, and each unit's
  // first parameter in its numbering of tensors.
  std::unique_ptr<Optimizer> optim_;
  const std::vector<int> tensor_first_ = tensor_offsets(layout_);
  // The optimizer store first: with NVMe offload it checks the free disk space, and a run that
  // cannot fit must fail before anything large is allocated.
  std::unique_ptr<OptimizerStore> opt_;
  // Each store's swap space is claimed right after the store, before later members take host
  // memory: a too-small nvme_path is reported as such, not as an allocation failure further on.
  bool opt_space_ = (claim_nvme_space(opt_->swapper()), true);
  ParamStore params_;
  bool param_space_ = (claim_nvme_space(params_.swapper()), true);
  ParamGatherer gatherer_;
  GradReducer reducer_;
  // gradient_compression: powersgd, or null: reduces the stage-0/1 gradients at step().
  std::unique_ptr<PowerSgd> powersgd_;
  LossScaler scaler_;
  std::vector<char> staging_buf_;  // host staging of offloaded sub-groups (non-host backends)

  bool initialized_ = false;
  bool eval_mode_ = false;
  bool holding_model_ = false;             // a GatheredModel (gather_all) is alive, at any stage
  int micro_ = 0;                          // completed micro-steps since the last step()
  std::int64_t step_ = 0;                  // step() calls
  std::int64_t applied_ = 0;               // non-skipped updates (Adam's t, the scheduler's step)
  std::optional<double> loop_lr_;          // the rate the loop set (set_lr), for this and later steps
  std::optional<double> sumsq_;            // this step's global squared gradient norm, once computed
  std::vector<std::vector<float>> audit_;  // per unit: this rank's local gradient (audited steps)
};

}  // namespace zero
