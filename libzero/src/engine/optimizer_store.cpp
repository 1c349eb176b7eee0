#include "engine/optimizer_store.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "engine/unit_shape.hpp"
#include "optim/optimizer.hpp"
#include "zero/error.hpp"
#include "offload/nvme_swapper.hpp"
#include "offload/pinned_pool.hpp"
#include "offload/swap_pipeline.hpp"

namespace zero {

namespace {

// Sub-groups of the owned state: each unit's owned range cut into sub_group_size pieces.
struct SubGroup {
  int unit;
  std::int64_t begin, len;
};

std::vector<SubGroup> make_sub_groups(const std::vector<std::int64_t>& owned_len, std::int64_t sub_group) {
  std::vector<SubGroup> groups;
  for (std::size_t i = 0; i < owned_len.size(); ++i) {
    std::int64_t len = owned_len[i];
    for (std::int64_t b = 0; b < len; b += sub_group)
      groups.push_back({static_cast<int>(i), b, std::min(sub_group, len - b)});
  }
  return groups;
}

// Owned state held in memory the CPU can address directly: backend memory on the host backend
// (offload "none") or host memory from the pinned pool (offload "cpu"). Only the chunking
// differs: the offload path steps sub_group_size elements at a time, which the element-wise
// update makes bit-identical to one pass.
class ResidentStore final : public OptimizerStore {
 public:
  ResidentStore(Backend& backend, const Config& cfg, int moments, const std::vector<std::int64_t>& owned_len,
                bool offloaded)
      : backend_(backend), offloaded_(offloaded) {
    moments_ = moments;
    const auto& z = cfg.zero_optimization;
    std::int64_t sub_group = offloaded ? std::max<std::int64_t>(1, z.sub_group_size) : INT64_MAX;
    groups_ = make_sub_groups(owned_len, sub_group);
    if (offloaded) pool_ = std::make_unique<offload::PinnedPool>(z.offload_optimizer.pin_memory);
    for (std::int64_t len : owned_len) {
      std::size_t bytes = static_cast<std::size_t>(len) * sizeof(float);
      State s;
      for (int k = 0; k <= moments_; ++k) {
        if (offloaded) {
          s.host[k] = pool_->acquire(bytes);
          std::memset(s.host[k].data(), 0, bytes);
          s.ptr[k] = s.host[k].as<float>();
        } else {
          s.dev[k] = backend_.alloc(bytes);
          s.ptr[k] = s.dev[k].as<float>();
        }
      }
      s.bytes = bytes;
      state_.push_back(std::move(s));
    }
  }
  void write_master(int unit, const float* owned) override { put(slot(unit, 0), owned, bytes(unit)); }
  void read_master(int unit, float* owned) override { get(owned, slot(unit, 0), bytes(unit)); }
  void read_moment(int unit, int which, float* owned) override { get(owned, slot(unit, which + 1), bytes(unit)); }
  void write_moment(int unit, int which, const float* owned) override {
    put(slot(unit, which + 1), owned, bytes(unit));
  }
  bool on_host() const override { return offloaded_; }
  void for_each(const Visit& fn) override {
    for (const auto& g : groups_) {
      auto& s = unit_at(state_, g.unit);
      float* state[kMaxMoments] = {};
      for (int k = 0; k < moments_; ++k) state[k] = s.ptr[k + 1] + g.begin;
      fn(g.unit, g.begin, g.len, s.ptr[0] + g.begin, state);
    }
  }
  void report(MemoryReport& r) const override {
    std::int64_t total = 0;
    for (const auto& s : state_) total += static_cast<std::int64_t>(s.bytes);
    if (offloaded_) {
      r.offloaded_host += static_cast<std::int64_t>(pool_->bytes_reserved());
    } else {
      r.master += total;
      r.optimizer += total * moments_;
    }
  }

 private:
  struct State {
    float* ptr[1 + kMaxMoments] = {};  // master, then each moment
    Buffer dev[1 + kMaxMoments];
    offload::PinnedBuffer host[1 + kMaxMoments];
    std::size_t bytes = 0;
  };
  float* slot(int unit, int k) {
    ZERO_CHECK(k <= moments_, fmt::format("optimizer moment {} does not exist for this optimizer", k - 1));
    return unit_at(state_, unit).ptr[k];
  }
  std::size_t bytes(int unit) const { return unit_at(state_, unit).bytes; }
  // Host memory is copied directly; backend memory goes through the backend.
  void put(float* dst, const float* host, std::size_t n) {
    if (offloaded_)
      std::memcpy(dst, host, n);
    else
      backend_.from_host(dst, host, n);
  }
  void get(float* host, const float* src, std::size_t n) {
    if (offloaded_)
      std::memcpy(host, src, n);
    else
      backend_.to_host(host, src, n);
  }

  Backend& backend_;
  bool offloaded_;
  std::vector<SubGroup> groups_;
  std::unique_ptr<offload::PinnedPool> pool_;
  std::vector<State> state_;
};

// Owned state on NVMe: one swap file per sub-group and tensor, streamed through three pinned
// buffers by SwapPipeline (read i+1 and write i-1 while i is stepped). Free space is checked
// when the engine is built, before any step, for all ranks together (EngineImpl::claim_nvme_space).
class NvmeStore final : public OptimizerStore {
 public:
  NvmeStore(const Config& cfg, int rank, int moments, const std::vector<std::int64_t>& owned_len) {
    moments_ = moments;
    const auto& z = cfg.zero_optimization;
    offload::AioOptions aio;
    aio.block_size = static_cast<std::size_t>(cfg.aio.block_size);
    aio.queue_depth = cfg.aio.queue_depth;
    swapper_ = std::make_unique<offload::NvmeSwapper>(z.offload_optimizer.nvme_path, rank, aio);
    pool_ = std::make_unique<offload::PinnedPool>(z.offload_optimizer.pin_memory);
    groups_ = make_sub_groups(owned_len, std::max<std::int64_t>(1, z.sub_group_size));
    std::vector<std::vector<offload::SwapSegment>> segs;
    for (std::size_t g = 0; g < groups_.size(); ++g) {
      std::vector<offload::SwapSegment> s;
      for (int k = 0; k <= moments_; ++k)
        s.push_back({key(g, k), static_cast<std::size_t>(groups_[g].len) * sizeof(float)});
      segs.push_back(std::move(s));
    }
    pipe_ = std::make_unique<offload::SwapPipeline>(*swapper_, *pool_, std::move(segs));
  }
  offload::NvmeSwapper* swapper() override { return swapper_.get(); }
  void write_master(int unit, const float* owned) override {
    // Initial state: master from the caller, moments zero. Written group by group.
    for_unit_groups(unit, [&](std::size_t g, std::int64_t begin, std::size_t bytes, void* buf) {
      std::memcpy(buf, owned + begin, bytes);
      swapper_->write_async(key(g, 0), buf, bytes).wait();
      std::memset(buf, 0, bytes);
      for (int k = 1; k <= moments_; ++k) swapper_->write_async(key(g, k), buf, bytes).wait();
    });
  }
  void read_master(int unit, float* owned) override { read_tensor(unit, 0, owned); }
  void read_moment(int unit, int which, float* owned) override { read_tensor(unit, which + 1, owned); }
  void write_moment(int unit, int which, const float* owned) override {
    for_unit_groups(unit, [&](std::size_t g, std::int64_t begin, std::size_t bytes, void* buf) {
      std::memcpy(buf, owned + begin, bytes);
      swapper_->write_async(key(g, which + 1), buf, bytes).wait();
    });
  }
  void for_each(const Visit& fn) override {
    pipe_->run(offload::SwapPipeline::Mode::read_write, [&](std::size_t g, offload::SwapGroupView& v) {
      const SubGroup& sg = groups_[g];
      float* state[kMaxMoments] = {};
      for (int k = 0; k < moments_; ++k) state[k] = v.as<float>(k + 1);
      fn(sg.unit, sg.begin, sg.len, v.as<float>(0), state);
    });
  }
  bool on_host() const override { return true; }
  void report(MemoryReport& r) const override {
    r.offloaded_nvme += static_cast<std::int64_t>(swapper_->bytes_reserved());
    r.offloaded_host += static_cast<std::int64_t>(pool_->bytes_reserved());
  }

 private:
  // Keys carry an instance number: two engines of one process (a resumed copy beside the
  // original, say) share the rank directory but must never share files.
  std::string key(std::size_t group, int k) const {
    static const char* names[1 + kMaxMoments] = {"master", "m", "v", "s"};
    char buf[64];  // (snprintf: GCC 12 at -O3 misreports string concatenation here as -Wrestrict)
    std::snprintf(buf, sizeof buf, "e%d_sg%zu_%s", instance_, group, names[k]);
    return buf;
  }
  static inline std::atomic<int> next_instance_{0};
  int instance_ = next_instance_++;
  template <class F>
  void for_unit_groups(int unit, F&& f) {
    for (std::size_t g = 0; g < groups_.size(); ++g) {
      if (groups_[g].unit != unit) continue;
      std::size_t bytes = static_cast<std::size_t>(groups_[g].len) * sizeof(float);
      offload::PinnedBuffer buf = pool_->acquire(bytes);
      f(g, groups_[g].begin, bytes, buf.data());
    }
  }
  void read_tensor(int unit, int k, float* owned) {
    ZERO_CHECK(k <= moments_, fmt::format("optimizer moment {} does not exist for this optimizer", k - 1));
    for_unit_groups(unit, [&](std::size_t g, std::int64_t begin, std::size_t bytes, void* buf) {
      swapper_->read_async(key(g, k), buf, bytes).wait();
      std::memcpy(owned + begin, buf, bytes);
    });
  }

  std::vector<SubGroup> groups_;
  std::unique_ptr<offload::NvmeSwapper> swapper_;
  std::unique_ptr<offload::PinnedPool> pool_;
  std::unique_ptr<offload::SwapPipeline> pipe_;
};

}  // namespace

std::unique_ptr<OptimizerStore> make_optimizer_store(Backend& backend, const Config& cfg, int rank, int moments,
                                                     const std::vector<std::int64_t>& owned_len) {
  ZERO_CHECK(moments >= 0 && moments <= kMaxMoments,
             fmt::format("an optimizer store keeps 0 to {} moments, not {}", kMaxMoments, moments));
  switch (cfg.zero_optimization.offload_optimizer.device) {
    case OffloadDevice::none: return std::make_unique<ResidentStore>(backend, cfg, moments, owned_len, false);
    case OffloadDevice::cpu: return std::make_unique<ResidentStore>(backend, cfg, moments, owned_len, true);
    case OffloadDevice::nvme: return std::make_unique<NvmeStore>(cfg, rank, moments, owned_len);
  }
  ZERO_THROW("offload_optimizer.device has an unknown value");
}

}  // namespace zero
