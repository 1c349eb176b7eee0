// OptimizerStore: where the fp32 master weights and optimizer moments of the owned slices live.
//
// "device" keeps them in backend memory (no offload); "cpu" in host memory (pinned when
// offload_optimizer.pin_memory), stepped by the host kernels in sub_group_size chunks; "nvme"
// streams each sub-group from the rank's swap directory, reading the next sub-group and
// writing the previous one while the current one is stepped. The engine sees one interface:
// for_each() visits every sub-group with its state resident, in a fixed order, so the
// arithmetic — and so the result, bit for bit — is the same in every mode.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "backend/backend.hpp"
#include "offload/nvme_swapper.hpp"
#include "zero/config.hpp"
#include "zero/engine.hpp"

namespace zero {

class OptimizerStore {
 public:
  virtual ~OptimizerStore() = default;
  // Sets unit's owned master slice (moments start at zero).
  virtual void write_master(int unit, const float* owned) = 0;
  virtual void read_master(int unit, float* owned) = 0;
  // Optimizer moments of the owned slice: index 0 .. moments() - 1 (Optimizer::moments).
  virtual void read_moment(int unit, int which, float* owned) = 0;
  virtual void write_moment(int unit, int which, const float* owned) = 0;

  // fn(unit, begin, len, master, state): a sub-group [begin, begin+len) of unit's owned range,
  // its state resident and writable: state[k] for k < moments().
  using Visit = std::function<void(int unit, std::int64_t begin, std::int64_t len, float* master, float* const* state)>;
  virtual void for_each(const Visit& fn) = 0;
  virtual void report(MemoryReport& r) const = 0;
  // True when the state lives in host memory (offload cpu / nvme): the host kernels step it.
  virtual bool on_host() const = 0;
  // The NVMe swapper (offload_optimizer.device nvme), whose space the engine checks and claims.
  virtual offload::NvmeSwapper* swapper() { return nullptr; }
  int moments() const { return moments_; }

 protected:
  int moments_ = 2;
};

// The store offload_optimizer.device asks for, holding owned_len[u] fp32 elements of master and
// of each moment for unit u. With NVMe the caller checks and claims the disk space (swapper()).
std::unique_ptr<OptimizerStore> make_optimizer_store(Backend& backend, const Config& cfg, int rank, int moments,
                                                     const std::vector<std::int64_t>& owned_len);

}  // namespace zero
