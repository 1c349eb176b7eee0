// The loop's views of engine storage: TensorRef, and the UnitParams, UnitGrads and GatheredModel
// handles zero::Engine hands out (zero/engine.hpp).
#include <fmt/format.h>

#include <string>
#include <string_view>
#include <utility>

#include "engine/engine_impl.hpp"
#include "zero/engine.hpp"
#include "zero/error.hpp"

namespace zero {

float* TensorRef::f32() const {
  ZERO_CHECK(dtype == DType::f32, "TensorRef::f32: the tensor " + (info ? "'" + info->name + "' " : std::string()) +
                                      "holds " + std::string(dtype_name(dtype)) + ", not fp32");
  return static_cast<float*>(data);
}

static TensorRef make_ref(const UnitInfo& ui, void* base, DType t, int param) {
  ZERO_CHECK(param >= 0 && param < static_cast<int>(ui.params.size()),
             fmt::format("unit '{}' has no parameter #{} (it has {})", ui.name, param, ui.params.size()));
  const ParamInfo& p = ui.params[static_cast<std::size_t>(param)];
  return TensorRef{static_cast<char*>(base) + static_cast<std::size_t>(p.offset) * dtype_size(t), t, p.numel, &p};
}

static int param_index(const UnitInfo& ui, std::string_view name) {
  int i = ui.find_param(name);
  if (i < 0) {
    std::string names;
    for (const auto& p : ui.params) names += (names.empty() ? "" : ", ") + p.name;
    ZERO_THROW("unit '" + ui.name + "' has no parameter '" + std::string(name) + "' (it has: " + names + ")");
  }
  return i;
}

UnitParams::UnitParams(UnitParams&& o) noexcept { *this = std::move(o); }
UnitParams& UnitParams::operator=(UnitParams&& o) noexcept {
  if (this != &o) {
    release();
    engine_ = o.engine_;
    unit_ = o.unit_;
    data_ = o.data_;
    token_ = o.token_;
    o.engine_ = nullptr;
    o.data_ = nullptr;
    o.unit_ = -1;
  }
  return *this;
}
UnitParams::~UnitParams() { release(); }
void UnitParams::release() {
  if (engine_) {
    EngineImpl* e = engine_;
    engine_ = nullptr;
    e->release(unit_, token_);
  }
  data_ = nullptr;
}
TensorRef UnitParams::operator[](int param) const {
  ZERO_CHECK(engine_ != nullptr, "UnitParams: the handle is empty (released or moved from)");
  return make_ref(engine_->layout().unit(unit_), data_, engine_->dtype(), param);
}
TensorRef UnitParams::operator[](std::string_view name) const {
  ZERO_CHECK(engine_ != nullptr, "UnitParams: the handle is empty (released or moved from)");
  const UnitInfo& ui = engine_->layout().unit(unit_);
  return make_ref(ui, data_, engine_->dtype(), param_index(ui, name));
}
TensorRef UnitGrads::operator[](int param) const { return make_ref(*unit_, data_, dtype_, param); }
TensorRef UnitGrads::operator[](std::string_view name) const {
  return make_ref(*unit_, data_, dtype_, param_index(*unit_, name));
}

GatheredModel& GatheredModel::operator=(GatheredModel&& o) noexcept {
  if (this != &o) {
    release();
    engine_ = o.engine_;
    was_eval_ = o.was_eval_;
    o.engine_ = nullptr;
  }
  return *this;
}

void GatheredModel::release() {
  if (EngineImpl* e = std::exchange(engine_, nullptr)) e->release_all(was_eval_);
}

}  // namespace zero
