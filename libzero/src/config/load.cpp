// Loading zero::Config: the file (a regular file of bounded size), the --set overrides, then
// every key of the table in config/keys.cpp read through StrictSection and the DeepSpeed keys of
// foreign_keys() judged by their policy (ConfigLoader, config/loader.hpp; the rules that need
// several keys are in config/cross_checks.cpp). Problems are collected and thrown together, so
// one run shows everything wrong with a file.
#include <fmt/format.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "config/keys.hpp"
#include "config/loader.hpp"
#include "config/tree.hpp"
#include "runtime/strings.hpp"
#include "zero/config.hpp"
#include "zero/config_schema.hpp"
#include "zero/error.hpp"
#include "zero/util/files.hpp"

namespace zero {

namespace {

using keys::Auto;
using keys::Kind;
using keys::Spec;

// A config this large is not a config; reading it whole could exhaust memory.
constexpr std::uintmax_t kMaxConfigBytes = 16u << 20;

std::string parent_of(std::string_view path) {
  auto dot = path.rfind('.');
  return dot == std::string_view::npos ? std::string() : std::string(path.substr(0, dot));
}
std::string leaf_of(std::string_view path) {
  auto dot = path.rfind('.');
  return std::string(dot == std::string_view::npos ? path : path.substr(dot + 1));
}

const Spec* find_spec(std::string_view path) {
  for (const auto& s : keys::config_keys())
    if (s.path == path) return &s;
  return nullptr;
}

bool null_default_section(std::string_view path) {
  const auto& t = keys::null_default_sections();
  return std::find(t.begin(), t.end(), path) != t.end();
}

// A key's default for messages about a null: "10", "auto", "(empty)", "(derived ...)". Read
// before the key is, so the member still holds its default (a dynamic one included).
std::string default_shown(const Spec& s, const Config& c) {
  if (s.auto_rule == Auto::derived) return "(derived from the other two and the world size)";
  std::string v = keys::value_text(s, c);
  if (v.empty()) v = s.default_text.empty() ? "empty" : std::string(s.default_text);
  return v == keys::value_text(s, c) ? v : "(" + v + ")";
}

// DeepSpeed's default gradient_clipping is 1.0 since 0.19.3 (runtime/constants.py,
// GRADIENT_CLIPPING_DEFAULT; 0, no clipping, before). A ds_config.json that leaves the key out
// is clipped at 1.0 by current DeepSpeed, so it is here; a YAML config keeps libzero's
// documented 0. Either way the choice is a note at start.
constexpr double kDeepSpeedGradientClipping = 1.0;

}  // namespace

ConfigLoader::ConfigLoader(Config& cfg, const LoadOptions& opts, YAML::Node root,
                           std::shared_ptr<const KeyLocations> locations, bool deepspeed_json)
    : cfg_(cfg), opts_(opts), locations_(std::move(locations)), deepspeed_json_(deepspeed_json) {
  sections_.emplace("", StrictSection(root, "", cfg.source, locations_));
}

void ConfigLoader::load() {
  if (deepspeed_json_) cfg_.gradient_clipping = kDeepSpeedGradientClipping;
  for (const auto& s : keys::config_keys()) attempt(s.path, [&] { read(s); });
  StrictSection& top = sections_.at("");
  if (deepspeed_json_ && !top.has("gradient_clipping")) {
    cfg_.notes.push_back(
        fmt::format("gradient_clipping: not set, DeepSpeed's default {} is used (DeepSpeed 0.19.3 and later; "
                    "before, and in a YAML config here, the default is 0, no clipping): write "
                    "gradient_clipping: 0 to train unclipped",
                    shortest_text(kDeepSpeedGradientClipping)));
  }
  for (const auto& name : opts_.extra_sections) top.allow(name);
  for (const auto& f : keys::foreign_keys()) attempt(f.path, [&] { judge(f); });
  attempt("", [&] { cross_checks(); });
  if (deepspeed_json_) ignore_foreign_top_level_keys(top);
  // A type that failed to read: its params were not read (read(), judge()), so they are not
  // reported as unknown either; the type's own error says what to do.
  for (std::string_view owner : {"optimizer", "scheduler"}) {
    if (!failed_.count(std::string(owner) + ".type")) continue;
    if (StrictSection* o = section(std::string(owner))) o->allow("params");
  }
  // Unknown keys first: a misspelt section name explains the later messages.
  std::vector<std::string> unknown;
  for (auto& [path, sec] : sections_) {
    if (owned(path) && !under_failed_type(path + ".")) sec.finish(unknown);
  }
  errors_.insert(errors_.begin(), unknown.begin(), unknown.end());
  if (errors_.size() == 1) throw Error(errors_.front());
  if (!errors_.empty()) {
    std::string msg = fmt::format("{}: {} problems in the configuration (fix them all, then load again):", cfg_.source,
                                  errors_.size());
    for (const auto& e : errors_) msg += "\n  - " + e;
    throw Error(msg);
  }
}

// True when `path` is inside the params of a section whose type failed to read
// ("optimizer.params.lr" after optimizer.type failed): reading it would only add noise.
bool ConfigLoader::under_failed_type(std::string_view path) const {
  const auto dot = path.find('.');
  if (dot == std::string_view::npos) return false;
  const std::string owner(path.substr(0, dot));
  return path.substr(dot).starts_with(".params.") && failed_.count(owner + ".type");
}

// A section of libzero's own (holds table keys): its unknown keys are errors. Sections that
// hold only DeepSpeed keys (tensor_parallel) keep their other keys to DeepSpeed.
bool ConfigLoader::owned(const std::string& path) {
  if (path.empty()) return true;
  for (const auto& s : keys::config_keys())
    if (parent_of(s.path) == path) return true;
  return false;
}

// The section at `path`, created from its parent on first use; nullptr when a parent is not
// a section (that error is reported once, by the parent).
StrictSection* ConfigLoader::section(const std::string& path) {
  if (auto it = sections_.find(path); it != sections_.end()) return &it->second;
  if (failed_.count(path)) return nullptr;
  StrictSection* parent = section(parent_of(path));
  if (!parent) return nullptr;
  const std::string leaf = leaf_of(path);
  try {
    if (parent->has(leaf) && parent->raw(leaf).IsNull()) {
      // DeepSpeed reads some sections set to null as absent (keys::null_default_sections()).
      if (null_default_section(path)) {
        cfg_.notes.push_back(path + ": null, the defaults of its keys are used (as DeepSpeed reads it)");
      } else {
        parent->fail(leaf,
                     "has no value (null), and null does not mean its defaults (docs/"
                     "configuration.md lists where it does); write its keys under it (or {} "
                     "for the defaults), or remove the key for the defaults");
      }
    }
    return &sections_.emplace(path, parent->section(leaf)).first->second;
  } catch (const Error& e) {
    errors_.emplace_back(e.what());
    failed_.insert(path);
    return nullptr;
  }
}

// The spelling of `leaf` used in the file among the key and its aliases; "" when absent.
std::string ConfigLoader::spelling(StrictSection& sec, const std::string& leaf,
                                   const std::vector<std::string_view>& aliases) {
  std::string found = sec.has(leaf) ? leaf : "";
  for (auto a : aliases) {
    if (!sec.has(a)) continue;
    if (!found.empty()) {
      sec.fail(std::string(a), "and " + found + " (" + sec.where(found) + ") are the same setting; keep one");
    }
    found = std::string(a);
  }
  return found;
}

void ConfigLoader::read(const Spec& s) {
  if (s.dynamic_default) s.dynamic_default(cfg_);
  const std::string parent = parent_of(s.path);
  if (under_failed_type(s.path)) return;
  StrictSection* sec = section(parent);
  if (!sec) return;
  const std::string key = spelling(*sec, leaf_of(s.path), s.aliases);
  if (key.empty()) return;
  if (sec->raw(key).IsNull()) {
    read_null(s, *sec, key);
    return;
  }
  if (s.inapplicable) {
    if (std::string why = s.inapplicable(cfg_); !why.empty()) sec->fail(key, why);
  }
  if (s.auto_rule != Auto::none && sec->is_auto(key)) {
    resolve_auto(s, *sec, key);
  } else {
    read_value(s, *sec, key);
  }
}

// A key set to null (JSON null, YAML ~ or nothing): the default where DeepSpeed reads it so
// (Spec::null_is_default), else an error that says how to get the default.
void ConfigLoader::read_null(const Spec& s, StrictSection& sec, const std::string& key) {
  const std::string path = sec.path_of(key);
  const std::string def = default_shown(s, cfg_);
  if (s.null_is_default) {
    cfg_.notes.push_back(path + ": null, the default " + def + " is used (as DeepSpeed reads it)");
    return;
  }
  const std::string owner = parent_of(s.path);
  if (leaf_of(s.path) == "type" && (owner == "optimizer" || owner == "scheduler")) {
    // DeepSpeed reads a null type as "none from this file" (runtime/config.py: the name is
    // None, the params are dropped) and uses the training script's own, which libzero has not.
    std::string choices;
    for (auto c : s.choices) {
      if (!c.empty()) choices += (choices.empty() ? "" : ", ") + std::string(c);
    }
    sec.fail(key, "has no value (null): DeepSpeed then takes no " + owner +
                      " from the file but the training script's (and ignores " + owner +
                      ".params); libzero builds the " + owner + " from this section: write one of " + choices +
                      ", or remove the " + owner + " section for the default " + def);
  }
  if (s.auto_rule == Auto::required) {
    sec.fail(key, "has no value (null); write the number of optimizer steps");
  }
  sec.fail(key,
           "has no value (null), and null does not mean this key's default (docs/"
           "configuration.md lists where it does): remove the key for the default " +
               def);
}

// "auto": the application's value, else the rule's fallback.
void ConfigLoader::resolve_auto(const Spec& s, StrictSection& sec, const std::string& key) {
  std::string path(s.path);
  std::string source;
  auto given = opts_.auto_values.find(path);
  if (given != opts_.auto_values.end()) {
    YAML::Node holder(YAML::NodeType::Map);
    holder[key] = parse_yaml(given->second, "LoadOptions::auto_values[" + path + "]");
    StrictSection app(holder, sec.key_path(), "LoadOptions::auto_values[" + path + "]");
    read_value(s, app, key);
    source = "the application";
  } else if (s.auto_rule == Auto::derived) {
    std::visit(
        [](auto p) {
          if constexpr (std::is_same_v<decltype(p), std::int64_t*>) *p = 0;
        },
        s.slot(cfg_));
    cfg_.autos.push_back({path, "derived", "resolve() derives it from the batch triple and the world size"});
    return;
  } else if (s.auto_rule == Auto::required) {
    if (opts_.total_num_steps <= 0) {
      sec.fail(key,
               "is \"auto\", but the application did not tell libzero the run length; "
               "write the number of optimizer steps");
    }
    std::visit(
        [&](auto p) {
          if constexpr (std::is_same_v<decltype(p), std::int64_t*>) *p = opts_.total_num_steps;
        },
        s.slot(cfg_));
    source = "the run length the application gave";
  } else if (!s.auto_from.empty()) {
    const Spec* from = find_spec(s.auto_from);
    YAML::Node holder(YAML::NodeType::Map);
    holder[key] = keys::value_text(*from, cfg_);
    StrictSection copy(holder, sec.key_path(), std::string(s.auto_from));
    read_value(s, copy, key);
    source = std::string(s.auto_from);
  } else if (const Spec* dep = find_spec(s.default_depends_on)) {
    const std::string leaf = leaf_of(dep->path);
    source = "default for " + (leaf == "type" ? "" : leaf + " ") + keys::value_text(*dep, cfg_);
  } else {
    source = "DeepSpeed default";
  }
  const std::string value = keys::value_text(s, cfg_);
  cfg_.autos.push_back({path, value, source});
  cfg_.notes.push_back(path + ": \"auto\" -> " + value + " (" + source + ")");
}

void ConfigLoader::read_value(const Spec& s, StrictSection& sec, const std::string& key) {
  std::visit(
      [&](auto p) {
        using P = decltype(p);
        if constexpr (std::is_same_v<P, int*> || std::is_same_v<P, std::int64_t*>) {
          // The range is clipped to the member's type, so no value is narrowed.
          const Range r = keys::integer_range(s);
          const auto lo = static_cast<std::int64_t>(std::ceil(r.lo));
          const auto hi =
              r.hi >= 9.2e18 ? std::numeric_limits<std::int64_t>::max() : static_cast<std::int64_t>(std::floor(r.hi));
          *p = static_cast<std::remove_pointer_t<P>>(sec.get_int(key, *p, lo, hi));
        } else if constexpr (std::is_same_v<P, double*>) {
          *p = sec.get_double(key, *p, s.range);
        } else if constexpr (std::is_same_v<P, bool*>) {
          *p = sec.get_bool(key, *p);
        } else if constexpr (std::is_same_v<P, std::string*>) {
          *p = sec.get_string(key, *p);
        } else if constexpr (std::is_same_v<P, keys::EnumRef>) {
          read_choice(s, sec, key, p);
        } else {
          auto v = sec.get_doubles(key, {*p.first, *p.second}, 2, s.range);
          *p.first = v[0];
          *p.second = v[1];
        }
      },
      s.slot(cfg_));
}

void ConfigLoader::read_choice(const Spec& s, StrictSection& sec, const std::string& key, keys::EnumRef ref) {
  std::vector<std::string> names;
  for (auto c : s.choices)
    if (!c.empty()) names.emplace_back(c);
  if (YAML::Node v = sec.raw(key); v.IsScalar()) {
    for (const auto& [name, why] : s.refused_values) {
      if (lower_ascii(v.Scalar()) == lower_ascii(std::string(name))) {
        std::string choices;
        for (const auto& n : names) choices += (choices.empty() ? "" : ", ") + n;
        sec.fail(key, "= " + escape_bytes(v.Scalar()) + ": " + std::string(why) +
                          "; another optimizer or schedule would change the training result, "
                          "so choose one of " +
                          choices);
      }
    }
  }
  const std::string current(s.choices[static_cast<std::size_t>(ref.get(cfg_))]);
  const std::string got = sec.get_choice(key, current.empty() ? names.front() : current, names, s.any_case);
  for (std::size_t i = 0; i < s.choices.size(); ++i)
    if (s.choices[i] == got) ref.set(cfg_, static_cast<int>(i));
}

// DeepSpeed reads its JSON config's top level by name and ignores the keys it does not know
// (a user's own "cuda_visible_devices"), so a ds_config.json that runs there must load here.
// Only keys in the file, and only where no known key is close: a near miss is still a typo
// (error, did you mean), and a --set override or a YAML file stays strict. Sections are not
// affected: DeepSpeed's own models refuse unknown keys inside zero_optimization and friends.
void ConfigLoader::ignore_foreign_top_level_keys(StrictSection& top) {
  const auto from_file = [&](const std::string& key) { return !locations_ || !locations_->count(key); };
  for (const auto& key : top.take_unknown_without_near_miss(from_file))
    cfg_.notes.push_back(top.where(key) + ": unknown key '" + escape_bytes(key) +
                         "' ignored, as DeepSpeed ignores top-level keys it does not know; no known key is "
                         "close to it (in a YAML config it would be an error)");
}

// A DeepSpeed key without a member: silent, a note, or an error, as its entry says.
void ConfigLoader::judge(const keys::Foreign& f) {
  if (under_failed_type(f.path)) return;
  StrictSection* sec = section(parent_of(f.path));
  if (!sec) return;
  const std::string key = spelling(*sec, leaf_of(f.path), f.aliases);
  if (key.empty() || f.policy == keys::Policy::silent) return;
  YAML::Node v = sec->raw(key);
  YAML::Node judged = v.IsMap() ? v["enabled"] : v;
  std::string text = !judged.IsDefined() ? "false" : (judged.IsNull() ? "null" : "");
  if (judged.IsScalar()) text = lower_ascii(judged.Scalar());
  bool inert = false;
  if (f.inert_if) {
    inert = f.inert_if(cfg_, v);
  } else if (!f.inert.empty() && !text.empty()) {
    for (std::size_t b = 0; b <= f.inert.size();) {
      auto e = f.inert.find('|', b);
      if (e == std::string_view::npos) e = f.inert.size();
      inert = inert || f.inert.substr(b, e - b) == text;
      b = e + 1;
    }
  }
  if (inert) return;
  const std::string shown = v.IsScalar() ? " = " + escape_bytes(v.Scalar())
                                         : (v.IsMap() && judged.IsDefined() ? " has enabled: " + text : "");
  if (f.policy == keys::Policy::note) {
    cfg_.notes.push_back(sec->path_of(key) + shown + ": handled differently here: " + std::string(f.why));
  } else if (v.IsNull()) {
    sec->fail(key,
              "has no value (null), and null does not mean this key's default (docs/"
              "configuration.md lists where it does): remove the key for the default");
  } else {
    sec->fail(key, shown.empty() ? "is set: " + std::string(f.why) : shown.substr(1) + ": " + std::string(f.why));
  }
}

namespace {

// A DeepSpeed JSON config: a file whose name ends in .json (ds_config.json).
bool is_deepspeed_json(const std::string& origin) {
  return origin.size() >= 5 && lower_ascii(origin.substr(origin.size() - 5)) == ".json";
}

Config build(YAML::Node root, const std::string& origin, const LoadOptions& opts) {
  Config cfg;
  cfg.source = origin;
  for (const auto& name : opts.extra_sections) {
    bool ours = false;
    for (const auto& s : keys::config_keys()) ours = ours || s.path == name || s.path.starts_with(name + ".");
    if (ours || name.empty() || name.find_first_of(".[]= ") != std::string::npos) {
      throw Error("LoadOptions::extra_sections: '" + name + "' cannot be an application section (" +
                  (ours ? "libzero reads that key itself" : "it must be a plain key name") + "); rename the section");
    }
  }
  if (!root.IsDefined() || root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  if (!root.IsMap()) StrictSection check(root, "", origin);  // throws: says what it got instead

  auto locations = std::make_shared<KeyLocations>();
  for (const auto& o : opts.overrides) apply_override(root, o, *locations);
  normalize_deepspeed_forms(root, origin, *locations);

  ConfigLoader(cfg, opts, root, locations, is_deepspeed_json(origin)).load();

  StrictSection top(root, "", origin, locations);
  LocationRecorder recorder(origin, *locations, cfg.extra_locations);
  for (const auto& name : opts.extra_sections) {
    if (!top.has(name)) continue;
    YAML::Node n = top.raw(name);
    if (n.IsNull()) n = YAML::Node(YAML::NodeType::Map);
    cfg.extra_locations[name] = top.where(name);
    recorder.record(n, name);
    YAML::Emitter out;  // writes shared nodes once, as anchor and aliases
    out << n;
    cfg.extra_sections[name] = out.c_str();
  }
  return cfg;
}

}  // namespace

Config parse_config(const std::string& text, const std::string& origin, const LoadOptions& opts) {
  return build(parse_yaml(text, origin), origin, opts);
}

Config load_config(const std::string& path, const LoadOptions& opts) {
  // A FIFO or a device would block or never end: only regular files, of a sane size.
  const OpenedFile f = open_regular_file(path);
  if (!f.exists) {
    throw Error(path + ": cannot open the config file (" + std::strerror(f.error) + "); check the path");
  }
  if (f.fd < 0) {
    throw Error(path + ": is not a regular file (" + f.type + "); a config is a YAML or JSON file: give its path");
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{f.fd};
  if (f.size > kMaxConfigBytes) {
    throw Error(
        fmt::format("{}: is {} bytes, more than the {} MiB a config file may have; is this "
                    "the right file?",
                    path, f.size, kMaxConfigBytes >> 20));
  }
  std::string text(static_cast<std::size_t>(f.size), '\0');
  std::size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = ::read(f.fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw Error(path + ": cannot read the config file (" + std::strerror(errno) + ")");
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  text.resize(got);
  return parse_config(text, path, opts);
}

}  // namespace zero
