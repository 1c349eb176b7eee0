#include "zero/layout.hpp"

#include <fmt/format.h>

#include <string>

#include "runtime/strings.hpp"
#include "zero/error.hpp"

namespace zero {

int UnitInfo::find_param(std::string_view n) const {
  for (std::size_t i = 0; i < params.size(); ++i)
    if (params[i].name == n) return static_cast<int>(i);
  return -1;
}

int Layout::add_unit(std::string name, std::vector<std::pair<std::string, Shape>> params) {
  ZERO_CHECK(!name.empty(), "Layout::add_unit: a unit needs a name");
  for (const auto& u : units_)
    ZERO_CHECK(u.name != name, "Layout::add_unit: unit '" + name + "' is declared twice; unit names must be unique");
  ZERO_CHECK(!params.empty(), "Layout::add_unit: unit '" + name + "' has no parameters");
  UnitInfo u;
  u.name = std::move(name);
  for (auto& [pname, shape] : params) {
    ZERO_CHECK(u.find_param(pname) < 0,
               "Layout::add_unit: parameter '" + pname + "' appears twice in unit '" + u.name + "'");
    ZERO_CHECK(!shape.empty(),
               "Layout::add_unit: parameter '" + pname + "' in unit '" + u.name + "' has an empty shape");
    std::int64_t n = 1;
    for (auto d : shape) {
      ZERO_CHECK(d > 0, fmt::format("Layout::add_unit: parameter '{}' in unit '{}' has a non-positive dimension {}",
                                    pname, u.name, d));
      n *= d;
    }
    u.params.push_back(ParamInfo{pname, shape, n, u.numel, true, u.name});
    u.numel += n;
  }
  units_.push_back(std::move(u));
  return static_cast<int>(units_.size()) - 1;
}

const UnitInfo& Layout::unit(int id) const {
  ZERO_CHECK(id >= 0 && id < num_units(), fmt::format("unknown unit id {} (the layout has {} units)", id, num_units()));
  return units_[static_cast<std::size_t>(id)];
}

int Layout::find_unit(std::string_view name) const {
  std::vector<std::string> names;
  for (std::size_t i = 0; i < units_.size(); ++i) {
    if (units_[i].name == name) return static_cast<int>(i);
    names.push_back(units_[i].name);
  }
  ZERO_THROW("unknown unit '" + std::string(name) + "'" + did_you_mean(name, names));
}

ParamInfo& Layout::param(int id, std::string_view param, const char* what) {
  unit(id);  // range check with its message
  UnitInfo& u = units_[static_cast<std::size_t>(id)];
  const int k = u.find_param(param);
  if (k < 0) {
    std::vector<std::string> names;
    for (const auto& p : u.params) names.push_back(p.name);
    ZERO_THROW(std::string(what) + ": unit '" + u.name + "' has no parameter '" + std::string(param) + "'" +
               did_you_mean(param, names));
  }
  return u.params[static_cast<std::size_t>(k)];
}

void Layout::set_decay(int id, std::string_view p, bool decay) { param(id, p, "Layout::set_decay").decay = decay; }

void Layout::set_replicated(int id, std::string_view p, bool replicated) {
  param(id, p, "Layout::set_replicated").replicated = replicated;
}

void Layout::set_embedding(int id, std::string_view p, bool embedding) {
  param(id, p, "Layout::set_embedding").embedding = embedding;
}

void Layout::set_norm_counted_elsewhere(int id, std::string_view p, bool elsewhere) {
  param(id, p, "Layout::set_norm_counted_elsewhere").norm_counted_elsewhere = elsewhere;
}

void Layout::set_split(int id, std::string_view p, int axis, int blocks) {
  ParamInfo& info = param(id, p, "Layout::set_split");
  ZERO_CHECK(axis >= 0 && axis < static_cast<int>(info.shape.size()),
             fmt::format("Layout::set_split: parameter '{}' of unit '{}' has {} dimensions, so axis {} does not exist",
                         info.name, info.unit, info.shape.size(), axis));
  ZERO_CHECK(blocks >= 1 && info.shape[static_cast<std::size_t>(axis)] % blocks == 0,
             fmt::format("Layout::set_split: parameter '{}' of unit '{}' has {} elements along axis {}, which {} "
                         "blocks do not divide",
                         info.name, info.unit, info.shape[static_cast<std::size_t>(axis)], axis, blocks));
  info.split_axis = axis;
  info.split_blocks = blocks;
}

void Layout::decay_matrices_only() {
  for (auto& u : units_)
    for (auto& p : u.params) p.decay = p.shape.size() >= 2;
}

std::int64_t Layout::num_params() const {
  std::int64_t n = 0;
  for (const auto& u : units_) n += u.numel;
  return n;
}

std::int64_t Layout::slice_numel(int id, int world) const {
  std::int64_t n = unit(id).numel;
  std::int64_t per = (n + world - 1) / world;
  return (per + kSliceAlign - 1) / kSliceAlign * kSliceAlign;
}

}  // namespace zero
