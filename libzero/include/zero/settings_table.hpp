// An application's own config sections as a table, one row per key giving its default, strict
// reading, resolved value, --help line and documented row (docs/architecture.md, note
// strict-sections).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "zero/config.hpp"
#include "zero/config_schema.hpp"

namespace zero {

// The member a key reads into: integer (int, int64, uint64), real, flag, or string.
using SettingSlot = std::variant<int*, std::int64_t*, std::uint64_t*, double*, bool*, std::string*>;
// A fixed default, of the member's kind; none where `dynamic_default` or a key read before sets it.
using SettingValue = std::variant<std::monostate, std::int64_t, double, bool, std::string_view>;

template <class S>
struct SettingKey {
  std::string_view section;           // "model"
  std::string_view name;              // "n_layer"
  SettingSlot (*slot)(S&) = nullptr;  // null for a retired key
  SettingValue def{};
  Range range{};                       // integers and reals
  std::vector<std::string> choices{};  // a string member limited to these
  std::string doc{};                   // one line for --help and the documented table
  std::string_view default_text{};     // shown instead of `def` where it is not fixed (Markdown)
  // Sets the default from the keys read before (out_dir: runs/<preset>).
  void (*dynamic_default)(S&) = nullptr;
  // Runs once the key is read (a preset expands into the shape that the keys after it override).
  void (*then)(S&) = nullptr;
  // What is wrong with the value read ("" when nothing), continuing "data.train ...".
  std::string (*check)(const S&) = nullptr;
  // True when the resolved section leaves the key out (an optional path left empty).
  bool (*omitted)(const S&) = nullptr;
  // A key that no longer exists: giving it is an error that says why and what replaced it.
  std::string_view retired{};
};

// What the table does with one row, independent of the settings type.
namespace setting_text {
// Stores `def` into the member; a default of another kind is an error naming `key`.
void assign(SettingSlot slot, const SettingValue& def, std::string_view key);
// Reads `name` strictly into the member, keeping its current value when absent.
void read(StrictSection& section, std::string_view name, SettingSlot slot, const Range& range,
          const std::vector<std::string>& choices);
// The value as the resolved section writes it: a free string double-quoted (paths, globs), a
// choice as it is, a real in its shortest exact form.
std::string value(SettingSlot slot, bool is_choice);
// "integer 1..4096", "number > 0", "bool", "string", or the choices ("`a` \| `b`").
std::string type(SettingSlot slot, const Range& range, const std::vector<std::string>& choices);
// The default as shown: `text` when given, else the value (a quoted string unquoted).
std::string default_value(SettingSlot slot, bool is_choice, std::string_view text);
// One --help line: "  name: default" then the doc wrapped under a column.
std::string help_line(std::string_view name, const std::string& default_text, const std::string& doc);
}  // namespace setting_text

// The rows in reading order: a key's default may follow a key read before it.
template <class S>
class SettingsTable {
 public:
  explicit SettingsTable(std::vector<SettingKey<S>> keys) : keys_(std::move(keys)) {
    for (const SettingKey<S>& k : keys_)
      if (sections_.empty() || sections_.back() != k.section) sections_.emplace_back(k.section);
  }

  const std::vector<SettingKey<S>>& keys() const { return keys_; }
  // The section names, in table order (each section's rows are contiguous).
  const std::vector<std::string>& sections() const { return sections_; }

  // Every default, in reading order. Call from S's default constructor.
  void set_defaults(S& s) const {
    for (const SettingKey<S>& k : keys_) {
      if (!k.retired.empty()) continue;
      if (k.dynamic_default) k.dynamic_default(s);
      if (!std::holds_alternative<std::monostate>(k.def)) setting_text::assign(k.slot(s), k.def, k.name);
      if (k.then) k.then(s);
    }
  }

  // Reads the rows of section.key_path() into s; the caller applies its rules over several keys
  // and then calls section.finish().
  void read(StrictSection& section, S& s) const {
    for (const SettingKey<S>& k : keys_) {
      if (k.section != section.key_path()) continue;
      if (!k.retired.empty()) {
        section.reject(k.name, k.retired);
        continue;
      }
      if (k.dynamic_default) k.dynamic_default(s);
      setting_text::read(section, k.name, k.slot(s), k.range, k.choices);
      if (k.then) k.then(s);
      if (k.check)
        if (const std::string problem = k.check(s); !problem.empty()) section.fail(k.name, problem);
    }
  }

  // Each section as a YAML mapping with every value resolved, in the form
  // Config::extra_sections keeps them ("model" -> "preset: tiny\nn_layer: 4\n...").
  std::map<std::string, std::string> resolved(const S& settings) const {
    auto& s = const_cast<S&>(settings);  // slots only read here
    std::map<std::string, std::string> out;
    for (const SettingKey<S>& k : keys_) {
      if (!k.retired.empty() || (k.omitted && k.omitted(settings))) continue;
      out[std::string(k.section)] +=
          std::string(k.name) + ": " + setting_text::value(k.slot(s), !k.choices.empty()) + "\n";
    }
    return out;
  }

  // Every live key by section, with its default and meaning, for --help.
  std::string help() const {
    std::string out;
    std::string_view section;
    S probe;
    for (const SettingKey<S>& k : keys_) {
      if (!k.retired.empty()) continue;
      if (k.section != section) out += std::string(section = k.section) + ":\n";
      out += setting_text::help_line(k.name, default_text(k, probe), k.doc);
    }
    return out;
  }

  // The documented table (key, type, default, meaning), then the retired keys.
  std::string markdown() const {
    std::string out = "| Key | Type | Default | Meaning |\n|---|---|---|---|\n", retired;
    S probe;
    for (const SettingKey<S>& k : keys_) {
      const std::string key = std::string(k.section) + "." + std::string(k.name);
      if (!k.retired.empty()) {
        retired += "- `" + key + "` " + std::string(k.retired) + "\n";
        continue;
      }
      std::string def = default_text(k, probe);
      if (k.default_text.empty()) def = "`" + def + "`";
      out += "| `" + key + "` | " + setting_text::type(k.slot(probe), k.range, k.choices) + " | " + def + " | " +
             k.doc + " |\n";
    }
    return retired.empty() ? out : out + "\nRetired keys, errors that say what replaced them:\n\n" + retired;
  }

 private:
  // `probe`: default-constructed settings, whose members hold the defaults.
  static std::string default_text(const SettingKey<S>& k, S& probe) {
    return setting_text::default_value(k.slot(probe), !k.choices.empty(), k.default_text);
  }

  std::vector<SettingKey<S>> keys_;
  std::vector<std::string> sections_;
};

}  // namespace zero
