#include "config/tree.hpp"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <vector>

#include "config/keys.hpp"
#include "runtime/strings.hpp"
#include "zero/error.hpp"

namespace zero {

namespace {

std::string trim(std::string_view s) {
  auto b = s.find_first_not_of(" \t");
  if (b == std::string_view::npos) return "";
  auto e = s.find_last_not_of(" \t");
  return std::string(s.substr(b, e - b + 1));
}

}  // namespace

void apply_override(YAML::Node root, const std::string& text, KeyLocations& locations) {
  const std::string origin = "--set " + escape_bytes(text);
  auto eq = text.find('=');
  if (eq == std::string::npos) {
    throw Error(origin + ": expected key.path=value (for example zero_optimization.stage=3)");
  }
  std::string path = trim(std::string_view(text).substr(0, eq));
  std::string value = trim(std::string_view(text).substr(eq + 1));
  std::vector<std::string> parts;
  for (std::size_t start = 0;;) {
    auto dot = path.find('.', start);
    parts.push_back(path.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  for (const auto& p : parts) {
    if (p.empty()) {
      throw Error(origin + ": the key path '" + escape_bytes(path) +
                  "' has an empty part; write it like zero_optimization.stage=3");
    }
  }
  YAML::Node v = parse_yaml(value, origin);

  YAML::Node cur = root;
  std::string so_far;
  for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
    so_far += (so_far.empty() ? "" : ".") + parts[i];
    const YAML::Node& view = cur;  // const lookup: does not insert the key
    YAML::Node child = view[parts[i]];
    if (!child.IsDefined() || child.IsNull()) {
      cur[parts[i]] = YAML::Node(YAML::NodeType::Map);
      locations[so_far] = origin;
    } else if (!child.IsMap()) {
      throw Error(origin + ": " + escape_bytes(so_far) + " is a value, not a section, so it has no key '" +
                  escape_bytes(parts[i + 1]) + "'; check the key path");
    }
    cur.reset(cur[parts[i]]);
  }
  cur[parts.back()] = v;
  locations[path] = origin;
}

void LocationRecorder::record(const YAML::Node& n, const std::string& path) {
  const std::size_t total = visit(n, path, "");
  if (total > kMaxExpandedValues) {
    throw Error(
        fmt::format("{}: {} expands to {}+ values through YAML aliases (*name), more than "
                    "the {} a configuration may hold; write the values out or use fewer "
                    "aliases",
                    out_.at(path), escape_bytes(path), total, kMaxExpandedValues));
  }
}

// Expanded size of `n` (values, counting repeats through aliases), saturating above the cap.
// Nodes are told apart by their place in the text they were parsed from: the file, or the
// --set (`owner`) whose value holds them.
std::size_t LocationRecorder::visit(const YAML::Node& n, const std::string& path, std::string owner) {
  if (overrides_.count(path)) owner = path;
  if (!n.IsMap() && !n.IsSequence()) return 1;
  const YAML::Mark m = n.Mark();
  const NodeId id{owner, {m.pos, m.line}};
  if (!m.is_null()) {
    if (auto it = sizes_.find(id); it != sizes_.end()) return it->second;
    // An alias inside the node it names (`model: &m {self: *m}`) makes the tree a cycle, which
    // every later walk would follow forever.
    if (!open_.insert(id).second) {
      throw Error(where(path, m) + ": " + escape_bytes(path) +
                  " refers to a YAML anchor that contains it (an alias *name inside &name's own value); a "
                  "configuration must be a tree: write the value out instead");
    }
  }
  std::size_t total = 1;
  auto add = [&](std::size_t k) { total = std::min(kMaxExpandedValues + 1, total + k); };
  if (n.IsMap()) {
    for (auto it = n.begin(); it != n.end(); ++it) {
      if (!it->first.IsScalar()) continue;
      std::string p = path + "." + it->first.Scalar();
      out_[p] = where(p, it->first.Mark());
      add(visit(it->second, p, owner));
    }
  } else {
    for (std::size_t i = 0; i < n.size(); ++i) {
      add(visit(n[i], fmt::format("{}[{}]", path, i), owner));
    }
  }
  if (!m.is_null()) {
    open_.erase(id);
    sizes_[id] = total;
  }
  return total;
}

std::string LocationRecorder::where(const std::string& p, const YAML::Mark& m) const {
  for (std::string q = p; !q.empty();) {
    if (auto it = overrides_.find(q); it != overrides_.end()) return it->second;
    auto cut = q.find_last_of(".[");
    q = cut == std::string::npos ? std::string() : q.substr(0, cut);
  }
  return m.is_null() ? origin_ : fmt::format("{}:{}", origin_, m.line + 1);
}

void normalize_deepspeed_forms(YAML::Node root, const std::string& origin, KeyLocations& locations) {
  if (!root.IsMap()) return;
  const YAML::Node& view = root;
  if (YAML::Node z = view["zero_optimization"]; z.IsDefined() && z.IsScalar()) {
    const std::string v = lower_ascii(z.Scalar());
    if (v == "true" || v == "false") {
      YAML::Node m(YAML::NodeType::Map);
      m["stage"] = v == "true" ? 1 : 0;
      root["zero_optimization"] = m;
    }
  }
  for (const auto& a : keys::section_aliases()) {
    const std::string name(a.path), alias(a.alias);
    YAML::Node given = view[alias];
    if (!given.IsDefined()) continue;
    // DeepSpeed reads bfloat16 when bf16 is null (precision_config.py), so a null bf16 gives way.
    if (view[name].IsDefined() && !view[name].IsNull()) {
      throw Error(origin + ": " + alias + " and " + name +
                  " are the same section (DeepSpeed's two spellings); keep one");
    }
    for (auto it = root.begin(); it != root.end(); ++it) {
      if (it->first.Scalar() == alias && !it->first.Mark().is_null()) {
        locations[name] = fmt::format("{}:{}", origin, it->first.Mark().line + 1);
      }
    }
    root[name] = given;
    root.remove(alias);
  }
}

}  // namespace zero
