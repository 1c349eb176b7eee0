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

// The CPU demos: "tiny" is sized for the README's first command (two ranks on a 2-core machine
// reach a validation loss under 2.0 nats/char on tiny Shakespeare in a few minutes); the llama
// and bloom ones have about its parameter count (llama: 2 key/value heads, an untied head;
// bloom: 8 heads).
const std::vector<GptConfig>& demo_presets() {
  static const std::vector<GptConfig> p = [] {
    GptConfig tiny;
    tiny.name = "tiny";
    GptConfig llama = tiny;
    llama.name = "llama-tiny";
    llama.arch = zero::plan::Arch::llama;
    llama.n_kv_head = 2;
    llama.ffn_hidden = 352;
    llama.tied_head = false;
    // 8 heads of 16: ALiBi's slopes for 8 heads run from 1/2 to 1/256, for 4 from 1/4 to 1/256,
    // and the more heads the more distinct ranges the model mixes (the demo's validation loss
    // after 1000 steps: 1.79 with 8 heads, 1.86 with 4 and 2.06 with 2; bench/RESULTS.md).
    GptConfig bloom = tiny;
    bloom.name = "bloom-tiny";
    bloom.arch = zero::plan::Arch::bloom;
    bloom.n_head = 8;
    return std::vector<GptConfig>{tiny, llama, bloom};
  }();
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
  zero::plan::GptShape::validate();
  ZERO_CHECK(vocab_size >= 2 && vocab_size <= (1 << 24),
             fmt::format("GPT model config: vocab_size must be in [2, 2^24] (got {})", vocab_size));
}

std::string GptConfig::describe() const {
  return fmt::format("{} n_layer={} n_head={}{} n_embd={}{} seq_len={} vocab={} (padded {}) params={:.2f}M{}",
                     zero::plan::arch_name(arch), n_layer, n_head,
                     kv_heads() != n_head ? fmt::format(" (kv {})", kv_heads()) : "", n_embd,
                     mlp_hidden() != 4 * n_embd ? fmt::format(" ffn={}", mlp_hidden()) : "", seq_len, vocab_size,
                     padded_vocab_size(), static_cast<double>(num_params()) / 1e6,
                     activation_checkpointing ? " activation_checkpointing" : "");
}

const std::vector<std::string>& gpt_preset_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const auto& p : demo_presets()) n.push_back(p.name);
    for (const auto& p : zero::plan::gpt_presets()) n.push_back(p.name);
    return n;
  }();
  return names;
}

GptConfig gpt_preset(std::string_view name) {
  for (const auto& p : demo_presets())
    if (name == p.name) return p;
  for (const auto& p : zero::plan::gpt_presets())
    if (name == p.name) return GptConfig(p);
  ZERO_THROW(
      fmt::format("unknown model preset '{}'{}; choose one of: {}, or give n_layer / n_head / n_embd / seq_len "
                  "/ vocab_size explicitly",
                  name, did_you_mean(name, gpt_preset_names()), fmt::join(gpt_preset_names(), ", ")));
}

std::int64_t TensorSpec::numel() const {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

zero::Layout build_layout(const GptConfig& cfg) {
  cfg.validate();
  zero::Layout layout = zero::plan::gpt_layout(cfg.plan_shape());
  // As GPT-2, nanoGPT, llm.c and the Llama recipes: weight decay on the matrices and the
  // embeddings (wte, wpe, lm_head), not on biases or norm weights.
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

TensorSlots tensor_slots(const GptConfig& cfg) {
  const zero::Layout layout = build_layout(cfg);
  TensorSlots slots;
  slots.block.fill(-1);
  slots.embeddings.fill(-1);
  slots.ln_f.fill(-1);
  // The name after the unit's prefix ("h.0.") for each role, in enum order.
  static constexpr const char* kBlock[] = {
      "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight", "attn.c_proj.bias",
      "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight",    "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};
  static constexpr const char* kEmb[] = {"wte.weight", "wpe.weight", "ln_e.weight", "ln_e.bias"};
  static constexpr const char* kLnf[] = {"ln_f.weight", "ln_f.bias", "lm_head.weight"};
  auto find = [](const zero::UnitInfo& u, std::string_view suffix) {
    for (std::size_t i = 0; i < u.params.size(); ++i)
      if (std::string_view(u.params[i].name).ends_with(suffix) &&
          (u.params[i].name.size() == suffix.size() ||
           u.params[i].name[u.params[i].name.size() - suffix.size() - 1] == '.'))
        return static_cast<int>(i);
    return -1;
  };
  for (int r = 0; r < kBlockTensors; ++r)
    slots.block[static_cast<std::size_t>(r)] = find(layout.unit(block_unit(0)), kBlock[r]);
  for (int r = 0; r < kEmbeddingTensors; ++r)
    slots.embeddings[static_cast<std::size_t>(r)] = find(layout.unit(embeddings_unit()), kEmb[r]);
  for (int r = 0; r < kLnfTensors; ++r)
    slots.ln_f[static_cast<std::size_t>(r)] = find(layout.unit(ln_f_unit(cfg)), kLnf[r]);
  return slots;
}

void init_parameter(const GptConfig& cfg, std::string_view name, std::span<float> values, std::uint64_t seed) {
  if (name.ends_with(".bias")) {
    std::fill(values.begin(), values.end(), 0.0f);
    return;
  }
  if (name.ends_with("ln_1.weight") || name.ends_with("ln_2.weight") || name == "ln_f.weight" ||
      name == "ln_e.weight") {
    std::fill(values.begin(), values.end(), 1.0f);
    return;
  }
  double std_dev = 0.02;
  // GPT-2 scales the projections that write into the residual stream so the stream's variance
  // does not grow with depth (two such writes per block).
  if (name.ends_with("attn.c_proj.weight") || name.ends_with("mlp.c_proj.weight"))
    std_dev /= std::sqrt(2.0 * cfg.n_layer);
  std::size_t n = values.size();
  if (name == "wte.weight" || name == "lm_head.weight") {
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
