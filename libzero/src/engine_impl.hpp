// EngineImpl: the state behind zero::Engine, split by concern over
//   engine.cpp (storage, init, reports), gather.cpp (stage-3 gather, prefetch, order check),
//   reduce.cpp (gradient buckets), step.cpp (norm, clipping, loss scale, optimizer, re-gather).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend.hpp"
#include "zero/comm.hpp"
#include "zero/config.hpp"
#include "zero/context.hpp"
#include "zero/engine.hpp"
#include "zero/loss_scaler.hpp"
#include "zero/offload/nvme_swapper.hpp"
#include "zero/offload/pinned_pool.hpp"

namespace zero {

class OptimizerStore;

class EngineImpl {
 public:
  EngineImpl(Context& ctx, const Config& cfg, Layout layout);
  ~EngineImpl();

  // ---- per-unit storage (see engine.hpp for what each stage keeps) ----
  struct Unit {
    std::int64_t numel = 0;   // real elements
    std::int64_t slice = 0;   // elements per rank slice
    std::int64_t padded = 0;  // slice * world
    bool sharded_params = false;  // stage 3 and above the persistence threshold
    Buffer full_params;           // compute dtype, padded (unless sharded_params)
    Buffer param_shard;           // compute dtype, slice (sharded_params only, not on NVMe)
    offload::PinnedBuffer shard_host;  // the slice while checked out from NVMe
    int shard_out = 0;            // check-outs of the NVMe slice
    bool shard_dirty = false;     // written while checked out: write back at check-in
    Buffer full_grads;            // compute dtype, padded (stages 0 and 1)
    Buffer grad_slice;            // compute dtype, slice (stages 2 and 3)
    // Owned range of the optimizer: [own_begin, own_begin + own_len) of the padded unit.
    std::int64_t own_begin = 0, own_len = 0;
    // Micro-step bookkeeping.
    int reduced = 0;             // reduce() calls since the last step
    Buffer micro_grads;          // stages 2/3: this micro-step's full-size gradient
    // Stage-3 gather state.
    Buffer gathered;             // full params while live
    Work gather_work;            // pending all-gather into `gathered`
    int refs = 0;                // live UnitParams handles
    std::uint64_t token = 0;     // bumps on every release so a stale handle cannot double-release
  };

  // engine.cpp
  void init_params(const std::function<void(const ParamInfo&, std::span<float>)>& init);
  MemoryReport memory() const;
  std::vector<float> full_master(int unit);
  std::vector<float> full_params(int unit);
  void check_unit(int unit, const char* what) const;
  void report_inert_settings();
  void* own_grads(Unit& u);       // the gradient values the optimizer reads (owned range)
  void* own_params_out(Unit& u);  // where the optimizer writes updated compute params
  std::size_t esize() const { return dtype_size(dtype_); }

  // param_offload.cpp (offload_param.device: nvme)
  void setup_param_offload();
  bool param_on_nvme(const Unit& u) const;
  std::string param_key(int unit) const;
  void* shard(Unit& u);  // the unit's parameter slice (checked out when on NVMe)
  void checkout_shard(int unit, bool load);
  void checkin_shard(int unit, bool dirty);
  void finish_gather(int unit);  // gather.cpp: wait for the all-gather, check the slice back in

  // gather.cpp
  UnitParams gather(int unit);
  void release(int unit, std::uint64_t token);
  void start_gather(int unit);
  void prefetch_after(std::size_t pos);
  void drop_gathered();
  void set_eval(bool on);
  void finish_micro_step_order();
  std::int64_t live_elements() const;

  // reduce.cpp
  UnitGrads grads(int unit);
  void reduce(int unit);
  void flush_bucket();
  void wait_in_flight(std::size_t keep);

  // step.cpp
  StepResult step();

  // checkpoint support (engine_state.cpp): what save_checkpoint / load_checkpoint read and set.
  struct TrainingState {
    std::int64_t step = 0, applied = 0;
    LossScaler::State scaler{1.0, 0, 0, -1};
  };
  TrainingState training_state() const;
  void check_between_steps(const char* what) const;  // no live handle, no partial accumulation
  int optimizer_moments() const;
  void read_owned(int unit, int which, float* owned);  // which: 0 master, 1.. moments
  void write_owned(int unit, int which, const float* owned);
  void begin_restore();  // the engine refuses to train until finish_restore
  void finish_restore(const TrainingState& s, bool restore_scaler);  // collective
  void refresh_params_from_master();  // collective: compute params = round(master)

  Context& ctx_;
  Config cfg_;
  Layout layout_;
  std::unique_ptr<Backend> backend_;
  Communicator* comm_ = nullptr;
  int rank_ = 0, world_ = 1, stage_ = 0, gas_ = 1;
  DType dtype_ = DType::f32;
  std::vector<Unit> units_;
  std::unique_ptr<OptimizerStore> opt_;
  LossScaler scaler_;
  BufferPool grad_pool_, gather_pool_, scratch_pool_;
  bool initialized_ = false;
  bool eval_mode_ = false;

  // Micro-step and step counters.
  int micro_ = 0;                 // completed micro-steps since the last step()
  int reduced_this_micro_ = 0;    // units reduced in the current micro-step
  std::int64_t step_ = 0;         // step() calls
  std::int64_t applied_ = 0;      // non-skipped updates (Adam's t, the scheduler's step)

  // Gather order (stage 3): recorded during the first micro-step, checked afterwards.
  std::vector<int> order_;
  bool recording_ = true;
  std::size_t pos_ = 0;           // gathers so far in this micro-step

  // Reduce buckets: units whose gradient is ready but not yet handed to a collective, and
  // collectives in flight with what to do on completion.
  std::vector<int> pending_;
  std::int64_t pending_elems_ = 0;
  struct InFlight {
    std::vector<Work> works;
    std::vector<std::function<void()>> finish;
  };
  std::deque<InFlight> in_flight_;
  std::vector<char> stage_buf_;
  std::unique_ptr<offload::NvmeSwapper> param_swap_;
  std::unique_ptr<offload::PinnedPool> param_pool_;
  int param_instance_ = 0;  // host staging of offloaded sub-groups (non-host backends)
};

}  // namespace zero
