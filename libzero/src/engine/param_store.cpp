// Parameter storage and stage-3 parameter offload to NVMe (see engine/param_store.hpp).
#include "engine/param_store.hpp"

#include <fmt/format.h>

#include <atomic>
#include <string>

#include "zero/error.hpp"

namespace zero {

ParamStore::ParamStore(Backend& backend, const Config& cfg, const std::vector<UnitShape>& shapes, int rank, DType dtype)
    : backend_(backend), shapes_(shapes), esize_(dtype_size(dtype)), units_(shapes.size()) {
  const auto& z = cfg.zero_optimization;
  if (z.offload_param.device == OffloadDevice::nvme) {
    offload::AioOptions aio;
    aio.block_size = static_cast<std::size_t>(cfg.aio.block_size);
    aio.queue_depth = cfg.aio.queue_depth;
    swap_ = std::make_unique<offload::NvmeSwapper>(z.offload_param.nvme_path, rank, aio);
    pool_ = std::make_unique<offload::PinnedPool>(z.offload_param.pin_memory);
    static std::atomic<int> next_instance{0};
    instance_ = next_instance++;
    for (std::size_t i = 0; i < shapes_.size(); ++i)
      if (shapes_[i].sharded_params) swap_->reserve(swap_key(static_cast<int>(i)), slice_bytes(static_cast<int>(i)));
  }
  for (std::size_t i = 0; i < shapes_.size(); ++i) {
    const UnitShape& s = shapes_[i];
    if (on_nvme(static_cast<int>(i))) continue;  // the slice lives in a swap file
    if (s.sharded_params)
      units_[i].shard = backend_.alloc(static_cast<std::size_t>(s.slice) * esize_);
    else
      units_[i].full = backend_.alloc(static_cast<std::size_t>(s.padded) * esize_);
  }
}

bool ParamStore::on_nvme(int unit) const { return swap_ != nullptr && shape(unit).sharded_params; }

std::size_t ParamStore::slice_bytes(int unit) const { return static_cast<std::size_t>(shape(unit).slice) * esize_; }

std::string ParamStore::swap_key(int unit) const { return fmt::format("e{}_param{}", instance_, unit); }

void* ParamStore::full(int unit) const { return state(unit).full.get(); }

void* ParamStore::shard(int unit) {
  Unit& u = state(unit);
  if (!on_nvme(unit)) return u.shard.get();
  ZERO_CHECK(u.checked_out > 0, "internal: parameter shard used while not checked out from NVMe");
  return u.shard_host.data();
}

void* ParamStore::owned(int unit) {
  const UnitShape& s = shape(unit);
  if (s.sharded_params) return shard(unit);
  return state(unit).full.as<char>() + static_cast<std::size_t>(s.own_begin) * esize_;
}

void ParamStore::checkout(int unit, bool load) {
  if (!on_nvme(unit)) return;
  Unit& u = state(unit);
  if (u.checked_out++ > 0) return;
  u.shard_host = pool_->acquire(slice_bytes(unit));
  if (load) swap_->read_async(swap_key(unit), u.shard_host.data(), slice_bytes(unit)).wait();
}

void ParamStore::checkin(int unit, bool dirty) {
  if (!on_nvme(unit)) return;
  Unit& u = state(unit);
  ZERO_CHECK(u.checked_out > 0, "internal: parameter shard checked in twice");
  if (dirty) u.dirty = true;
  if (--u.checked_out > 0) return;
  if (u.dirty) {
    swap_->write_async(swap_key(unit), u.shard_host.data(), slice_bytes(unit)).wait();
    u.dirty = false;
  }
  u.shard_host.reset();
}

void ParamStore::report(MemoryReport& r) const {
  for (std::size_t i = 0; i < shapes_.size(); ++i) {
    const UnitShape& s = shapes_[i];
    std::int64_t bytes = s.param_elements() * static_cast<std::int64_t>(esize_);
    if (on_nvme(static_cast<int>(i)))
      r.offloaded_nvme += bytes;
    else
      r.params += bytes;
  }
}

}  // namespace zero
