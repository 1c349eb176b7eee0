// Optimizer: the interface every optimizer implements, one file per optimizer beside it
// (adam.cpp, sgd.cpp, lamb.cpp, lion.cpp, adafactor.cpp, muon.cpp), its host kernels in offload/
// (host_<name>.cpp) and its state counted by registry.cpp. How a step runs, why statistics over
// whole tensors are exact at every stage, and where each optimizer keeps what: docs/architecture.md,
// note optimizer.
//
// The engine owns the state (OptimizerStore: the fp32 master and moments() arrays per owned
// element) and visits it sub-group by sub-group, passes() times per step. In each visit it hands
// the optimizer runs of elements (OptimRun); between passes it calls end_pass(), where an
// optimizer combines what the pass measured across the partition group.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "offload/host_optimizer.hpp"
#include "zero/config.hpp"
#include "zero/dtype.hpp"
#include "zero/layout.hpp"
#include "zero/optim.hpp"

namespace zero {

class Backend;
class Communicator;

// Named arrays of per-tensor values (Optimizer::tensor_records).
using TensorRecords = std::map<std::string, std::vector<double>>;

// The per-step values every optimizer receives.
struct StepHyper {
  double lr = 0.0;          // the scheduler's (or the loop's) rate for this update
  std::int64_t step = 1;    // updates applied including this one (Adam's t)
  float grad_scale = 1.0f;  // multiplies every stored gradient: 1/loss scale x clip / average
};

// How the engine partitions the model, as an optimizer needs to know it.
struct OptimizerEnv {
  const Layout* layout = nullptr;
  std::vector<std::int64_t> slice;  // per unit: elements per partition slice
  int rank = 0, world = 1, stage = 0;
  // Host-memory collectives over the partition group (null when world is 1). An optimizer's
  // end_pass may call them; every rank calls end_pass at the same point.
  Communicator* comm = nullptr;
  // Host-memory collectives over the tensor group (the ranks holding the other parts of the
  // tensors split by tensor parallelism; null when there is none): per-tensor statistics of a
  // split tensor are summed over it too (sum_over_tensor_group), so they are the whole tensor's.
  Communicator* tensor = nullptr;
  // The owned range of unit u: the whole padded unit at stage 0, else slice `rank`.
  std::int64_t own_begin(int unit) const {
    return stage == 0 ? 0 : static_cast<std::int64_t>(rank) * slice[static_cast<std::size_t>(unit)];
  }
  std::int64_t own_len(int unit) const {
    const std::int64_t s = slice[static_cast<std::size_t>(unit)];
    return stage == 0 ? s * world : s;
  }
};

// Adam's m and v, and OneBitLamb's fresh variance beside them.
constexpr int kMaxMoments = 3;

// A run of owned elements with their state resident. For per-tensor optimizers it lies inside
// one parameter and one partition slice; for element-wise ones it is a run of parameters that
// agree on weight decay (param null), padding included.
struct OptimRun {
  int unit = 0;
  const ParamInfo* param = nullptr;  // per-tensor optimizers: the parameter
  int tensor = -1;                   // per-tensor optimizers: the parameter's index in the layout
  std::int64_t at = 0;               // offset of the first element inside the parameter
  std::int64_t own_at = 0;           // offset of the first element inside the unit's owned range
  std::int64_t n = 0;
  int slice = 0;      // the partition slice holding the run
  bool decay = true;  // weight decay applies
  float* master = nullptr;
  float* state[kMaxMoments] = {};
  const void* grad = nullptr;  // the accumulation dtype
  DType grad_type = DType::f32;
  void* param_out = nullptr;  // the compute dtype; null: not written this pass
  DType param_type = DType::f32;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual const char* name() const = 0;
  // fp32 arrays kept per owned element besides the master.
  virtual int moments() const = 0;
  // Visits of the owned state per step; param_out is set in the last one only.
  virtual int passes() const { return 1; }
  // Runs split at parameter and slice boundaries (statistics per tensor), or at weight-decay
  // boundaries only (element-wise updates).
  virtual bool per_tensor() const { return false; }
  // The backend can step device-resident state (Backend::adam, Backend::sgd).
  virtual bool device_kernels() const { return false; }
  // Why this optimizer cannot run on `layout` (a parameter split by tensor parallelism, say), or "".
  virtual std::string unsupported(const Layout& layout) const {
    (void)layout;
    return {};
  }
  virtual void begin_step(const StepHyper& h) = 0;
  // One run of pass `pass`; `device` is the backend when the state lives in its memory, null
  // when it is host memory.
  virtual void run(int pass, const OptimRun& r, Backend* device) = 0;
  // Collective over the partition group: called on every rank after pass `pass`, except the last.
  virtual void end_pass(int pass) { (void)pass; }

  // Optimizers that reduce the gradients themselves (OneBitAdam's compressed momentum exchange):
  // for update number `step` the engine leaves each rank's whole local gradient unreduced, scales
  // it without the average over ranks, and calls exchange() with every unit's padded gradient
  // (the accumulation dtype) after begin_step and before the passes. `device`: the backend whose
  // memory holds the gradients and the state (as run()'s), null when they are host memory.
  virtual bool local_gradients(std::int64_t step) const {
    (void)step;
    return false;
  }
  virtual void exchange(const std::vector<const void*>& full, DType type, Backend* device) {
    (void)full;
    (void)type;
    (void)device;
  }
  // Before exchange(), a visit of the owned state (run() with pass -1, param_out null) when this
  // says the optimizer needs one.
  virtual bool wants_capture() const { return false; }
  // Host bytes the optimizer keeps besides the store's per-element arrays (the 1-bit exchange's
  // buffers, OneBitLamb's values per tensor): MemoryReport::optimizer_buffers; zero-plan
  // counts the same through optimizer_buffer_bytes.
  virtual std::int64_t buffer_bytes() const { return 0; }
  // The engine restored the state from a checkpoint: this rank's own caches are stale. Called
  // after restore_tensor_records and set_rank_state.
  virtual void restored() {}

  // What a checkpoint keeps besides the per-element arrays (docs/checkpoints.md):
  // Values per tensor (global index, tensor_offsets) the optimizer keeps, the same on every rank
  // and at any partition (OneBitLamb's frozen trust ratios): named arrays, saved once in the
  // metadata. A restore hands back the checkpoint's, or {} where it holds none (an older
  // release's, another optimizer's, another grid's).
  virtual TensorRecords tensor_records() const { return {}; }
  virtual void restore_tensor_records(const TensorRecords& r) { (void)r; }
  // State of this rank's own (the 1-bit exchange's errors and shared momentum), saved per rank
  // as kind rank_state_kind() ("" when none); set_rank_state({}) starts it again.
  virtual const char* rank_state_kind() const { return ""; }
  virtual std::size_t rank_state_size() const { return 0; }
  virtual std::vector<float> rank_state() const { return {}; }
  virtual void set_rank_state(const std::vector<float>& s) { (void)s; }
};

// The optimizer optimizer.type names.
std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& o, const OptimizerEnv& env);

// The collectives an optimizer adds to a step at stages 1-3, over the partition group (zero-plan
// counts them): per-slice statistics (`stat_doubles` per rank each, SliceStats::combine), and for Muon
// one fp32 all-gather and one reduce-scatter of the slice of each unit in `matrix_units`.
// Under tensor parallelism, `tensor_doubles`: all-gathers over the tensor group of the split
// tensors' statistics, that many doubles per rank each (Lamb's and Adafactor's; empty when no
// tensor is split); and Muon's matrices cut by tensor parallelism (muon_split.hpp), per unit in
// which this rank puts some together (all of them at stage 0 or on one partition rank, else those
// it owns), `tensor_matrix_floats`: one fp32 all-gather of that many floats per rank (its parts),
// then one fp32 all-reduce of `tensors` times as many (the whole matrices).
struct OptimizerExchange {
  std::vector<std::int64_t> stat_doubles;
  std::vector<int> matrix_units;
  std::vector<std::int64_t> tensor_doubles;
  std::vector<std::int64_t> tensor_matrix_floats;
};
// Where the rank sits: `world` ranks in its partition group, `rank` its place there, the ZeRO
// stage, and `tensors` ranks in its tensor group.
struct ExchangeRank {
  int world = 1, rank = 0, stage = 0, tensors = 1;
};
OptimizerExchange optimizer_exchange(const OptimizerConfig& o, const Layout& layout, const ExchangeRank& at = {});

// Optimizer::buffer_bytes once its buffers are all taken (after a 1-bit optimizer's first
// compressed step), for `layout` cut into `slices` elements per rank slice of each unit over
// `world` ranks: what zero-plan counts.
std::int64_t optimizer_buffer_bytes(const OptimizerConfig& o, const Layout& layout,
                                    const std::vector<std::int64_t>& slices, int world);

// Per-tensor statistics that are the same whatever the partition, sub-group size or stage: each
// (slot, slice) is a sequential fold in element order (a run continues it), and end-of-pass
// combine() adds the slices in slice order. Each rank fills the slices it owns (stage 0: all of
// them), so the totals are bit-identical at every stage and with or without offload.
//
// The first `lane_slots` slots are the host kernels' fold states instead (offload::kStatFold
// doubles: blocks of interleaved lanes, which vectorise and fold on all threads); combine() adds
// a slot's state up with offload::fold_total first, so the result is still independent of how
// the elements were cut. Slots from `max_from` on are combined by their largest value instead
// (exact in any order).
//
// A rank keeps the slices it fills only: `held` is its one slice at stages 1-3 (kAllSlices at
// stage 0), so the memory is (slots x 1) doubles whatever the rank count.
class SliceStats {
 public:
  static constexpr int kLanes = offload::kStatFold;
  static constexpr int kAllSlices = -1;
  void reset(int slots, int slices, int lane_slots, int held, int max_from = -1);
  double& at(int slot, int slice) {
    return v_[row(slice) * static_cast<std::size_t>(slots_) + static_cast<std::size_t>(slot)];
  }
  double* lanes(int slot, int slice) {
    return lanes_.data() +
           (row(slice) * static_cast<std::size_t>(lane_slots_) + static_cast<std::size_t>(slot)) * kLanes;
  }
  // Collective when comm is not null (stages 1-3, held = own): every rank's values all-gathered
  // and folded in slice order; or, when slots x ranks is large (ordered_reduce), an ordered
  // reduce: rank q receives every rank's values of the q-th chunk of the slots (an all-to-all),
  // folds them in slice order, and an all-gather of the chunks gives every rank every total, 2 x
  // slots doubles sent a rank instead of slots x ranks. The same bits either way. Without comm,
  // the held slices fold in order.
  void combine(Communicator* comm, int own);
  double total(int slot) const { return total_[static_cast<std::size_t>(slot)]; }
  // After combine(), collective over the tensor group: the totals of `slots` (those of tensors
  // split by tensor parallelism, a rank's part each) summed over it (sum_over_tensor_group).
  void sum_over_tensor_group(Communicator& tensor, const std::vector<int>& slots);
  int slots() const { return slots_; }
  // Which collectives combine() uses (zero-plan counts them): the ordered reduce above 2^20
  // doubles gathered (8 MiB a rank), with chunk_doubles doubles to each rank in its all-to-all
  // and all-gather.
  static bool ordered_reduce(std::int64_t slots, int ranks) { return slots * ranks > (std::int64_t{1} << 20); }
  static std::int64_t chunk_doubles(std::int64_t slots, int ranks) { return (slots + ranks - 1) / ranks; }

 private:
  std::size_t row(int slice) const;
  double fold(double t, double x, int slot) const { return slot >= max_from_ ? std::max(t, x) : t + x; }
  int slots_ = 0, slices_ = 0, lane_slots_ = 0, held_ = kAllSlices, max_from_ = 0;
  std::vector<double> v_, total_, lanes_;
};

// Replaces each of v's values by its sum over the tensor group (an all-gather, then the parts added
// in tensor-rank order, so every member gets the same bits). Collective over the group.
void sum_over_tensor_group(Communicator& tensor, std::vector<double>& v);

// The global index of each parameter (its order in the layout, unit by unit).
std::vector<int> tensor_offsets(const Layout& layout);

}  // namespace zero
