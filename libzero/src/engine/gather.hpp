// ParamGatherer: stage-3 parameter gathering (the schedule of all-gathers and the live set).
//
// The first micro-step records the order in which units are gathered (forward, then backward).
// Every later micro-step must repeat it: each gather is checked against the recorded position,
// so a changed graph is an immediate error on the rank that changed, never a collective that
// waits forever. Knowing the order lets the gatherer all-gather ahead: after each gather, units
// next in the order are started until stage3_prefetch_bucket_size elements are in flight,
// never exceeding stage3_max_live_parameters gathered elements. Prefetch continues into the
// next micro-step only when one follows in the same step: after the last one the optimizer
// rewrites the slices, so a gather started then would read stale values and be thrown away.
// A released unit whose next use (cyclically, across micro-steps) is within
// stage3_max_reuse_distance elements is kept. Units that are not sharded are handed out as is.
//
// hpZ (zero_hpz_partition_size N > 1): when a unit's all-gather over every rank completes, the
// rank keeps its 1/N chunk of the full unit (its position in its group of N consecutive ranks);
// until step() changes the parameters, later gathers of that unit (the backward's, the next
// micro-step's) all-gather those chunks inside the group instead. The bytes are the same, so
// the result is bit for bit that of plain stage 3; only the links they cross change.
//
// qwZ (zero_quantized_weights): the all-gather over every rank sends each rank's slice block-
// quantized to int8 (comm/quantize.hpp; the backend's quantizer: kernels on CUDA, the same bytes)
// and dequantizes on arrival into the compute dtype. With
// hpZ the secondary chunk keeps the dequantized values, so the backward sees the forward's.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.hpp"
#include "engine/param_store.hpp"
#include "engine/unit_shape.hpp"
#include "zero/comm.hpp"
#include "zero/config.hpp"
#include "zero/layout.hpp"

namespace zero {

class ParamGatherer {
 public:
  // How it gathers, besides what (the store's slices, the units' shapes) and over whom.
  struct Options {
    // stage3_prefetch_bucket_size, stage3_max_live_parameters, stage3_max_reuse_distance, qwZ's keys
    ZeroOptimizationConfig zero;
    DType dtype = DType::f32;     // the compute dtype of the gathered parameters
    Communicator* hpz = nullptr;  // the communicator of this rank's hpZ group, or null (hpZ off)
  };
  ParamGatherer(Backend& backend, Communicator& comm, ParamStore& params, const Layout& layout,
                const std::vector<UnitShape>& shapes, const Options& opts);
  ~ParamGatherer();  // completes gathers still in flight: they write into our buffers

  struct Lease {
    void* data;
    std::uint64_t token;  // bumps on every release so a stale handle cannot double-release
  };
  // The full parameters of `unit`, valid until release(unit, token). training: the gather is
  // recorded or checked against the order, and prefetches; wrap: another micro-step of this
  // step follows the current one, so prefetch may continue into it.
  Lease acquire(int unit, bool training, bool wrap);
  void release(int unit, std::uint64_t token, bool training);
  // The backward's last reduce(): checks this micro-step gathered as many units as recorded.
  void finish_micro_step();
  // Completes every gather and drops every gathered unit (their values are about to change).
  // `what` names the caller in the error raised when a handle still holds a unit.
  void drop_all(const char* what);

  // Gathers every sharded unit and holds it (one reference each) until release_all(); gathers
  // in eval mode then issue no collective. release_all() is local.
  void hold_all();
  void release_all();
  bool holding_all() const { return holding_all_; }

  bool mid_micro_step() const { return pos_ != 0; }
  int held_unit() const;  // a unit some UnitParams handle holds, or -1
  // What the gather pool has held from the backend (freed buffers kept for reuse included).
  std::int64_t peak_bytes() const { return pool_.held_peak(); }
  std::int64_t all_gathers() const { return all_gathers_; }
  std::int64_t secondary_bytes() const;  // hpZ's secondary shards held

 private:
  struct Unit {
    Buffer gathered;  // full params while live
    Work work;        // pending all-gather into `gathered`
    int refs = 0;     // live UnitParams handles
    std::uint64_t token = 0;
    Buffer q_send, q_recv;  // qwZ: the packed slice sent and every rank's received
    Buffer secondary;       // hpZ: this rank's chunk of the full unit
    bool secondary_valid = false;
    bool from_secondary = false;  // the pending gather reads the group's chunks
  };
  void check_order(int unit);
  // Starts the all-gather of `unit`; why: "gather", "prefetch" or "gather_all" (the collective
  // check names it), eval: for a forward-only pass.
  void start(int unit, const char* why, bool eval);
  void finish(int unit);  // waits for the all-gather, checks the slice back in
  void prefetch_after(std::size_t pos, bool wrap);
  std::int64_t live_elements() const;
  // Unit ids index the per-unit vectors.
  Unit& state(int unit) { return unit_at(units_, unit); }
  const UnitShape& shape(int unit) const { return unit_at(shapes_, unit); }

  Backend& backend_;
  Communicator& comm_;
  ParamStore& params_;
  const Layout& layout_;
  const std::vector<UnitShape>& shapes_;
  const ZeroOptimizationConfig z_;
  DType dtype_;
  BufferPool pool_;
  std::vector<Unit> units_;
  std::vector<int> order_;  // recorded during the first micro-step, checked afterwards
  bool recording_ = true;
  std::size_t pos_ = 0;  // gathers so far in this micro-step
  std::int64_t all_gathers_ = 0;
  bool holding_all_ = false;
  Communicator* hpz_;      // null: hpZ off
  std::size_t qwz_block_;  // 0: qwZ off
};

}  // namespace zero
