// GPT shapes for planning: presets, the trainer's unit structure, shape families and the
// trainer's activation memory.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "runtime/strings.hpp"
#include "zero/error.hpp"
#include "zero/plan.hpp"

namespace zero::plan {

namespace {

GptShape make(const char* name, int layers, int heads, int embd, int seq, int vocab) {
  return GptShape{name, layers, heads, embd, seq, vocab};
}

}  // namespace

void GptShape::validate() const {
  // 2^24 bounds every field far above any real model and keeps products of two in int64 (a
  // shape read from a checkpoint or a config.json is not trusted).
  auto positive = [this](int v, const char* field) {
    ZERO_CHECK(v > 0 && v <= (1 << 24), fmt::format("GPT shape{}: {} must be in [1, 2^24] (got {})",
                                                   name.empty() ? std::string() : fmt::format(" '{}'", name), field, v));
  };
  positive(n_layer, "n_layer");
  positive(n_head, "n_head");
  positive(n_embd, "n_embd");
  positive(seq_len, "seq_len");
  positive(vocab_size, "vocab_size");
  ZERO_CHECK(n_embd % n_head == 0,
             fmt::format("GPT shape: n_embd {} is not a multiple of n_head {}; pick a head count that divides the width",
                         n_embd, n_head));
}

std::int64_t GptShape::num_params() const {
  const std::int64_t C = n_embd;
  const std::int64_t block = 12 * C * C + 13 * C;  // qkv, proj, fc, fc proj + their biases + 2 LayerNorms
  return padded_vocab() * C + static_cast<std::int64_t>(seq_len) * C + n_layer * block + 2 * C;
}

const std::vector<GptShape>& gpt_presets() {
  static const std::vector<GptShape> presets = {
      make("gpt2", 12, 12, 768, 1024, 50257),
      make("gpt2-medium", 24, 16, 1024, 1024, 50257),
      make("gpt2-large", 36, 20, 1280, 1024, 50257),
      make("gpt2-xl", 48, 25, 1600, 1024, 50257),
      // BLOOM-7b1's sizes (its ALiBi has no position table; the difference is 4M parameters).
      make("bloom-7b", 30, 32, 4096, 1024, 250880),
      make("gpt3-6.7b", 32, 32, 4096, 2048, 50257),
      make("gpt3-13b", 40, 40, 5120, 2048, 50257),
      make("gpt-52b", 64, 64, 8192, 1024, 50257),
      make("gpt3-175b", 96, 96, 12288, 2048, 50257),
  };
  return presets;
}

GptShape gpt_preset(std::string_view name) {
  std::vector<std::string> names;
  for (const auto& p : gpt_presets()) {
    if (p.name == name) return p;
    names.push_back(p.name);
  }
  std::string msg = "unknown GPT preset '" + std::string(name) + "'" + did_you_mean(name, names);
  std::string list;
  for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
  ZERO_THROW(msg + "; choose one of: " + list + ", or give --n-layer/--n-head/--n-embd, or --params");
}

Layout gpt_layout(const GptShape& s) {
  s.validate();
  const std::int64_t C = s.n_embd;
  Layout layout;
  layout.add_unit("embeddings", {{"wte.weight", {s.padded_vocab(), C}}, {"wpe.weight", {s.seq_len, C}}});
  for (int l = 0; l < s.n_layer; ++l) {
    const std::string unit = fmt::format("h.{}", l), p = unit + ".";
    layout.add_unit(unit, {{p + "ln_1.weight", {C}},
                            {p + "ln_1.bias", {C}},
                            {p + "attn.c_attn.weight", {C, 3 * C}},
                            {p + "attn.c_attn.bias", {3 * C}},
                            {p + "attn.c_proj.weight", {C, C}},
                            {p + "attn.c_proj.bias", {C}},
                            {p + "ln_2.weight", {C}},
                            {p + "ln_2.bias", {C}},
                            {p + "mlp.c_fc.weight", {C, 4 * C}},
                            {p + "mlp.c_fc.bias", {4 * C}},
                            {p + "mlp.c_proj.weight", {4 * C, C}},
                            {p + "mlp.c_proj.bias", {C}}});
  }
  layout.add_unit("ln_f", {{"ln_f.weight", {C}}, {"ln_f.bias", {C}}});
  return layout;
}

GptShape GptFamily::shape(int n_embd) const {
  GptShape s;
  s.n_embd = n_embd;
  s.n_head = n_embd >= 128 ? n_embd / 128 : 1;
  if (n_embd % s.n_head != 0) s.n_head = 1;
  s.n_layer = n_layer > 0 ? n_layer : std::max(1, static_cast<int>(std::lround(static_cast<double>(n_embd) / aspect)));
  s.seq_len = seq_len;
  s.vocab_size = vocab_size;
  return s;
}

GptShape GptFamily::closest(double params) const {
  ZERO_CHECK(params > 0, fmt::format("a parameter count must be positive (got {})", params));
  GptShape best = shape(128);
  for (int c = 256; c <= 128 * 4096; c += 128) {
    GptShape s = shape(c);
    if (std::abs(static_cast<double>(s.num_params()) - params) <
        std::abs(static_cast<double>(best.num_params()) - params))
      best = s;
    if (static_cast<double>(s.num_params()) > 2 * params) break;
  }
  return best;
}

std::int64_t activation_bytes(const GptShape& s, int micro, bool checkpointing, int element_bytes,
                              AttentionStore attention) {
  s.validate();
  ZERO_CHECK(micro >= 1, fmt::format("activation_bytes: the micro-batch must be >= 1 (got {})", micro));
  const std::int64_t B = micro, T = s.seq_len, C = s.n_embd, NH = s.n_head, L = s.n_layer;
  const std::int64_t N = B * T, NC = N * C;
  // What the attention keeps per block and the backward's scratch beside it, in floats.
  const std::int64_t att = attention == AttentionStore::probabilities ? B * NH * T * T : B * NH * T;
  const std::int64_t blocks = checkpointing ? 1 : L;
  // Elements: per block ln1, qkv (3), attention output, res2, ln2, fc (4), gelu(fc) (4): 15
  // widths; the residual stream; ln_f; the logits; the backward's dres, dtmp, dqkv (3), dfc (4).
  const std::int64_t elements = blocks * 15 * NC + (L + 1) * NC + NC + N * s.padded_vocab() + 9 * NC;
  // fp32: per block 4 LayerNorm statistics per row and the attention's; ln_f's statistics and
  // the losses; the attention backward's scratch.
  const std::int64_t floats = blocks * (4 * N + att) + 3 * N + att;
  return elements * element_bytes + floats * static_cast<std::int64_t>(sizeof(float)) +
         2 * N * static_cast<std::int64_t>(sizeof(std::int32_t));
}

}  // namespace zero::plan
