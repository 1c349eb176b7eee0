// EngineState: the engine's state as tools outside the training loop see it (checkpoints,
// diagnostics): each unit's owned range and the counters, without reaching into the engine.
// Partition, restore protocol and MiCS: docs/architecture.md, note engine-state.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "zero/comm.hpp"
#include "zero/config.hpp"
#include "zero/dtype.hpp"
#include "zero/engine.hpp"
#include "zero/layout.hpp"
#include "zero/loss_scaler.hpp"

namespace zero {

class ProcessGroups;

// Where a rank's optimizer state lies in a unit: [begin, begin + len) of the padded unit.
struct OwnedRange {
  std::int64_t begin = 0, len = 0;
};

// The counters a checkpoint carries.
struct TrainingState {
  std::int64_t step = 0;     // step() calls, skipped ones included
  std::int64_t applied = 0;  // updates applied (Adam's t, the scheduler's step)
  LossScaler::State scaler{1.0, 0, 0, -1};
  std::optional<double> lr;  // the rate the loop set (Engine::set_lr), if it set one
};

class EngineState {
 public:
  explicit EngineState(Engine& engine);

  int rank() const;        // in the partition group: the slice this rank owns
  int world_size() const;  // ranks the partition spans (the data-parallel group, or MiCS's N)
  // This rank's group writes the checkpoint's shards (the first MiCS group; always without MiCS).
  bool writes_shards() const;
  int stage() const;
  DType compute_dtype() const;
  const Layout& layout() const;
  const Config& config() const;
  // MPI over host memory across every data-parallel rank (every MiCS group), whatever
  // communicator the backend moves device buffers with.
  Communicator& host_comm() const;
  // The engine holds one part of a model split over ranks (tensor or pipeline parallelism).
  bool model_parallel() const;
  // The process groups the engine was built on, or null (rank() and world_size() are then the
  // world's; with groups they are the data-parallel group's).
  ProcessGroups* groups() const;
  // Every rank of the job (the Context's communicator, host memory), whatever the grid.
  Communicator& world_comm() const;
  bool initialized() const;  // init_params or a restore has completed

  std::int64_t slice(int unit) const;  // elements per rank slice of the padded unit
  OwnedRange owned_range(int unit) const;
  int optimizer_moments() const;  // fp32 tensors besides the master (Adam 2, SGD 1)
  bool loss_scale_dynamic() const;
  TrainingState training_state() const;
  // All-gathers of stage-3 units started so far, prefetches included.
  std::int64_t unit_all_gathers() const;

  // Throws unless the engine is between steps: no partial accumulation, no held UnitParams.
  // `what` names the caller in the message.
  void check_between_steps(const char* what) const;
  // The owned range of one tensor of `unit`: which 0 is the master, 1.. the moments.
  void read_owned(int unit, int which, float* owned) const;
  void write_owned(int unit, int which, const float* owned);
  // State of this rank's own that no other rank holds, saved one file per rank beside the
  // shards (the checkpoint metadata's `rank_state`): PowerSGD's (gradient_compression: every
  // matrix's Q, then its error buffer, engine/powersgd.hpp), qgZ's error-feedback buffers
  // (zero_quantized_gradients: every unit's intra-node then inter-node errors) or the 1-bit
  // exchange's (OneBitAdam, OneBitLamb: errors and shared momentum, optim/onebit_exchange.hpp).
  // At most one kind per engine (PowerSGD runs at stages 0-1, qgZ at 2-3, and the 1-bit
  // optimizers with neither). rank_state_kind(): "powersgd", "qgz", "onebit", or "" (none;
  // rank_state() is then empty). rank_state_layout(): what the state belongs to besides the
  // world size, which a resume must match ("" for PowerSGD, whose sizes say it; qgZ: "2 nodes x
  // 2 ranks, block 256", a rank's place among the nodes; 1-bit: the optimizer's name).
  // set_rank_state({}) puts back the start's state (zero errors, PowerSGD's seeded Q).
  // rank_state_size(): rank_state().size() without copying the state (device memory with qgZ).
  std::string rank_state_kind() const;
  std::string rank_state_layout() const;
  std::vector<float> rank_state() const;
  std::size_t rank_state_size() const;
  void set_rank_state(const std::vector<float>& s);
  // The optimizer's per-tensor values, the same on every rank and partition (OneBitLamb's trust
  // ratios: Optimizer::tensor_records), saved once in the metadata; empty when it keeps none.
  // set_tensor_records({}): the checkpoint holds none for it.
  std::map<std::string, std::vector<double>> tensor_records() const;
  void set_tensor_records(const std::map<std::string, std::vector<double>>& r);
  void begin_restore();
  // Collective: recomputes the parameters from the master and sets the counters (and the loss
  // scaler's state when restore_scaler). The loop's rate is restored where the config lets the
  // loop set one (no scheduler, or ManualLR); under a DeepSpeed schedule it is left out.
  void finish_restore(const TrainingState& s, bool restore_scaler);

 private:
  EngineImpl* impl_;
};

}  // namespace zero
