#include "gpt/gpt_config.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numbers>

#include "zero/error.hpp"
#include "zero/plan/plan.hpp"
#include "zero/util/strings.hpp"

namespace zero::gpt {

namespace {

struct Preset {
  const char* name;
  GptConfig cfg;
};

GptConfig make(int n_layer, int n_head, int n_embd, int seq_len, int vocab) {
  GptConfig c;
  c.n_layer = n_layer;
  c.n_head = n_head;
  c.n_embd = n_embd;
  c.seq_len = seq_len;
  c.vocab_size = vocab;
  return c;
}

// "tiny" is sized for the README's first command: two ranks on a 2-core machine must reach
// a validation loss under 2.0 nats/char on tiny Shakespeare in a few minutes.
const std::vector<Preset>& presets() {
  static const std::vector<Preset> p = {
      {"tiny", make(4, 4, 128, 64, 256)},
      {"gpt2", make(12, 12, 768, 1024, 50257)},
      {"gpt2-medium", make(24, 16, 1024, 1024, 50257)},
      {"gpt2-large", make(36, 20, 1280, 1024, 50257)},
      {"gpt2-xl", make(48, 25, 1600, 1024, 50257)},
  };
  return p;
}

// FNV-1a: a stable hash of the parameter name, so the stream a tensor draws from does not
// depend on how many tensors came before it (or on which rank asks).
std::uint64_t fnv1a(std::string_view s) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

struct SplitMix64 {
  std::uint64_t state;
  std::uint64_t next() {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in (0, 1]: never 0, so log() below is finite.
  double uniform() { return (static_cast<double>(next() >> 11) + 1.0) * 0x1p-53; }
};

}  // namespace

void GptConfig::validate() const {
  auto need = [](bool ok, const std::string& what) {
    if (!ok) ZERO_THROW("GPT model config: " + what);
  };
  need(n_layer >= 1, fmt::format("n_layer must be >= 1 (got {})", n_layer));
  need(n_head >= 1, fmt::format("n_head must be >= 1 (got {})", n_head));
  need(n_embd >= 1, fmt::format("n_embd must be >= 1 (got {})", n_embd));
  need(n_embd % n_head == 0, fmt::format("n_embd ({}) must be divisible by n_head ({}); choose n_head among the "
                                         "divisors of n_embd",
                                         n_embd, n_head));
  need(seq_len >= 1, fmt::format("seq_len must be >= 1 (got {})", seq_len));
  need(vocab_size >= 2 && vocab_size <= 65536,
       fmt::format("vocab_size must be in [2, 65536] (tokens are stored as uint16; got {})", vocab_size));
}

std::int64_t GptConfig::num_params() const {
  std::int64_t n = 0;
  for (const auto& u : gpt_units(*this))
    for (const auto& t : u.tensors) n += t.numel();
  return n;
}

std::string GptConfig::describe() const {
  return fmt::format("n_layer={} n_head={} n_embd={} seq_len={} vocab={} (padded {}) params={:.2f}M{}", n_layer, n_head,
                     n_embd, seq_len, vocab_size, padded_vocab_size(), static_cast<double>(num_params()) / 1e6,
                     activation_checkpointing ? " activation_checkpointing" : "");
}

const std::vector<std::string>& gpt_preset_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const auto& p : presets()) n.emplace_back(p.name);
    return n;
  }();
  return names;
}

GptConfig gpt_preset(std::string_view name) {
  for (const auto& p : presets())
    if (name == p.name) return p.cfg;
  ZERO_THROW(
      fmt::format("unknown GPT preset '{}'{}; choose one of: {}, or give n_layer / n_head / n_embd / seq_len "
                  "/ vocab_size explicitly",
                  name, did_you_mean(name, gpt_preset_names()), fmt::join(gpt_preset_names(), ", ")));
}

std::int64_t TensorSpec::numel() const {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

// The shapes come from the library's GPT layout (zero/plan/plan.hpp), the one the planner counts,
// so the trainer and zero-plan cannot disagree about what a GPT holds.
zero::plan::GptShape GptConfig::plan_shape() const {
  zero::plan::GptShape shape;
  shape.n_layer = n_layer;
  shape.n_head = n_head;
  shape.n_embd = n_embd;
  shape.seq_len = seq_len;
  shape.vocab_size = vocab_size;
  return shape;
}

zero::Layout build_layout(const GptConfig& cfg) {
  cfg.validate();
  zero::Layout layout = zero::plan::gpt_layout(cfg.plan_shape());
  // As GPT-2, nanoGPT and llm.c: weight decay on the matrices and the embeddings (wte, wpe),
  // not on biases or LayerNorm parameters.
  layout.decay_matrices_only();
  return layout;
}

std::vector<UnitSpec> gpt_units(const GptConfig& cfg) {
  const zero::Layout layout = build_layout(cfg);
  std::vector<UnitSpec> units;
  for (const zero::UnitInfo& u : layout.units()) {
    UnitSpec spec{u.name, {}};
    for (const zero::ParamInfo& p : u.params) spec.tensors.push_back({p.name, p.shape});
    units.push_back(std::move(spec));
  }
  return units;
}

void init_parameter(const GptConfig& cfg, std::string_view name, std::span<float> values, std::uint64_t seed) {
  if (name.ends_with(".bias")) {
    std::fill(values.begin(), values.end(), 0.0f);
    return;
  }
  if (name.ends_with("ln_1.weight") || name.ends_with("ln_2.weight") || name == "ln_f.weight") {
    std::fill(values.begin(), values.end(), 1.0f);
    return;
  }
  double std_dev = 0.02;
  // GPT-2 scales the projections that write into the residual stream so the stream's variance
  // does not grow with depth (two such writes per block).
  if (name.ends_with("attn.c_proj.weight") || name.ends_with("mlp.c_proj.weight"))
    std_dev /= std::sqrt(2.0 * cfg.n_layer);
  std::size_t n = values.size();
  if (name == "wte.weight") {
    // Padded ids never occur and get no gradient; zero rows keep them inert in sampling too.
    std::size_t real = static_cast<std::size_t>(cfg.vocab_size) * cfg.n_embd;
    std::fill(values.begin() + static_cast<std::ptrdiff_t>(std::min(real, n)), values.end(), 0.0f);
    n = std::min(real, n);
  }
  SplitMix64 rng{seed ^ fnv1a(name)};
  // Box-Muller, both outputs used.
  for (std::size_t i = 0; i < n; i += 2) {
    double r = std::sqrt(-2.0 * std::log(rng.uniform()));
    double a = 2.0 * std::numbers::pi * rng.uniform();
    values[i] = static_cast<float>(std_dev * r * std::cos(a));
    if (i + 1 < n) values[i + 1] = static_cast<float>(std_dev * r * std::sin(a));
  }
}

}  // namespace zero::gpt
