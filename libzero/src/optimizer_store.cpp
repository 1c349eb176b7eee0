#include "optimizer_store.hpp"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "engine_impl.hpp"
#include "zero/error.hpp"

namespace zero {

namespace {

// Owned state held in memory the CPU can address directly: backend memory on the host backend
// (offload "none") or host memory (offload "cpu"). Only the chunking differs: the offload path
// steps sub_group_size elements at a time, which the element-wise update makes bit-identical.
class ResidentStore final : public OptimizerStore {
 public:
  ResidentStore(EngineImpl& e, bool offloaded) : e_(e), offloaded_(offloaded) {
    moments_ = e.cfg_.optimizer.type == OptimizerType::sgd ? 1 : 2;
    sub_group_ = offloaded ? std::max<std::int64_t>(1, e.cfg_.zero_optimization.sub_group_size) : INT64_MAX;
    for (const auto& u : e.units_) {
      std::size_t bytes = static_cast<std::size_t>(u.own_len) * sizeof(float);
      State s;
      s.master = e.backend_->alloc(bytes);
      s.m1 = e.backend_->alloc(bytes);
      if (moments_ == 2) s.m2 = e.backend_->alloc(bytes);
      state_.push_back(std::move(s));
    }
  }
  void write_master(int unit, const float* owned) override {
    auto& s = state_[static_cast<std::size_t>(unit)];
    std::memcpy(s.master.get(), owned, s.master.bytes());
  }
  void read_master(int unit, float* owned) override {
    auto& s = state_[static_cast<std::size_t>(unit)];
    std::memcpy(owned, s.master.get(), s.master.bytes());
  }
  void read_moment(int unit, int which, float* owned) override {
    auto& b = moment(unit, which);
    std::memcpy(owned, b.get(), b.bytes());
  }
  void write_moment(int unit, int which, const float* owned) override {
    auto& b = moment(unit, which);
    std::memcpy(b.get(), owned, b.bytes());
  }
  void for_each(const Visit& fn) override {
    for (std::size_t i = 0; i < state_.size(); ++i) {
      auto& s = state_[i];
      std::int64_t len = e_.units_[i].own_len;
      for (std::int64_t b = 0; b < len; b += sub_group_) {
        std::int64_t n = std::min(sub_group_, len - b);
        fn(static_cast<int>(i), b, n, s.master.as<float>() + b, s.m1.as<float>() + b,
           s.m2 ? s.m2.as<float>() + b : nullptr);
      }
    }
  }
  void report(MemoryReport& r) const override {
    std::int64_t master = 0, opt = 0;
    for (const auto& s : state_) {
      master += static_cast<std::int64_t>(s.master.bytes());
      opt += static_cast<std::int64_t>(s.m1.bytes() + s.m2.bytes());
    }
    if (offloaded_) {
      r.offloaded_host += master + opt;
    } else {
      r.master += master;
      r.optimizer += opt;
    }
  }

 private:
  struct State {
    Buffer master, m1, m2;
  };
  Buffer& moment(int unit, int which) {
    auto& s = state_[static_cast<std::size_t>(unit)];
    ZERO_CHECK(which >= 0 && which < moments_, "optimizer moment " + std::to_string(which) + " does not exist");
    return which == 0 ? s.m1 : s.m2;
  }
  EngineImpl& e_;
  bool offloaded_;
  std::int64_t sub_group_;
  std::vector<State> state_;
};

}  // namespace

std::unique_ptr<OptimizerStore> make_optimizer_store(EngineImpl& e) {
  switch (e.cfg_.zero_optimization.offload_optimizer.device) {
    case OffloadDevice::none: return std::make_unique<ResidentStore>(e, false);
    case OffloadDevice::cpu: return std::make_unique<ResidentStore>(e, true);
    case OffloadDevice::nvme: break;
  }
  ZERO_THROW("offload_optimizer.device: nvme is not available in this build yet");
}

}  // namespace zero
