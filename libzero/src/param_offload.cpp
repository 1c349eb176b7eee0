// Stage-3 parameter offload to NVMe (offload_param.device: nvme).
//
// A sharded unit's parameter slice then lives in a swap file instead of memory. It is checked
// out (read into a pinned buffer) only while something needs it: the all-gather that builds the
// full unit (started ahead of use by the prefetcher, so the read happens ahead of the gather),
// the optimizer writing the updated slice, a checkpoint refresh. Checked back in, it is written
// if it changed and the buffer returns to the pool, so resident parameter memory is the units in
// flight, not the model.
#include <cstdio>
#include <string>

#include "engine_impl.hpp"
#include "zero/error.hpp"

namespace zero {

bool EngineImpl::param_on_nvme(const Unit& u) const { return u.sharded_params && param_swap_ != nullptr; }

void EngineImpl::setup_param_offload() {
  const auto& z = cfg_.zero_optimization;
  if (z.offload_param.device != OffloadDevice::nvme) return;
  offload::AioOptions aio;
  aio.block_size = static_cast<std::size_t>(cfg_.aio.block_size);
  aio.queue_depth = cfg_.aio.queue_depth;
  param_swap_ = std::make_unique<offload::NvmeSwapper>(z.offload_param.nvme_path, rank_, aio);
  param_pool_ = std::make_unique<offload::PinnedPool>(z.offload_param.pin_memory);
  static int next_instance = 0;
  param_instance_ = next_instance++;
  for (std::size_t i = 0; i < units_.size(); ++i)
    if (units_[i].sharded_params) param_swap_->reserve(param_key(static_cast<int>(i)), static_cast<std::size_t>(units_[i].slice) * esize());
  param_swap_->check_space();
}

std::string EngineImpl::param_key(int unit) const {
  char buf[48];
  std::snprintf(buf, sizeof buf, "e%d_param%d", param_instance_, unit);
  return buf;
}

void* EngineImpl::shard(Unit& u) {
  if (!param_on_nvme(u)) return u.param_shard.get();
  ZERO_CHECK(u.shard_out > 0, "internal: parameter shard used while not checked out from NVMe");
  return u.shard_host.data();
}

void EngineImpl::checkout_shard(int unit, bool load) {
  Unit& u = units_[static_cast<std::size_t>(unit)];
  if (!param_on_nvme(u)) return;
  if (u.shard_out++ > 0) return;
  std::size_t bytes = static_cast<std::size_t>(u.slice) * esize();
  u.shard_host = param_pool_->acquire(bytes);
  if (load) param_swap_->read_async(param_key(unit), u.shard_host.data(), bytes).wait();
}

void EngineImpl::checkin_shard(int unit, bool dirty) {
  Unit& u = units_[static_cast<std::size_t>(unit)];
  if (!param_on_nvme(u)) return;
  ZERO_CHECK(u.shard_out > 0, "internal: parameter shard checked in twice");
  if (dirty) u.shard_dirty = true;
  if (--u.shard_out > 0) return;
  if (u.shard_dirty) {
    param_swap_->write_async(param_key(unit), u.shard_host.data(), static_cast<std::size_t>(u.slice) * esize()).wait();
    u.shard_dirty = false;
  }
  u.shard_host.reset();
}

}  // namespace zero
