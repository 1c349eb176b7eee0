// Resolving zero::Config against the machine (the batch triple, nvme_path) and the text forms
// generated from the key table (config/keys.hpp): to_yaml, docs/configuration.md's reference and
// the --help lines. Loading is in config/load.cpp, the learning-rate schedules in
// optim/lr_schedule.cpp.
#include "zero/config.hpp"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <numbers>

#include "config/keys.hpp"
#include "runtime/strings.hpp"
#include "zero/config_schema.hpp"
#include "zero/error.hpp"

namespace zero {

namespace {

// Product of positive batch numbers, or an error when it does not fit (a typo of many zeros).
std::int64_t checked_mul(std::int64_t a, std::int64_t b, const std::string& shown) {
  std::int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) {
    throw Error("batch sizes overflow 64 bits: " + shown + "; check the batch settings");
  }
  return r;
}

// A directory the NVMe swapper will write into: created when missing, as DeepSpeed does; it
// must be a directory and take a new file (access() alone says yes to root on a read-only
// directory, so a probe file decides).
void check_nvme_dir(const std::string& key, const std::string& path, const std::string& source) {
  const std::string at = source + ": " + key + " = " + path + ": ";
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    std::error_code ec;
    std::filesystem::create_directories(path, ec);
    if (ec || ::stat(path.c_str(), &st) != 0) {
      throw Error(at + "does not exist and cannot be created (" +
                  (ec ? ec.message() : std::string(std::strerror(errno))) +
                  "); create the directory, or point nvme_path at a writable directory on an "
                  "NVMe drive");
    }
  }
  if (!S_ISDIR(st.st_mode)) {
    throw Error(at + "is not a directory; nvme_path names a directory for swap files");
  }
  if (::access(path.c_str(), W_OK | X_OK) != 0) {
    throw Error(at + "is not writable (" + std::strerror(errno) + "); fix its permissions or choose another directory");
  }
  std::string probe = path + "/.libzero-probe-XXXXXX";
  int fd = ::mkstemp(probe.data());
  if (fd < 0) {
    throw Error(at + "is not writable: creating a file there failed (" + std::strerror(errno) +
                "); fix its permissions or choose another directory");
  }
  ::close(fd);
  ::unlink(probe.c_str());
}

}  // namespace

DType grad_accum_dtype_for(GradAccumDType setting, DType compute, std::int64_t accumulation_steps,
                           BackendKind backend) {
  switch (setting) {
    case GradAccumDType::fp32: return DType::f32;
    case GradAccumDType::fp16: return DType::f16;
    case GradAccumDType::bf16: return DType::bf16;
    case GradAccumDType::automatic: break;
  }
  const bool sixteen_bit = compute != DType::f32;
  return backend == BackendKind::cuda && accumulation_steps > 1 && sixteen_bit ? DType::f32 : compute;
}

DType communication_dtype_for(CommDataType setting, DType compute, DType grad) {
  const bool names_compute = (setting == CommDataType::bf16 && compute == DType::bf16) ||
                             (setting == CommDataType::fp16 && compute == DType::f16);
  return names_compute && grad == DType::f32 ? compute : grad;
}

void Config::resolve(int world_size) {
  if (world_size < 1) {
    throw Error(
        fmt::format("Config::resolve: world size {} is not a number of ranks; pass the "
                    "data-parallel world size (>= 1)",
                    world_size));
  }
  const std::int64_t w = world_size;
  std::int64_t& tbs = train_batch_size;
  std::int64_t& mbs = train_micro_batch_size_per_gpu;
  std::int64_t& gas = gradient_accumulation_steps;
  auto val = [](std::int64_t v) { return v > 0 ? fmt::format("{}", v) : std::string("auto"); };
  const std::string shown = fmt::format(
      "train_batch_size={}, train_micro_batch_size_per_gpu={}, gradient_accumulation_steps={}, "
      "world size={}",
      val(tbs), val(mbs), val(gas), w);
  const std::string rule =
      "train_batch_size must equal train_micro_batch_size_per_gpu x gradient_accumulation_steps x "
      "world size";
  auto derive = [&](std::int64_t whole, std::int64_t part, const char* what) {
    if (whole % part != 0) {
      throw Error(
          fmt::format("{}: batch sizes do not divide: {}; {}, so {} would be {} / {}; "
                      "change train_batch_size or the other given number",
                      source, shown, rule, what, whole, part));
    }
    return whole / part;
  };
  std::string derived;
  if (tbs > 0 && mbs > 0 && gas > 0) {
    std::int64_t product = checked_mul(checked_mul(mbs, gas, shown), w, shown);
    if (product != tbs) {
      throw Error(
          fmt::format("{}: inconsistent batch sizes: {}; {} (= {}). Fix one of them, or "
                      "set one to \"auto\" to derive it",
                      source, shown, rule, product));
    }
  } else if (tbs > 0 && mbs > 0) {
    gas = derive(tbs, checked_mul(mbs, w, shown), "gradient_accumulation_steps");
    derived = "gradient_accumulation_steps derived";
  } else if (tbs > 0 && gas > 0) {
    mbs = derive(tbs, checked_mul(gas, w, shown), "train_micro_batch_size_per_gpu");
    derived = "train_micro_batch_size_per_gpu derived";
  } else if (mbs > 0 && gas > 0) {
    tbs = checked_mul(checked_mul(mbs, gas, shown), w, shown);
    derived = "train_batch_size derived";
  } else if (tbs > 0) {
    gas = 1;
    mbs = derive(tbs, w, "train_micro_batch_size_per_gpu");
    derived = "only train_batch_size given: gradient_accumulation_steps 1";
  } else if (mbs > 0) {
    gas = 1;
    tbs = checked_mul(mbs, w, shown);
    derived = "only train_micro_batch_size_per_gpu given: gradient_accumulation_steps 1";
  } else if (gas > 0) {
    mbs = 1;
    tbs = checked_mul(gas, w, shown);
    derived = "only gradient_accumulation_steps given: micro batch 1";
  } else {
    mbs = 1;
    gas = 1;
    tbs = w;
    derived = "no batch size given: micro batch 1, gradient_accumulation_steps 1";
  }
  // The engine and the trainers count micro batches and accumulation steps in int: a derived
  // value must fit there as a given one must (the key table's range says so for those).
  for (auto [name, v] :
       {std::pair{"train_micro_batch_size_per_gpu", mbs}, std::pair{"gradient_accumulation_steps", gas}}) {
    if (v > std::numeric_limits<int>::max()) {
      throw Error(
          fmt::format("{}: {} would be {} ({}), more than {} per step; check the batch "
                      "settings",
                      source, name, v, shown, std::numeric_limits<int>::max()));
    }
  }
  if (!derived.empty()) {
    for (auto& a : autos) {
      if (a.value == "derived" && (a.path == "train_batch_size" || a.path == "train_micro_batch_size_per_gpu" ||
                                   a.path == "gradient_accumulation_steps")) {
        const std::int64_t v =
            a.path == "train_batch_size" ? tbs : (a.path == "gradient_accumulation_steps" ? gas : mbs);
        a.value = fmt::format("{}", v);
        a.source = fmt::format("derived for world size {}", w);
      }
    }
    notes.push_back(
        fmt::format("batch: train_batch_size {} = train_micro_batch_size_per_gpu {} x "
                    "gradient_accumulation_steps {} x world size {} ({})",
                    tbs, mbs, gas, w, derived));
  }

  if (grad_accum_dtype == GradAccumDType::automatic) {
    const DType d = grad_dtype();
    if (communication_data_type == CommDataType::fp32 && d != DType::f32 && zero_optimization.stage <= 1) {
      notes.push_back(
          fmt::format("communication_data_type = fp32: handled differently here: gradients accumulate in {} "
                      "(data_types.grad_accum_dtype: auto) and are reduced in it; set grad_accum_dtype: fp32 to "
                      "reduce in fp32",
                      dtype_name(d)));
    }
    grad_accum_dtype = d == DType::f32   ? GradAccumDType::fp32
                       : d == DType::f16 ? GradAccumDType::fp16
                                         : GradAccumDType::bf16;
    if (d != compute_dtype()) {
      const char* own = compute_dtype() == DType::f16 ? "fp16" : "bf16";  // as the key spells it
      notes.push_back(fmt::format(
          "data_types.grad_accum_dtype: fp32 (the CUDA backend's default with gradient_accumulation_steps {} > 1 "
          "and {} compute: a 16-bit sum over many micro-steps loses the low bits of the later ones; set it to {} "
          "to accumulate in {} instead)",
          gas, own, own, own));
    }
  }

  const auto& z = zero_optimization;
  if (z.offload_optimizer.device == OffloadDevice::nvme) {
    check_nvme_dir("zero_optimization.offload_optimizer.nvme_path", z.offload_optimizer.nvme_path, source);
  }
  if (z.offload_param.device == OffloadDevice::nvme) {
    check_nvme_dir("zero_optimization.offload_param.nvme_path", z.offload_param.nvme_path, source);
  }
  resolved = true;
}

std::string Config::to_yaml() const {
  YAML::Emitter out;
  out << YAML::BeginMap;
  std::vector<std::string> open;              // the sections being written, outermost first
  Config& self = const_cast<Config&>(*this);  // slots are only read here
  for (const auto& s : keys::config_keys()) {
    if ((s.inapplicable && !s.inapplicable(*this).empty()) || (s.omitted && s.omitted(*this))) {
      continue;
    }
    std::vector<std::string> parts;
    for (std::size_t b = 0;;) {
      auto e = s.path.find('.', b);
      parts.emplace_back(s.path.substr(b, e == std::string_view::npos ? s.path.npos : e - b));
      if (e == std::string_view::npos) break;
      b = e + 1;
    }
    std::size_t common = 0;
    while (common < open.size() && common + 1 < parts.size() && open[common] == parts[common]) {
      ++common;
    }
    for (; open.size() > common; open.pop_back()) out << YAML::EndMap;
    for (; open.size() + 1 < parts.size(); open.push_back(parts[open.size()])) {
      out << YAML::Key << parts[open.size()] << YAML::Value << YAML::BeginMap;
    }
    out << YAML::Key << parts.back() << YAML::Value;
    std::visit(
        [&](auto p) {
          using P = decltype(p);
          if constexpr (std::is_same_v<P, int*> || std::is_same_v<P, std::int64_t*>) {
            // 0 in the batch triple: "auto" until resolve().
            if (s.auto_rule == keys::Auto::derived && *p == 0) {
              out << "auto";
            } else {
              out << static_cast<long long>(*p);
            }
          } else if constexpr (std::is_same_v<P, bool*>) {
            out << *p;
          } else if constexpr (std::is_same_v<P, keys::PairRef>) {
            out << YAML::Flow << YAML::BeginSeq << shortest_text(*p.first) << shortest_text(*p.second) << YAML::EndSeq;
          } else {
            out << keys::value_text(s, *this);
          }
        },
        s.slot(self));
  }
  for (; !open.empty(); open.pop_back()) out << YAML::EndMap;
  for (const auto& [name, yaml] : extra_sections) {
    out << YAML::Key << name << YAML::Value
        << parse_yaml(yaml, (source.empty() ? "config" : source) + " (section " + name + ")");
  }
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

std::string Config::auto_block() const {
  if (autos.empty()) return "";
  std::string out = "\"auto\" values:\n";
  for (const auto& a : autos) out += "  " + a.path + " = " + a.value + " (" + a.source + ")\n";
  return out;
}

namespace {

// What "auto" means for a key, for docs/configuration.md and --help.
std::string auto_text(const keys::Spec& s) {
  switch (s.auto_rule) {
    case keys::Auto::none: return "";
    case keys::Auto::derived: return "`auto`: derived from the other two and the world size.";
    case keys::Auto::required: return "`auto`: the run length the application passes.";
    case keys::Auto::fallback: break;
  }
  return "`auto`: the application's value, else " +
         (s.auto_from.empty() ? std::string("the default") : "`" + std::string(s.auto_from) + "`") + ".";
}

std::string foreign_list(keys::Policy policy) {
  std::string out;
  for (const auto& f : keys::foreign_keys()) {
    const bool listed =
        policy == keys::Policy::silent ? (f.policy == policy || !f.inert.empty() || f.inert_if) : f.policy == policy;
    if (!listed) continue;
    std::string line = "- `" + std::string(f.path) + "`";
    for (auto a : f.aliases) line += " (or `" + std::string(a) + "`)";
    // "false|0" -> "`false` or `0`"
    std::string inert;
    for (std::size_t b = 0; b < f.inert.size();) {
      auto e = std::min(f.inert.find('|', b), f.inert.size());
      inert += (inert.empty() ? "`" : " or `") + std::string(f.inert.substr(b, e - b)) + "`";
      b = e + 1;
    }
    if (policy == keys::Policy::silent && f.policy != keys::Policy::silent) {
      line += f.inert_if ? " when it " + std::string(f.inert_when) : " when " + inert;
    } else if (policy != keys::Policy::silent && f.inert_if) {
      line += " unless it " + std::string(f.inert_when);
    } else if (policy != keys::Policy::silent && !inert.empty()) {
      line += " other than " + inert;
    }
    if (f.policy == policy) line += ": " + std::string(f.why);
    out += line + "\n";
  }
  return out;
}

}  // namespace

std::string config_reference_markdown() {
  std::string out = "| Key | Type | Default | Meaning |\n|---|---|---|---|\n";
  for (const auto& s : keys::config_keys()) {
    std::string meaning(s.doc);
    if (std::string a = auto_text(s); !a.empty()) meaning += " " + a;
    for (auto alias : s.aliases) meaning += " Also spelt `" + std::string(alias) + "`.";
    out += "| `" + std::string(s.path) + "` | " + keys::type_text(s) + " | " + keys::default_text(s) + " | " + meaning +
           " |\n";
  }
  out +=
      "\nKeys and sections that DeepSpeed reads as not set when they are null (JSON `null`, YAML "
      "`~` or no value), so their default applies, with a note at start: ";
  std::string nulls;
  for (const auto& s : keys::config_keys())
    if (s.null_is_default) nulls += (nulls.empty() ? "`" : ", `") + std::string(s.path) + "`";
  for (auto p : keys::null_default_sections()) nulls += ", `" + std::string(p) + "` (the section)";
  out += nulls +
         ". Any other key of the table, or section, set to null is an error that says to remove it for "
         "the default; in the lists below null is a value other than those named.\n";
  out += "\nDeepSpeed keys accepted silently (no effect here, or libzero does it anyway):\n\n";
  out += foreign_list(keys::Policy::silent);
  out += "\nDeepSpeed keys that get one note at start (libzero does it another way):\n\n";
  out += foreign_list(keys::Policy::note);
  out +=
      "\nDeepSpeed keys and values that are errors (honouring them would change the training "
      "result, and libzero cannot):\n\n";
  out += foreign_list(keys::Policy::refused);
  for (const auto& s : keys::config_keys()) {
    for (const auto& [value, why] : s.refused_values) {
      out += "- `" + std::string(s.path) + ": " + std::string(value) + "`: " + std::string(why) + "\n";
    }
  }
  return out;
}

std::string config_keys_help() {
  std::string out;
  for (const auto& s : keys::config_keys()) {
    std::string type = keys::type_text(s), def = keys::default_text(s);
    std::erase(type, '`');
    std::erase(type, '\\');  // the Markdown escape of '|'
    std::erase(def, '`');
    std::string line = "  " + std::string(s.path);
    line += std::string(line.size() < 56 ? 56 - line.size() : 1, ' ');
    out += line + type + " (default " + def + ")\n";
  }
  return out;
}

}  // namespace zero
