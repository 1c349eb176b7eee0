// Strict reading of YAML sections, the machinery behind zero::Config, public so an application
// validates its own sections (a trainer's model / data / run) the same way: unread keys are errors.
// Only forward-declares YAML::Node; see docs/architecture.md, note strict-sections.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace YAML {
class Node;
}

namespace zero {

struct Config;

// Where a key was set, by full key path ("model.n_layer" -> "run.yaml:7", or
// "--set model.n_layer=4"). Consulted before the YAML marks, for the key and, failing that,
// for its closest listed ancestor (an override that replaced a whole subtree).
using KeyLocations = std::map<std::string, std::string>;

// Bounds of a real-valued setting; describe() gives the text messages use ("> 0", "in [0, 1)").
struct Range {
  double lo = -std::numeric_limits<double>::infinity();
  double hi = std::numeric_limits<double>::infinity();
  bool lo_open = false;
  bool hi_open = false;

  static Range at_least(double lo) { return {lo, std::numeric_limits<double>::infinity(), false, false}; }
  static Range above(double lo) { return {lo, std::numeric_limits<double>::infinity(), true, false}; }
  static Range closed(double lo, double hi) { return {lo, hi, false, false}; }
  static Range closed_open(double lo, double hi) { return {lo, hi, false, true}; }

  bool contains(double v) const;
  std::string describe() const;
};

class StrictSection {
 public:
  // `node` must be a mapping (null or undefined reads as an empty one). `key_path` is the
  // section's own path ("" at the top level), `origin` the file or text name for messages.
  // Throws zero::Error when the node is not a mapping or a key appears twice.
  StrictSection(const YAML::Node& node, std::string key_path, std::string origin,
                std::shared_ptr<const KeyLocations> locations = nullptr);
  ~StrictSection();
  StrictSection(StrictSection&&) noexcept;
  StrictSection& operator=(StrictSection&&) noexcept;
  StrictSection(const StrictSection&) = delete;
  StrictSection& operator=(const StrictSection&) = delete;

  const std::string& key_path() const;
  const std::string& origin() const;
  // "key_path.key" ("key" at the top level).
  std::string path_of(std::string_view key) const;
  // Where `key` was set ("file:line", an override string, or the section's place if absent).
  std::string where(std::string_view key) const;

  // Every accessor below makes `key` known to finish() and to the did-you-mean hint.
  bool has(std::string_view key);
  // True when the value is the string "auto" (DeepSpeed's "fill this in for me").
  bool is_auto(std::string_view key);
  // Marks `key` as known without reading it (the caller reads it another way, or ignores it
  // on purpose).
  void allow(std::string_view key);
  // A key that must not appear (a setting of another tool, or one that does not apply to the
  // chosen option); finish() fails with `why` if it does. Never offered as a suggestion.
  void reject(std::string_view key, std::string_view why);

  // Getters return `def` when the key is absent. Integers accept "5e8" (a whole number in any
  // notation) and reject 5.5; bounds are inclusive. A null value is an error, not a default.
  std::int64_t get_int(std::string_view key, std::int64_t def,
                       std::int64_t min = std::numeric_limits<std::int64_t>::min(),
                       std::int64_t max = std::numeric_limits<std::int64_t>::max());
  double get_double(std::string_view key, double def, const Range& range = {});
  // true/false (yes/no, on/off also read as YAML 1.1 does).
  bool get_bool(std::string_view key, bool def);
  std::string get_string(std::string_view key, const std::string& def);
  // One of `choices`; returns the spelling in `choices` (so case-insensitive matching gives
  // the canonical name).
  std::string get_choice(std::string_view key, const std::string& def, const std::vector<std::string>& choices,
                         bool ignore_case = false);
  // A list of exactly `count` numbers (count 0: any length), each within `each`.
  std::vector<double> get_doubles(std::string_view key, const std::vector<double>& def, std::size_t count,
                                  const Range& each = {});
  // The nested mapping under `key`; nullopt when absent or null.
  std::optional<StrictSection> sub(std::string_view key);
  // Same, but an empty section when absent, so defaults apply with the same code path.
  StrictSection section(std::string_view key);
  // The value as it is, for shapes the getters do not cover; a null node when absent.
  YAML::Node raw(std::string_view key);

  // Throws zero::Error "<where>: <path> <problem>"; `problem` continues the sentence
  // ("is larger than n_embd; ...", "= 7 needs ...").
  [[noreturn]] void fail(std::string_view key, std::string_view problem) const;
  // The keys no accessor asked for that are no near miss of a known key (finish() would offer
  // no "did you mean") and for which `eligible` holds: marked known, so finish() passes them
  // over, and returned. For DeepSpeed's JSON config, whose top-level keys DeepSpeed ignores
  // when it does not know them. Call after reading everything, before finish().
  std::vector<std::string> take_unknown_without_near_miss(const std::function<bool(const std::string&)>& eligible);
  // Fails on the first key that no accessor asked for (or that was rejected), naming its
  // path, place, and the closest known key. Call after reading everything.
  void finish();
  // The same, but every problem is appended to `errors` (one message each) instead of thrown,
  // so a loader can report all problems of a file at once; `first_only` stops at the first.
  void finish(std::vector<std::string>& errors, bool first_only = false);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Parses YAML or JSON text (one document). Syntax errors become zero::Error with
// origin:line:column.
YAML::Node parse_yaml(const std::string& text, const std::string& origin);

// An application section kept in Config::extra_sections, parsed back into a node (an empty
// mapping when the file did not have it).
YAML::Node extra_section_node(const Config& cfg, const std::string& name);
// The same wrapped in a StrictSection whose messages point at the line (or --set) that gave
// each key. Typical use:
//   auto model = zero::extra_section(cfg, "model");
//   int n_layer = int(model.get_int("n_layer", 12, 1, 1024));
//   model.finish();
StrictSection extra_section(const Config& cfg, const std::string& name);

}  // namespace zero
