// Edits to a parsed config tree before its keys are read: the --set overrides, DeepSpeed's
// older forms rewritten to the current ones, and the record of where every key of an
// application section was set (its text is re-emitted, so its own line numbers mean nothing).
#pragma once

#include <cstddef>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "zero/config_schema.hpp"

namespace YAML {
class Node;
struct Mark;
}  // namespace YAML

namespace zero {

// Values an application section may expand to through YAML aliases (an alias bomb of a few
// hundred bytes expands to billions).
constexpr std::size_t kMaxExpandedValues = std::size_t(1) << 20;

// Sets `root[path] = value` for one "a.b.c=value" override, creating sections on the way.
// The paths it creates or replaces are recorded in `locations`, so a message about them names
// the override rather than a line of the file.
void apply_override(YAML::Node root, const std::string& text, KeyLocations& locations);

// A boolean zero_optimization (true: stage 1, false: stage 0, as DeepSpeed reads it) and the
// section aliases of config/keys.hpp (bfloat16 for bf16), rewritten in place.
void normalize_deepspeed_forms(YAML::Node root, const std::string& origin, KeyLocations& locations);

// Records where every key of an application section was set. A node reached again through a
// YAML alias is visited once (its keys keep the location of the first path; a later path falls
// back to its alias's line), so the walk is linear in the text. The size the section expands
// to is counted with the same memo and capped: an application that walks the whole section
// would otherwise take exponential time on an alias bomb.
class LocationRecorder {
 public:
  LocationRecorder(std::string origin, const KeyLocations& overrides, KeyLocations& out)
      : origin_(std::move(origin)), overrides_(overrides), out_(out) {}
  // Throws zero::Error when the section expands to more than kMaxExpandedValues values.
  void record(const YAML::Node& n, const std::string& path);

 private:
  std::size_t visit(const YAML::Node& n, const std::string& path, std::string owner);
  std::string where(const std::string& p, const YAML::Mark& m) const;

  std::string origin_;
  const KeyLocations& overrides_;
  KeyLocations& out_;
  using NodeId = std::pair<std::string, std::pair<int, int>>;
  std::map<NodeId, std::size_t> sizes_;
  std::set<NodeId> open_;  // nodes whose children are being visited: meeting one again is a cycle
};

}  // namespace zero
