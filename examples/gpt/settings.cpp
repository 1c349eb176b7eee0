// What is done with the table of settings_keys.cpp: the defaults, the strict reading (with the
// rules that need several keys at once), the resolved sections, --help and the Markdown table.
#include "gpt/settings.hpp"

#include <fmt/format.h>

#include <charconv>
#include <limits>
#include <type_traits>

#include "gpt/settings_keys.hpp"
#include "gpt/tensor_parallel.hpp"
#include "zero/error.hpp"

namespace zero::gpt {

namespace {

using keys::Key;
using keys::Slot;

// A double-quoted YAML scalar: safe for globs ("*" would start an alias) and paths. Control
// bytes are escaped (a raw newline in a quoted scalar reads back as a space), so the saved
// config says exactly what ran.
std::string quoted(const std::string& s) {
  std::string q = "\"";
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      q += '\\';
      q += ch;
    } else if (c == '\n') {
      q += "\\n";
    } else if (c < 0x20 || c == 0x7f) {
      q += fmt::format("\\x{:02x}", c);
    } else {
      q += ch;
    }
  }
  return q + "\"";
}

// The shortest text that reads back as the same double.
std::string number(double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

// The bounds an integer key accepts: its range clipped to the member's type (a uint64 member, a
// seed, to what get_int reads: int64's non-negative values).
template <class T>
std::pair<std::int64_t, std::int64_t> integer_bounds(const Key& k) {
  constexpr auto type_lo = static_cast<std::int64_t>(std::numeric_limits<T>::min());
  constexpr std::int64_t type_hi = std::is_same_v<T, std::uint64_t>
                                       ? std::numeric_limits<std::int64_t>::max()
                                       : static_cast<std::int64_t>(std::numeric_limits<T>::max());
  const std::int64_t lo = k.range.lo <= static_cast<double>(type_lo) ? type_lo : static_cast<std::int64_t>(k.range.lo);
  const std::int64_t hi = k.range.hi >= static_cast<double>(type_hi) ? type_hi : static_cast<std::int64_t>(k.range.hi);
  return {lo, hi};
}

// The key's value as the resolved section writes it: a path or glob quoted, a choice as it is.
std::string value_text(const Key& k, const GptSettings& settings) {
  auto& s = const_cast<GptSettings&>(settings);  // slots only read here
  return std::visit(
      [&](auto p) -> std::string {
        using P = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<P, double>)
          return number(*p);
        else if constexpr (std::is_same_v<P, bool>)
          return *p ? "true" : "false";
        else if constexpr (std::is_same_v<P, std::string>)
          return k.choices.empty() ? quoted(*p) : *p;
        else
          return fmt::format("{}", *p);
      },
      k.slot(s));
}

void set_default(const Key& k, GptSettings& s) {
  if (k.dynamic_default) k.dynamic_default(s);
  if (std::holds_alternative<std::monostate>(k.def)) return;
  std::visit(
      [&](auto p) {
        using P = std::remove_pointer_t<decltype(p)>;
        using V = std::conditional_t<std::is_integral_v<P> && !std::is_same_v<P, bool>, std::int64_t,
                                     std::conditional_t<std::is_same_v<P, std::string>, std::string_view, P>>;
        if (!std::holds_alternative<V>(k.def))
          ZERO_THROW(
              fmt::format("settings_keys.cpp: the default of {}.{} is not of its member's kind", k.section, k.name));
        *p = static_cast<P>(std::get<V>(k.def));
      },
      k.slot(s));
}

void read_key(zero::StrictSection& section, const Key& k, GptSettings& s) {
  if (!k.retired.empty()) {
    section.reject(k.name, k.retired);
    return;
  }
  if (k.dynamic_default) k.dynamic_default(s);
  std::visit(
      [&](auto p) {
        using P = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<P, double>) {
          *p = section.get_double(k.name, *p, k.range);
        } else if constexpr (std::is_same_v<P, bool>) {
          *p = section.get_bool(k.name, *p);
        } else if constexpr (std::is_same_v<P, std::string>) {
          *p = k.choices.empty() ? section.get_string(k.name, *p) : section.get_choice(k.name, *p, k.choices);
        } else {
          const auto [lo, hi] = integer_bounds<P>(k);
          *p = static_cast<P>(section.get_int(k.name, static_cast<std::int64_t>(*p), lo, hi));
        }
      },
      k.slot(s));
  if (k.then) k.then(s);
  if (k.check)
    if (const std::string problem = k.check(s); !problem.empty()) section.fail(k.name, problem);
}

// With backend: cuda the model runs on CudaOps (cuda/cuda_ops.hpp, loaded from libzero_gpt_cuda
// by cuda_library.hpp), which compute in bf16 on the engine's device storage: the engine's
// compute dtype must be the same.
void check_backend(const zero::Config& cfg) {
  if (cfg.backend != zero::BackendKind::cuda) return;
#if !ZERO_GPT_CUDA
  ZERO_THROW(
      "zero-gpt: backend: cuda, but this build has no CUDA support (configure with "
      "-DZERO_CUDA=ON on a machine with the CUDA toolkit), or set backend: host");
#endif
  ZERO_CHECK(cfg.compute_dtype() == zero::DType::bf16,
             fmt::format("zero-gpt: backend: cuda trains in bf16 (the GPT CUDA kernels take bf16 parameters, "
                         "gradients and activations), but the config computes in {}; set bf16.enabled: true{}",
                         zero::dtype_name(cfg.compute_dtype()), cfg.fp16.enabled ? " and fp16.enabled: false" : ""));
}

// The model section's rules over several keys, each failing on the key to change.
void check_model(zero::StrictSection& m, const GptSettings& s, const zero::Config& cfg) {
  const GptConfig& c = s.model;
  if (c.n_embd % c.n_head != 0)
    m.fail(m.has("n_head") ? "n_head" : "n_embd",
           fmt::format("n_embd = {} is not divisible by n_head = {}; pick n_head among the divisors of n_embd",
                       c.n_embd, c.n_head));
  try {
    c.validate();
  } catch (const zero::Error& e) {
    // The shape's own rules (grouped-query heads, an untied head outside llama, ...): the key
    // most likely given by hand.
    const char* key = m.has("n_kv_head")             ? "n_kv_head"
                      : m.has("tie_word_embeddings") ? "tie_word_embeddings"
                      : m.has("arch")                ? "arch"
                                                     : "preset";
    m.fail(key, std::string("describes a model that cannot be built: ") + e.what());
  }
  try {
    check_tensor_parallel(c, s.tensor_parallel);
  } catch (const zero::Error& e) {
    m.fail("tensor_parallel", e.what());
  }
  // backend: cuda multiplies bf16 rows through cuBLASLt, which needs every row 16-byte
  // aligned: a tensor rank's widths (n_embd / T, its q, k and v columns, its MLP width) and its part of the
  // padded vocabulary must be multiples of 8 elements. Said here, naming the keys, rather than
  // by the first product with a width the user never set.
  const int T = s.tensor_parallel;
  if (cfg.backend == zero::BackendKind::cuda && c.n_embd % c.n_head == 0 && c.n_head % T == 0) {
    if ((c.n_embd / T) % 8 != 0)
      m.fail(m.has("n_embd") || T == 1 ? "n_embd" : "tensor_parallel",
             fmt::format("backend: cuda needs n_embd / tensor_parallel ({} / {}) to be a multiple of 8: its bf16 "
                         "matrix rows must be 16-byte aligned; choose n_embd a multiple of 8 x tensor_parallel "
                         "({}){}",
                         c.n_embd, T, 8 * T, T > 1 ? " or a smaller tensor_parallel" : ""));
    else if (c.padded_vocab_size() % T == 0 && (c.padded_vocab_size() / T) % 8 != 0)
      m.fail("tensor_parallel",
             fmt::format("backend: cuda needs each tensor rank's part of the padded vocabulary ({} / {} ids) to "
                         "be a multiple of 8: its logits rows must be 16-byte aligned; choose tensor_parallel "
                         "dividing {}",
                         c.padded_vocab_size(), T, c.padded_vocab_size() / 8));
    else if ((c.qkv_width() / T) % 8 != 0)
      m.fail(m.has("n_kv_head") ? "n_kv_head" : "n_head",
             fmt::format("backend: cuda needs each tensor rank's q, k and v columns ({} / {}) to be a multiple of 8 "
                         "(16-byte bf16 rows); choose heads whose size is a multiple of 8",
                         c.qkv_width(), T));
    else if ((c.mlp_hidden() / T) % 8 != 0)
      m.fail("ffn_hidden", fmt::format("backend: cuda needs each tensor rank's MLP width ({} / {}) to be a multiple "
                                       "of 8 (16-byte bf16 rows); choose ffn_hidden a multiple of 8 x tensor_parallel",
                                       c.mlp_hidden(), T));
  }
  if (s.pipeline_parallel > c.n_layer)
    m.fail("pipeline_parallel", fmt::format("{} parts for {} blocks (n_layer): every part needs at least one "
                                            "block; use at most {}",
                                            s.pipeline_parallel, c.n_layer, c.n_layer));
}

// The default as --help and the table show it: the fixed value (a path or glob unquoted, an
// empty one as ""), or what it follows.
std::string default_text(const Key& k) {
  if (!k.default_text.empty()) return std::string(k.default_text);
  const std::string v = value_text(k, GptSettings());
  return v.size() > 2 && v.front() == '"' ? v.substr(1, v.size() - 2) : v;
}

// "integer 1..4096", "number >= 0", "bool", "string", or the choices.
std::string type_text(const Key& k) {
  GptSettings probe;
  return std::visit(
      [&](auto p) -> std::string {
        using P = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<P, double>) {
          return "number " + k.range.describe();
        } else if constexpr (std::is_same_v<P, bool>) {
          return "bool";
        } else if constexpr (std::is_same_v<P, std::string>) {
          return k.choices.empty() ? "string" : fmt::format("`{}`", fmt::join(k.choices, "` \\| `"));
        } else {
          const auto [lo, hi] = integer_bounds<P>(k);
          return hi == std::numeric_limits<std::int64_t>::max() ? fmt::format("integer >= {}", lo)
                                                                : fmt::format("integer {}..{}", lo, hi);
        }
      },
      k.slot(probe));
}

// `text` in lines of at most `width` columns, each after `indent` spaces but the first.
std::string wrapped(const std::string& text, std::size_t indent, std::size_t width) {
  std::string out, line;
  std::size_t at = 0;
  while (at < text.size()) {
    std::size_t end = text.find(' ', at);
    if (end == std::string::npos) end = text.size();
    const std::string word = text.substr(at, end - at);
    if (!line.empty() && indent + line.size() + 1 + word.size() > width) {
      out += line + "\n" + std::string(indent, ' ');
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
    at = end + 1;
  }
  return out + line;
}

}  // namespace

GptSettings::GptSettings() {
  for (const Key& k : keys::gpt_keys()) {
    if (!k.retired.empty()) continue;
    set_default(k, *this);
    if (k.then) k.then(*this);
  }
}

const std::vector<std::string>& gpt_sections() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const Key& k : keys::gpt_keys())
      if (n.empty() || n.back() != k.section) n.emplace_back(k.section);
    return n;
  }();
  return names;
}

GptSettings read_gpt_settings(const zero::Config& cfg) {
  check_backend(cfg);
  GptSettings s;
  for (const std::string& name : gpt_sections()) {
    zero::StrictSection section = zero::extra_section(cfg, name);
    for (const Key& k : keys::gpt_keys())
      if (k.section == name) read_key(section, k, s);
    if (name == "model") check_model(section, s, cfg);
    section.finish();
  }
  return s;
}

std::map<std::string, std::string> GptSettings::sections() const {
  std::map<std::string, std::string> out;
  for (const Key& k : keys::gpt_keys()) {
    if (!k.retired.empty() || (k.omitted && k.omitted(*this))) continue;
    out[std::string(k.section)] += fmt::format("{}: {}\n", k.name, value_text(k, *this));
  }
  return out;
}

std::string gpt_settings_help() {
  constexpr std::size_t kColumn = 31, kWidth = 92;
  std::string out = "Trainer sections of the config file (next to the engine's DeepSpeed-style keys):\n";
  std::string_view section;
  for (const Key& k : keys::gpt_keys()) {
    if (!k.retired.empty()) continue;
    if (k.section != section) out += fmt::format("{}:\n", section = k.section);
    std::string key = fmt::format("  {}: {}", k.name, default_text(k));
    std::erase(key, '`');
    out += fmt::format("{:<{}}{}\n", key, key.size() < kColumn - 1 ? kColumn : key.size() + 2,
                       wrapped(k.doc, kColumn, kWidth));
  }
  return out;
}

std::string gpt_settings_reference_markdown() {
  std::string out = "| Key | Type | Default | Meaning |\n|---|---|---|---|\n";
  std::string retired;
  for (const Key& k : keys::gpt_keys()) {
    if (!k.retired.empty()) {
      retired += fmt::format("- `{}.{}` {}\n", k.section, k.name, k.retired);
      continue;
    }
    std::string def = default_text(k);
    if (k.default_text.empty()) def = "`" + def + "`";
    out += fmt::format("| `{}.{}` | {} | {} | {} |\n", k.section, k.name, type_text(k), def, k.doc);
  }
  return retired.empty() ? out : out + "\nRetired keys, errors that say what replaced them:\n\n" + retired;
}

int gpt_data_parallel_size(const GptSettings& settings, int world_size) {
  const int T = settings.tensor_parallel, P = settings.pipeline_parallel;
  ZERO_CHECK(T >= 1 && P >= 1 && world_size % (T * P) == 0,
             fmt::format("zero-gpt: {} ranks cannot form groups of model.tensor_parallel = {} x pipeline_parallel = {} "
                         "ranks; run a multiple of {} ranks (tensor x pipeline x data-parallel), or change the sizes",
                         world_size, T, P, T * P));
  return world_size / (T * P);
}

}  // namespace zero::gpt
