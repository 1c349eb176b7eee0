// Loading zero::Config: the file (a regular file of bounded size), the --set overrides, then
// every key of the table in config/keys.cpp read through StrictSection, the DeepSpeed keys of
// foreign_keys() judged by their policy, and the rules that need several keys. Problems are
// collected and thrown together, so one run shows everything wrong with a file.
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

class Loader {
 public:
  Loader(Config& cfg, const LoadOptions& opts, YAML::Node root,
         std::shared_ptr<const KeyLocations> locations, bool deepspeed_json)
      : cfg_(cfg), opts_(opts), locations_(std::move(locations)), deepspeed_json_(deepspeed_json) {
    sections_.emplace("", StrictSection(root, "", cfg.source, locations_));
  }

  void load() {
    for (const auto& s : keys::config_keys()) attempt(s.path, [&] { read(s); });
    StrictSection& top = sections_.at("");
    for (const auto& name : opts_.extra_sections) top.allow(name);
    for (const auto& f : keys::foreign_keys()) attempt(f.path, [&] { judge(f); });
    attempt("", [&] { cross_checks(); });
    if (deepspeed_json_) ignore_foreign_top_level_keys(top);
    // Unknown keys first: a misspelt section name explains the later messages.
    std::vector<std::string> unknown;
    for (auto& [path, sec] : sections_) {
      if (owned(path)) sec.finish(unknown);
    }
    errors_.insert(errors_.begin(), unknown.begin(), unknown.end());
    if (errors_.size() == 1) throw Error(errors_.front());
    if (!errors_.empty()) {
      std::string msg = fmt::format(
          "{}: {} problems in the configuration (fix them all, then load again):", cfg_.source,
          errors_.size());
      for (const auto& e : errors_) msg += "\n  - " + e;
      throw Error(msg);
    }
  }

 private:
  template <class F>
  void attempt(std::string_view path, F&& f) {
    try {
      f();
    } catch (const Error& e) {
      errors_.emplace_back(e.what());
      failed_.emplace(path);
    }
  }

  // A section of libzero's own (holds table keys): its unknown keys are errors. Sections that
  // hold only DeepSpeed keys (tensor_parallel) keep their other keys to DeepSpeed.
  static bool owned(const std::string& path) {
    if (path.empty()) return true;
    for (const auto& s : keys::config_keys())
      if (parent_of(s.path) == path) return true;
    return false;
  }

  // The section at `path`, created from its parent on first use; nullptr when a parent is not
  // a section (that error is reported once, by the parent).
  StrictSection* section(const std::string& path) {
    if (auto it = sections_.find(path); it != sections_.end()) return &it->second;
    if (failed_.count(path)) return nullptr;
    StrictSection* parent = section(parent_of(path));
    if (!parent) return nullptr;
    const std::string leaf = leaf_of(path);
    try {
      if (parent->has(leaf) && parent->raw(leaf).IsNull()) {
        parent->fail(leaf, "has no value; write its keys under it (or {} for the defaults), or "
                           "remove the line");
      }
      return &sections_.emplace(path, parent->section(leaf)).first->second;
    } catch (const Error& e) {
      errors_.emplace_back(e.what());
      failed_.insert(path);
      return nullptr;
    }
  }

  // The spelling of `leaf` used in the file among the key and its aliases; "" when absent.
  static std::string spelling(StrictSection& sec, const std::string& leaf,
                              const std::vector<std::string_view>& aliases) {
    std::string found = sec.has(leaf) ? leaf : "";
    for (auto a : aliases) {
      if (!sec.has(a)) continue;
      if (!found.empty()) {
        sec.fail(std::string(a), "and " + found + " (" + sec.where(found) +
                                     ") are the same setting; keep one");
      }
      found = std::string(a);
    }
    return found;
  }

  void read(const Spec& s) {
    if (s.dynamic_default) s.dynamic_default(cfg_);
    const std::string parent = parent_of(s.path);
    // A params section of a type that failed to read would only add noise.
    if (const auto dot = s.path.find('.');
        dot != std::string_view::npos && failed_.count(std::string(s.path.substr(0, dot)) + ".type"))
      return;
    StrictSection* sec = section(parent);
    if (!sec) return;
    const std::string key = spelling(*sec, leaf_of(s.path), s.aliases);
    if (key.empty()) return;
    if (s.inapplicable) {
      if (std::string why = s.inapplicable(cfg_); !why.empty()) sec->fail(key, why);
    }
    if (s.auto_rule != Auto::none && sec->is_auto(key)) {
      resolve_auto(s, *sec, key);
    } else {
      read_value(s, *sec, key);
    }
  }

  // "auto": the application's value, else the rule's fallback.
  void resolve_auto(const Spec& s, StrictSection& sec, const std::string& key) {
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
      std::visit([](auto p) {
        if constexpr (std::is_same_v<decltype(p), std::int64_t*>) *p = 0;
      }, s.slot(cfg_));
      cfg_.autos.push_back({path, "derived", "resolve() derives it from the batch triple and the world size"});
      return;
    } else if (s.auto_rule == Auto::required) {
      if (opts_.total_num_steps <= 0) {
        sec.fail(key, "is \"auto\", but the application did not tell libzero the run length; "
                      "write the number of optimizer steps");
      }
      std::visit([&](auto p) {
        if constexpr (std::is_same_v<decltype(p), std::int64_t*>) *p = opts_.total_num_steps;
      }, s.slot(cfg_));
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

  void read_value(const Spec& s, StrictSection& sec, const std::string& key) {
    std::visit(
        [&](auto p) {
          using P = decltype(p);
          if constexpr (std::is_same_v<P, int*> || std::is_same_v<P, std::int64_t*>) {
            // The range is clipped to the member's type, so no value is narrowed.
            const Range r = keys::integer_range(s);
            const auto lo = static_cast<std::int64_t>(std::ceil(r.lo));
            const auto hi = r.hi >= 9.2e18 ? std::numeric_limits<std::int64_t>::max()
                                           : static_cast<std::int64_t>(std::floor(r.hi));
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

  void read_choice(const Spec& s, StrictSection& sec, const std::string& key, keys::EnumRef ref) {
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
                            "so choose one of " + choices);
        }
      }
    }
    const std::string current(s.choices[static_cast<std::size_t>(ref.get(cfg_))]);
    const std::string got = sec.get_choice(key, current.empty() ? names.front() : current, names,
                                           s.any_case);
    for (std::size_t i = 0; i < s.choices.size(); ++i)
      if (s.choices[i] == got) ref.set(cfg_, static_cast<int>(i));
  }

  // DeepSpeed reads its JSON config's top level by name and ignores the keys it does not know
  // (a user's own "cuda_visible_devices"), so a ds_config.json that runs there must load here.
  // Only keys in the file, and only where no known key is close: a near miss is still a typo
  // (error, did you mean), and a --set override or a YAML file stays strict. Sections are not
  // affected: DeepSpeed's own models refuse unknown keys inside zero_optimization and friends.
  void ignore_foreign_top_level_keys(StrictSection& top) {
    const auto from_file = [&](const std::string& key) { return !locations_ || !locations_->count(key); };
    for (const auto& key : top.take_unknown_without_near_miss(from_file))
      cfg_.notes.push_back(top.where(key) + ": unknown key '" + escape_bytes(key) +
                           "' ignored, as DeepSpeed ignores top-level keys it does not know; no known key is "
                           "close to it (in a YAML config it would be an error)");
  }

  // A DeepSpeed key without a member: silent, a note, or an error, as its entry says.
  void judge(const keys::Foreign& f) {
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
    const std::string shown = v.IsScalar()
                                  ? " = " + escape_bytes(v.Scalar())
                                  : (v.IsMap() && judged.IsDefined() ? " has enabled: " + text : "");
    if (f.policy == keys::Policy::note) {
      cfg_.notes.push_back(sec->path_of(key) + shown + ": handled differently here: " +
                           std::string(f.why));
    } else {
      sec->fail(key, shown.empty() ? "is set: " + std::string(f.why)
                                   : shown.substr(1) + ": " + std::string(f.why));
    }
  }

  // Rules that need several keys.
  void cross_checks() {
    StrictSection& top = sections_.at("");
    auto check = [&](auto&& f) { attempt("", f); };
    const auto& z = cfg_.zero_optimization;
    for (const char* which : {"offload_optimizer", "offload_param"}) {
      check([&] {
        const auto& o = std::string(which) == "offload_param"
                            ? z.offload_param.device : z.offload_optimizer.device;
        const auto& path = std::string(which) == "offload_param" ? z.offload_param.nvme_path
                                                                 : z.offload_optimizer.nvme_path;
        StrictSection* s = section(std::string("zero_optimization.") + which);
        if (s && o == OffloadDevice::nvme && path.empty()) {
          s->fail("device", "is nvme but nvme_path is not set; add nvme_path: <a directory on the "
                            "NVMe drive> to this section, or use device: cpu");
        }
      });
    }
    StrictSection* zs = section("zero_optimization");
    // Only stage 3 partitions parameters, so only there is a parameter shard to move off the
    // GPU; an optimizer shard exists from stage 1 on.
    check([&] {
      if (zs && z.offload_param.device != OffloadDevice::none && z.stage < 3) {
        section("zero_optimization.offload_param")
            ->fail("device", fmt::format("= {} needs zero_optimization.stage 3, but stage is {} "
                                         "({}); parameter offload exists only at stage 3: set "
                                         "stage: 3 or offload_param.device: none",
                                         to_string(z.offload_param.device), z.stage,
                                         zs->where("stage")));
      }
    });
    check([&] {
      if (zs && z.offload_optimizer.device != OffloadDevice::none && z.stage == 0) {
        section("zero_optimization.offload_optimizer")
            ->fail("device", std::string("= ") + to_string(z.offload_optimizer.device) +
                                 " needs zero_optimization.stage >= 1, but stage is 0 (" +
                                 zs->where("stage") +
                                 "); set stage: 1 or higher, or offload_optimizer.device: none");
      }
    });
    // PowerSGD all-reduces low-rank factors of the whole gradient: stages 2 and 3 reduce-scatter
    // it, and the reduce-scatter of a product P Q^T does not exist (each rank would need all of
    // P and Q to form its slice, which is the all-reduce again).
    check([&] {
      const GradientCompressionConfig& g = cfg_.gradient_compression;
      if (g.type != CompressionType::powersgd) return;
      StrictSection* gs = section("gradient_compression");
      if (!gs) return;
      if (z.stage >= 2)
        gs->fail("type", fmt::format("= powersgd applies to zero_optimization.stage 0 and 1, but stage is {}{}: "
                                     "stages 2 and 3 reduce-scatter the gradient, and a low-rank product P Q^T "
                                     "cannot be reduce-scattered; use stage 0 or 1, or type: none",
                                     z.stage, zs ? " (" + zs->where("stage") + ")" : std::string()));
    });
    check([&] {
      if (cfg_.aio.block_size % 4096 != 0) {
        section("aio")->fail("block_size",
                             fmt::format("= {} must be a multiple of 4096 (O_DIRECT transfers "
                                         "are 4 KiB aligned)",
                                         cfg_.aio.block_size));
      }
    });
    check([&] {
      if (cfg_.fp16.enabled && cfg_.bf16_enabled) {
        section("bf16")->fail("enabled", "is true and so is fp16.enabled (" +
                                             section("fp16")->where("enabled") +
                                             "); choose one compute precision: set one of them "
                                             "to false");
      }
    });
    // Gradients accumulate in fp32 or in the compute dtype; a third dtype would round every
    // micro-step's gradient twice.
    check([&] {
      const GradAccumDType g = cfg_.grad_accum_dtype;
      if (g == GradAccumDType::automatic || g == GradAccumDType::fp32) return;
      const DType want = g == GradAccumDType::fp16 ? DType::f16 : DType::bf16;
      StrictSection* d = section("data_types");
      if (want == cfg_.compute_dtype() || !d) return;
      d->fail("grad_accum_dtype",
                 fmt::format("= {} but the compute dtype is {}; gradients accumulate in fp32 or in the compute "
                             "dtype: set it to fp32, or remove it",
                             to_string(g), dtype_name(cfg_.compute_dtype())));
    });
    check([&] {
      StrictSection* o = top.has("optimizer") ? section("optimizer") : nullptr;
      if (o && !o->has("type")) {
        o->fail("type", "is missing; the optimizer section needs type: AdamW, Adam or SGD");
      }
    });
    check([&] { adam_mode_note(); });
    check([&] { scheduler_checks(top); });
    // The host backend always communicates over MPI, so comm: nccl next to backend: host would
    // be a setting with no effect: an error, not ignored.
    check([&] {
      if (top.has("comm") && cfg_.backend == BackendKind::host && cfg_.comm == CommKind::nccl) {
        const std::string how =
            top.has("backend") ? "set at " + top.where("backend") : "the default";
        top.fail("comm", "= nccl applies to backend: cuda, but backend is host (" + how +
                             "); the host backend always communicates over MPI: remove comm, or "
                             "set backend: cuda");
      }
    });
  }

  // DeepSpeed's type Adam decays decoupled unless adam_w_mode says otherwise, and its AdamW
  // ignores adam_w_mode: libzero follows both rules and says so where the choice matters.
  void adam_mode_note() {
    const OptimizerConfig& o = cfg_.optimizer;
    StrictSection* p = section("optimizer.params");
    const bool given = p && p->has("adam_w_mode");
    if (o.type == OptimizerType::adam && !given && o.weight_decay != 0.0) {
      cfg_.notes.push_back(
          "optimizer.type: Adam decays decoupled (AdamW-style), as DeepSpeed's adam_w_mode "
          "defaults to true; set optimizer.params.adam_w_mode: false to add the decay to the "
          "gradient instead");
    }
    if (o.type == OptimizerType::adamw && given && !o.adam_w_mode) {
      cfg_.notes.push_back(
          "optimizer.params.adam_w_mode: false has no effect with type AdamW (as in DeepSpeed): "
          "the decay stays decoupled; use type: Adam for decay added to the gradient");
    }
  }

  void scheduler_checks(StrictSection& top) {
    StrictSection* s = top.has("scheduler") ? section("scheduler") : nullptr;
    if (!s || failed_.count("scheduler.type")) return;
    const auto& c = cfg_.scheduler;
    if (!s->has("type")) {
      s->fail("type",
              "is missing; the scheduler section needs type: WarmupLR, WarmupDecayLR, "
              "WarmupCosineLR or ManualLR (or remove the section for a constant optimizer lr)");
    }
    StrictSection* p = section("scheduler.params");
    if (!p || c.type == SchedulerType::warmup_lr || c.type == SchedulerType::manual_lr || failed_.count("scheduler.params.total_num_steps"))
      return;
    const std::string type = c.type == SchedulerType::warmup_decay_lr ? "WarmupDecayLR" : "WarmupCosineLR";
    if (!p->has("total_num_steps")) {
      p->fail("total_num_steps", "is missing; " + type +
                                     " decays over total_num_steps optimizer steps, so it needs "
                                     "the run length");
    }
    if (c.total_num_steps < c.warmup_num_steps) {
      p->fail("total_num_steps",
              fmt::format("= {} is less than warmup_num_steps = {}: the run would end inside the "
                          "warmup; raise total_num_steps or shorten the warmup",
                          c.total_num_steps, c.warmup_num_steps));
    }
  }

  Config& cfg_;
  const LoadOptions& opts_;
  std::shared_ptr<const KeyLocations> locations_;
  std::map<std::string, StrictSection> sections_;
  std::set<std::string> failed_;
  std::vector<std::string> errors_;
  const bool deepspeed_json_;
};

// A DeepSpeed JSON config: a file whose name ends in .json (ds_config.json).
bool is_deepspeed_json(const std::string& origin) {
  return origin.size() >= 5 && lower_ascii(origin.substr(origin.size() - 5)) == ".json";
}

Config build(YAML::Node root, const std::string& origin, const LoadOptions& opts) {
  Config cfg;
  cfg.source = origin;
  for (const auto& name : opts.extra_sections) {
    bool ours = false;
    for (const auto& s : keys::config_keys())
      ours = ours || s.path == name || s.path.starts_with(name + ".");
    if (ours || name.empty() || name.find_first_of(".[]= ") != std::string::npos) {
      throw Error("LoadOptions::extra_sections: '" + name + "' cannot be an application section (" +
                  (ours ? "libzero reads that key itself" : "it must be a plain key name") +
                  "); rename the section");
    }
  }
  if (!root.IsDefined() || root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  if (!root.IsMap()) StrictSection check(root, "", origin);  // throws: says what it got instead

  auto locations = std::make_shared<KeyLocations>();
  for (const auto& o : opts.overrides) apply_override(root, o, *locations);
  normalize_deepspeed_forms(root, origin, *locations);

  Loader(cfg, opts, root, locations, is_deepspeed_json(origin)).load();

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
    throw Error(fmt::format("{}: is {} bytes, more than the {} MiB a config file may have; is this "
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
