#include "zero/config_schema.hpp"

#include <fmt/format.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <set>
#include <sstream>
#include <utility>

#include "runtime/strings.hpp"
#include "zero/config.hpp"
#include "zero/error.hpp"

namespace zero {

namespace {

// A whole-string decimal number. std::from_chars takes no leading '+' and reads "inf"/"nan",
// neither of which a setting wants.
std::optional<double> parse_real(std::string_view s) {
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  if (s.empty()) return std::nullopt;
  double v = 0;
  auto r = std::from_chars(s.data(), s.data() + s.size(), v);
  if (r.ec != std::errc() || r.ptr != s.data() + s.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

// Parent of a key path: "a.b[2]" -> "a.b", "a.b" -> "a", "a" -> "".
std::string parent_path(const std::string& p) {
  if (!p.empty() && p.back() == ']') {
    auto open = p.rfind('[');
    if (open != std::string::npos) return p.substr(0, open);
  }
  auto dot = p.rfind('.');
  return dot == std::string::npos ? std::string() : p.substr(0, dot);
}

std::string join(const std::vector<std::string>& items, const char* sep) {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : sep) + s;
  return out;
}

}  // namespace

bool Range::contains(double v) const {
  bool lo_ok = lo_open ? v > lo : v >= lo;
  bool hi_ok = hi_open ? v < hi : v <= hi;
  return lo_ok && hi_ok;
}

std::string Range::describe() const {
  bool has_lo = std::isfinite(lo), has_hi = std::isfinite(hi);
  if (has_lo && has_hi) {
    return std::string("in ") + (lo_open ? "(" : "[") + shortest_text(lo) + ", " + shortest_text(hi) +
           (hi_open ? ")" : "]");
  }
  if (has_lo) return (lo_open ? "> " : ">= ") + shortest_text(lo);
  if (has_hi) return (hi_open ? "< " : "<= ") + shortest_text(hi);
  return "any value";
}

struct StrictSection::Impl {
  struct Entry {
    std::string key;
    YAML::Node key_node;
    YAML::Node value;
    bool used = false;
  };
  YAML::Node node;
  std::string path;
  std::string origin;
  std::shared_ptr<const KeyLocations> locations;
  std::vector<Entry> entries;
  std::vector<std::string> known;                            // candidates for "did you mean"
  std::map<std::string, std::string, std::less<>> rejected;  // key -> why
  // For a nested section: where its key sits in the parent (the mapping's own mark points at
  // its first child, which is the wrong line for "missing here" messages).
  std::string self_where;

  Entry* find(std::string_view key) {
    for (auto& e : entries)
      if (e.key == key) return &e;
    return nullptr;
  }
  const Entry* find(std::string_view key) const {
    for (const auto& e : entries)
      if (e.key == key) return &e;
    return nullptr;
  }
  // Registers `key` as known and returns its entry (marked used) if present.
  Entry* take(std::string_view key) {
    if (std::find(known.begin(), known.end(), key) == known.end()) known.emplace_back(key);
    Entry* e = find(key);
    if (e) e->used = true;
    return e;
  }
  std::string path_of(std::string_view key) const {
    return path.empty() ? std::string(key) : path + "." + std::string(key);
  }
  // Where the key at `full` (a path inside this section) was set. `entry_key` picks the mark.
  std::string where(const std::string& full, std::string_view entry_key) const {
    if (locations) {
      for (std::string p = full; !p.empty(); p = parent_path(p)) {
        auto it = locations->find(p);
        if (it != locations->end()) return it->second;
      }
    }
    const Entry* e = find(entry_key);
    if (!e && !self_where.empty()) return self_where;
    YAML::Mark m = e ? e->key_node.Mark() : node.Mark();
    return m.is_null() ? origin : fmt::format("{}:{}", origin, m.line + 1);
  }
  [[noreturn]] void fail_at(std::string_view entry_key, const std::string& full, const std::string& problem) const {
    throw Error(where(full, entry_key) + ": " + full + " " + problem);
  }
  // "stage = 7" / "stage is a mapping" / "stage has no value", for "<this>: expected ...".
  static std::string shown(const std::string& full, const YAML::Node& v) {
    if (!v.IsDefined() || v.IsNull()) return full + " has no value";
    if (v.IsMap()) return full + " is a mapping";
    if (v.IsSequence()) return fmt::format("{} is a list of {}", full, v.size());
    return full + " = " + (v.Scalar().empty() ? std::string("\"\"") : escape_bytes(v.Scalar()));
  }
  [[noreturn]] void bad_value(const Entry& e, const std::string& full, const YAML::Node& v, const std::string& expected,
                              const std::string& hint = "") const {
    std::string msg = shown(full, v) + ": expected " + expected;
    if (v.IsScalar() && v.Scalar() == "auto") msg += " (\"auto\" is not accepted for this key)";
    if (!hint.empty()) msg += " (" + hint + ")";
    throw Error(where(full, e.key) + ": " + msg);
  }
  // The scalar text of a value, or an error naming what was expected.
  const std::string& scalar(const Entry& e, const std::string& full, const YAML::Node& v,
                            const std::string& expected) const {
    if (!v.IsScalar()) bad_value(e, full, v, expected);
    return v.Scalar();
  }
};

StrictSection::StrictSection(const YAML::Node& node, std::string key_path, std::string origin,
                             std::shared_ptr<const KeyLocations> locations)
    : impl_(std::make_unique<Impl>()) {
  impl_->node = node;
  impl_->path = std::move(key_path);
  impl_->origin = std::move(origin);
  impl_->locations = std::move(locations);
  if (!node.IsDefined() || node.IsNull()) return;
  if (!node.IsMap()) {
    std::string shown = Impl::shown(impl_->path.empty() ? "top level" : impl_->path, node);
    throw Error(impl_->where(impl_->path, "") + ": " + shown + ": expected a section (a mapping of keys)");
  }
  for (auto it = node.begin(); it != node.end(); ++it) {
    Impl::Entry e{"", it->first, it->second, false};
    if (!it->first.IsScalar()) {
      throw Error(impl_->where(impl_->path, "") + ": " + (impl_->path.empty() ? "top level" : impl_->path) +
                  ": has a key that is not a plain name; keys are names like 'stage'");
    }
    e.key = it->first.Scalar();
    if (const Impl::Entry* first = impl_->find(e.key)) {
      std::string full = impl_->path_of(e.key);
      YAML::Mark m1 = first->key_node.Mark();
      YAML::Mark m2 = e.key_node.Mark();
      std::string lines =
          (!m1.is_null() && !m2.is_null()) ? fmt::format(" (lines {} and {})", m1.line + 1, m2.line + 1) : "";
      throw Error(impl_->origin + ": " + escape_bytes(full) + ": key appears twice" + lines +
                  "; keep one (a later one would not silently win here)");
    }
    impl_->entries.push_back(std::move(e));
  }
}

StrictSection::~StrictSection() = default;
StrictSection::StrictSection(StrictSection&&) noexcept = default;
StrictSection& StrictSection::operator=(StrictSection&&) noexcept = default;

const std::string& StrictSection::key_path() const { return impl_->path; }
const std::string& StrictSection::origin() const { return impl_->origin; }
std::string StrictSection::path_of(std::string_view key) const { return impl_->path_of(key); }
std::string StrictSection::where(std::string_view key) const { return impl_->where(impl_->path_of(key), key); }

bool StrictSection::has(std::string_view key) { return impl_->take(key) != nullptr; }

bool StrictSection::is_auto(std::string_view key) {
  Impl::Entry* e = impl_->take(key);
  return e && e->value.IsScalar() && e->value.Scalar() == "auto";
}

void StrictSection::allow(std::string_view key) { impl_->take(key); }

void StrictSection::reject(std::string_view key, std::string_view why) {
  impl_->rejected.emplace(std::string(key), std::string(why));
}

std::int64_t StrictSection::get_int(std::string_view key, std::int64_t def, std::int64_t min, std::int64_t max) {
  Impl::Entry* e = impl_->take(key);
  if (!e) return def;
  constexpr auto lo_limit = std::numeric_limits<std::int64_t>::min();
  constexpr auto hi_limit = std::numeric_limits<std::int64_t>::max();
  std::string expected = "an integer";
  if (min != lo_limit && max != hi_limit) {
    expected += fmt::format(" in {}..{}", min, max);
  } else if (min != lo_limit) {
    expected += fmt::format(" >= {}", min);
  } else if (max != hi_limit) {
    expected += fmt::format(" <= {}", max);
  }
  std::string full = impl_->path_of(key);
  std::string_view s = impl_->scalar(*e, full, e->value, expected);
  std::int64_t v = 0;
  std::string_view digits = (!s.empty() && s.front() == '+') ? s.substr(1) : s;
  auto r = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  if (r.ec != std::errc() || r.ptr != digits.data() + digits.size() || digits.empty()) {
    // DeepSpeed configs write sizes as 5e8; any notation of a whole number is an integer.
    std::optional<double> d = parse_real(s);
    if (!d) impl_->bad_value(*e, full, e->value, expected);
    if (std::floor(*d) != *d) impl_->bad_value(*e, full, e->value, expected, "not a whole number");
    if (*d < -9.2e18 || *d > 9.2e18) impl_->bad_value(*e, full, e->value, expected, "too large");
    v = static_cast<std::int64_t>(*d);
  }
  if (v < min || v > max) impl_->bad_value(*e, full, e->value, expected);
  return v;
}

double StrictSection::get_double(std::string_view key, double def, const Range& range) {
  Impl::Entry* e = impl_->take(key);
  if (!e) return def;
  std::string expected = "a number";
  if (std::isfinite(range.lo) || std::isfinite(range.hi)) expected += " " + range.describe();
  std::string full = impl_->path_of(key);
  std::optional<double> d = parse_real(impl_->scalar(*e, full, e->value, expected));
  if (!d || !range.contains(*d)) impl_->bad_value(*e, full, e->value, expected);
  return *d;
}

bool StrictSection::get_bool(std::string_view key, bool def) {
  Impl::Entry* e = impl_->take(key);
  if (!e) return def;
  std::string full = impl_->path_of(key);
  std::string s = lower_ascii(impl_->scalar(*e, full, e->value, "true or false"));
  if (s == "true" || s == "yes" || s == "on") return true;
  if (s == "false" || s == "no" || s == "off") return false;
  impl_->bad_value(*e, full, e->value, "true or false");
}

std::string StrictSection::get_string(std::string_view key, const std::string& def) {
  Impl::Entry* e = impl_->take(key);
  if (!e) return def;
  return impl_->scalar(*e, impl_->path_of(key), e->value, "a string");
}

std::string StrictSection::get_choice(std::string_view key, const std::string& def,
                                      const std::vector<std::string>& choices, bool ignore_case) {
  Impl::Entry* e = impl_->take(key);
  if (!e) return def;
  std::string full = impl_->path_of(key);
  std::string expected = "one of " + join(choices, ", ");
  if (ignore_case) expected += " (any case)";
  const std::string& s = impl_->scalar(*e, full, e->value, expected);
  for (const auto& c : choices) {
    if (s == c || (ignore_case && lower_ascii(s) == lower_ascii(c))) return c;
  }
  std::string guess = closest_match(s, choices);
  impl_->bad_value(*e, full, e->value, expected, guess.empty() ? std::string() : "did you mean " + guess + "?");
}

std::vector<double> StrictSection::get_doubles(std::string_view key, const std::vector<double>& def, std::size_t count,
                                               const Range& each) {
  Impl::Entry* e = impl_->take(key);
  if (!e) return def;
  std::string full = impl_->path_of(key);
  std::string one = "a number";
  if (std::isfinite(each.lo) || std::isfinite(each.hi)) one += " " + each.describe();
  std::string expected = count ? fmt::format("a list of {} numbers", count) : "a list of numbers";
  if (std::isfinite(each.lo) || std::isfinite(each.hi)) expected += ", each " + each.describe();
  if (!e->value.IsSequence() || (count && e->value.size() != count)) {
    impl_->bad_value(*e, full, e->value, expected + " (like [0.9, 0.999])");
  }
  std::vector<double> out;
  for (std::size_t i = 0; i < e->value.size(); ++i) {
    std::string item = fmt::format("{}[{}]", full, i);
    YAML::Node v = e->value[i];
    std::optional<double> d = v.IsScalar() ? parse_real(v.Scalar()) : std::nullopt;
    if (!d || !each.contains(*d)) impl_->bad_value(*e, item, v, one);
    out.push_back(*d);
  }
  return out;
}

std::optional<StrictSection> StrictSection::sub(std::string_view key) {
  Impl::Entry* e = impl_->take(key);
  if (!e || e->value.IsNull()) return std::nullopt;
  std::string full = impl_->path_of(key);
  if (!e->value.IsMap()) impl_->bad_value(*e, full, e->value, "a section (a mapping of keys)");
  StrictSection s(e->value, full, impl_->origin, impl_->locations);
  s.impl_->self_where = impl_->where(full, key);
  return s;
}

StrictSection StrictSection::section(std::string_view key) {
  if (auto s = sub(key)) return std::move(*s);
  StrictSection s(YAML::Node(YAML::NodeType::Map), impl_->path_of(key), impl_->origin, impl_->locations);
  s.impl_->self_where = impl_->where(impl_->path_of(key), key);
  return s;
}

YAML::Node StrictSection::raw(std::string_view key) {
  Impl::Entry* e = impl_->take(key);
  return e ? e->value : YAML::Node();
}

void StrictSection::fail(std::string_view key, std::string_view problem) const {
  impl_->fail_at(key, impl_->path_of(key), std::string(problem));
}

void StrictSection::finish() {
  std::vector<std::string> errors;
  finish(errors, true);
  if (!errors.empty()) throw Error(errors.front());
}

std::vector<std::string> StrictSection::take_unknown_without_near_miss(
    const std::function<bool(const std::string&)>& eligible) {
  std::vector<std::string> taken;
  for (auto& e : impl_->entries) {
    if (e.used || impl_->rejected.count(e.key) || !closest_match(e.key, impl_->known).empty() || !eligible(e.key))
      continue;
    e.used = true;
    taken.push_back(e.key);
  }
  return taken;
}

void StrictSection::finish(std::vector<std::string>& errors, bool first_only) {
  for (const auto& e : impl_->entries) {
    if (e.used) continue;
    std::string full = impl_->path_of(e.key);
    if (auto r = impl_->rejected.find(e.key); r != impl_->rejected.end()) {
      errors.push_back(impl_->where(full, e.key) + ": " + escape_bytes(full) + " " + r->second);
      if (first_only) return;
      continue;
    }
    std::string msg = "unknown key '" + escape_bytes(full) + "'";
    std::string guess = closest_match(e.key, impl_->known);
    if (!guess.empty()) {
      msg += "; did you mean '" + impl_->path_of(guess) + "'?";
    } else if (!impl_->known.empty()) {
      // Own keys are asked for first; the tail is DeepSpeed's keys, too many to list.
      constexpr std::size_t kListed = 20;
      std::vector<std::string> listed(impl_->known.begin(),
                                      impl_->known.begin() + std::min(kListed, impl_->known.size()));
      msg += "; the keys known " + (impl_->path.empty() ? std::string("at the top level") : "in " + impl_->path) +
             " are: " + join(listed, ", ") +
             (impl_->known.size() > kListed
                  ? fmt::format(" and {} more (see docs/configuration.md)", impl_->known.size() - kListed)
                  : std::string());
    }
    std::vector<std::string> others;
    for (const auto& o : impl_->entries) {
      if (!o.used && &o != &e && !impl_->rejected.count(o.key)) others.push_back(escape_bytes(o.key));
    }
    // Reported one by one when collecting, so only the first-only message lists the others.
    if (first_only && !others.empty()) msg += " (also unknown here: " + join(others, ", ") + ")";
    if (guess.empty() || (first_only && !others.empty())) msg += ".";
    msg += " Unknown keys are errors rather than ignored: fix the spelling or remove the key";
    errors.push_back(impl_->where(full, e.key) + ": " + msg);
    if (first_only) return;
  }
}

namespace {

// Counts documents without building them. yaml-cpp 0.7's parser reports a new, empty document
// forever when the text holds a ',' it cannot place at the top level (LoadAll then never ends),
// so the count stops at `limit`.
class DocumentCounter : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

int count_documents(const std::string& text, int limit) {
  std::istringstream in(text);
  YAML::Parser parser(in);
  DocumentCounter counter;
  int n = 0;
  while (n < limit && parser.HandleNextDocument(counter)) ++n;
  return n;
}

}  // namespace

YAML::Node parse_yaml(const std::string& text, const std::string& origin) {
  // One document only, and never LoadAll: see DocumentCounter.
  YAML::Node doc;
  int documents = 0;
  try {
    documents = count_documents(text, 3);
    doc = YAML::Load(text);
  } catch (const YAML::Exception& ex) {
    std::string at = origin;
    if (!ex.mark.is_null()) {
      at += fmt::format(":{}:{}", ex.mark.line + 1, ex.mark.column + 1);
    }
    throw Error(at + ": not valid YAML or JSON: " + ex.msg + "; fix the syntax there");
  }
  if (documents == 2) {
    throw Error(origin +
                ": holds 2 YAML documents (separated by ---); a config is one document, so merge "
                "them");
  }
  if (documents > 2) {
    throw Error(origin +
                ": not valid YAML or JSON: text after the first document that YAML cannot read "
                "(a ',' outside brackets, or several documents separated by ---); a config is "
                "one mapping of keys: fix the syntax");
  }
  return doc.IsDefined() ? doc : YAML::Node(YAML::NodeType::Null);
}

YAML::Node extra_section_node(const Config& cfg, const std::string& name) {
  auto it = cfg.extra_sections.find(name);
  if (it == cfg.extra_sections.end()) return YAML::Node(YAML::NodeType::Map);
  return parse_yaml(it->second, (cfg.source.empty() ? std::string("config") : cfg.source) + " (section " + name + ")");
}

StrictSection extra_section(const Config& cfg, const std::string& name) {
  auto locations = std::make_shared<KeyLocations>();
  for (const auto& [path, where] : cfg.extra_locations) {
    if (path == name || path.starts_with(name + ".") || path.starts_with(name + "[")) {
      locations->emplace(path, where);
    }
  }
  return StrictSection(extra_section_node(cfg, name), name, cfg.source.empty() ? std::string("config") : cfg.source,
                       std::move(locations));
}

}  // namespace zero
