// ParamStore: where each unit's compute-dtype parameters live between uses.
//
// A unit below stage 3's persistence threshold keeps its full (padded) parameters on every rank;
// a sharded unit keeps only the rank's slice, in backend memory or, with
// offload_param.device: nvme, in a swap file. A slice on NVMe is checked out (read into a pinned
// buffer) only while something needs it: the all-gather that builds the full unit (started
// ahead of use by the prefetcher, so the read happens ahead of the gather), the optimizer
// writing the updated slice, a checkpoint refresh. Checked back in, it is written if it changed
// and the buffer returns to the pool, so resident parameter memory is the units in flight, not
// the model. Check-out and check-in are no-ops for slices held in memory.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "engine/unit_shape.hpp"
#include "zero/config.hpp"
#include "zero/engine.hpp"
#include "offload/nvme_swapper.hpp"
#include "offload/pinned_pool.hpp"

namespace zero {

class ParamStore {
 public:
  ParamStore(Backend& backend, const Config& cfg, const std::vector<UnitShape>& shapes, int rank, DType dtype);

  bool on_nvme(int unit) const;
  void* full(int unit) const;  // the full padded parameters of a unit that is not sharded
  void* shard(int unit);       // the slice of a sharded unit (checked out when on NVMe)
  void* owned(int unit);       // where the optimizer writes the owned range
  void checkout(int unit, bool load);
  void checkin(int unit, bool dirty);
  void report(MemoryReport& r) const;
  // The NVMe swapper (offload_param.device nvme), whose space the engine checks and claims.
  offload::NvmeSwapper* swapper() { return swap_.get(); }

 private:
  struct Unit {
    Buffer full;                       // compute dtype, padded (units not sharded)
    Buffer shard;                      // compute dtype, slice (sharded, in memory)
    offload::PinnedBuffer shard_host;  // the slice while checked out from NVMe
    int checked_out = 0;               // check-outs of the NVMe slice
    bool dirty = false;                // written while checked out: write back at check-in
  };
  std::string swap_key(int unit) const;
  std::size_t slice_bytes(int unit) const;
  // Unit ids index the per-unit vectors.
  Unit& state(int unit) { return unit_at(units_, unit); }
  const Unit& state(int unit) const { return unit_at(units_, unit); }
  const UnitShape& shape(int unit) const { return unit_at(shapes_, unit); }

  Backend& backend_;
  const std::vector<UnitShape>& shapes_;
  std::size_t esize_;
  std::vector<Unit> units_;
  std::unique_ptr<offload::NvmeSwapper> swap_;
  std::unique_ptr<offload::PinnedPool> pool_;
  int instance_ = 0;  // two engines of one process share the rank directory, never a file
};

}  // namespace zero
