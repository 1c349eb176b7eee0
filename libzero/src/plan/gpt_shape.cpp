// GPT shapes for planning: presets, the trainer's unit structure, shape families and the
// trainer's activation memory.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "runtime/strings.hpp"
#include "zero/error.hpp"
#include "zero/plan/plan.hpp"

namespace zero::plan {

namespace {

GptShape make(const char* name, int layers, int heads, int embd, int seq, int vocab) {
  return GptShape{name, layers, heads, embd, seq, vocab};
}

// Llama-family shapes: grouped-query attention, a SwiGLU width, the head tied or not.
GptShape llama(const char* name, int layers, int heads, int kv_heads, int embd, int ffn, int seq, int vocab, bool tied,
               double theta) {
  GptShape s = make(name, layers, heads, embd, seq, vocab);
  s.arch = Arch::llama;
  s.n_kv_head = kv_heads;
  s.ffn_hidden = ffn;
  s.tied_head = tied;
  s.rope_theta = theta;
  return s;
}

GptShape bloom(const char* name, int layers, int heads, int embd, int seq, int vocab) {
  GptShape s = make(name, layers, heads, embd, seq, vocab);
  s.arch = Arch::bloom;
  return s;
}

constexpr const char* kArchNames[] = {"gpt2", "bloom", "llama"};

}  // namespace

std::string_view arch_name(Arch arch) { return kArchNames[static_cast<int>(arch)]; }

Arch parse_arch(std::string_view name) {
  for (int a = 0; a < 3; ++a)
    if (name == kArchNames[a]) return static_cast<Arch>(a);
  ZERO_THROW(fmt::format("unknown model architecture '{}'; choose gpt2, bloom or llama", name));
}

void GptShape::validate() const {
  // 2^24 bounds every field far above any real model and keeps products of two in int64 (a
  // shape read from a checkpoint or a config.json is not trusted).
  const std::string what = name.empty() ? std::string("model shape") : fmt::format("model shape '{}'", name);
  auto positive = [&](int v, const char* field) {
    ZERO_CHECK(v > 0 && v <= (1 << 24), fmt::format("{}: {} must be in [1, 2^24] (got {})", what, field, v));
  };
  positive(n_layer, "n_layer");
  positive(n_head, "n_head");
  positive(n_embd, "n_embd");
  positive(seq_len, "seq_len");
  positive(vocab_size, "vocab_size");
  ZERO_CHECK(n_embd % n_head == 0,
             fmt::format("{}: n_embd {} is not a multiple of n_head {}; pick a head count that divides the width", what,
                         n_embd, n_head));
  ZERO_CHECK(n_kv_head >= 0 && ffn_hidden >= 0 && ffn_hidden <= (1 << 24),
             fmt::format("{}: n_kv_head ({}) and ffn_hidden ({}) must be >= 0 (0: the architecture's default)", what,
                         n_kv_head, ffn_hidden));
  ZERO_CHECK(arch == Arch::llama || (kv_heads() == n_head && tied_head),
             fmt::format("{}: grouped-query attention (n_kv_head {} of {} heads) and an untied head are llama's; "
                         "{} has neither",
                         what, kv_heads(), n_head, arch_name(arch)));
  ZERO_CHECK(n_head % kv_heads() == 0,
             fmt::format("{}: n_head {} is not a multiple of n_kv_head {} (each key/value head serves an equal "
                         "group of query heads)",
                         what, n_head, kv_heads()));
  ZERO_CHECK(!rotary() || head_size() % 2 == 0,
             fmt::format("{}: rotary positions rotate pairs of a head's dimensions; the head size {} is odd", what,
                         head_size()));
  ZERO_CHECK(norm_eps > 0 && norm_eps < 1 && rope_theta > 1,
             fmt::format("{}: norm_eps must be in (0, 1) and rope_theta > 1 (got {}, {})", what, norm_eps, rope_theta));
}

std::int64_t GptShape::num_params() const {
  const std::int64_t C = n_embd, F = mlp_hidden(), b = biases() ? 1 : 0, norm = rms_norm() ? C : 2 * C;
  const std::int64_t block = 2 * norm + C * qkv_width() + b * qkv_width() + C * C + b * C +
                             C * F * (gated_mlp() ? 2 : 1) + b * F + F * C + b * C;
  const std::int64_t embeddings =
      padded_vocab() * C + (learned_positions() ? std::int64_t{seq_len} * C : 0) + (embedding_norm() ? 2 * C : 0);
  return embeddings + n_layer * block + norm + (tied_head ? 0 : padded_vocab() * C);
}

const std::vector<GptShape>& gpt_presets() {
  static const std::vector<GptShape> presets = {
      make("gpt2", 12, 12, 768, 1024, 50257),
      make("gpt2-medium", 24, 16, 1024, 1024, 50257),
      make("gpt2-large", 36, 20, 1280, 1024, 50257),
      make("gpt2-xl", 48, 25, 1600, 1024, 50257),
      bloom("bloom-560m", 24, 16, 1024, 2048, 250880),
      bloom("bloom-7b1", 30, 32, 4096, 1024, 250880),
      llama("llama2-7b", 32, 32, 32, 4096, 11008, 4096, 32000, false, 1e4),
      llama("llama3.2-1b", 16, 32, 8, 2048, 8192, 2048, 128256, true, 5e5),
      llama("llama3.2-3b", 28, 24, 8, 3072, 8192, 2048, 128256, true, 5e5),
      llama("llama3-8b", 32, 32, 8, 4096, 14336, 2048, 128256, false, 5e5),
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

Layout gpt_layout(const GptShape& s) { return gpt_part_layout(s, PipelinePart{}); }

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
  return part_activation_bytes(s, PipelinePart{}, micro, 1, checkpointing, element_bytes, attention);
}

int PipelinePart::blocks(const GptShape& shape) const {
  return shape.n_layer / pp + (index < shape.n_layer % pp ? 1 : 0);
}

void check_split(const GptShape& shape, int tp, int pp) {
  shape.validate();
  ZERO_CHECK(tp >= 1 && pp >= 1,
             fmt::format("model parallelism: tensor ({}) and pipeline ({}) sizes must be >= 1", tp, pp));
  ZERO_CHECK(shape.n_head % tp == 0,
             fmt::format("tensor parallelism {}: n_head {} is not a multiple of it (each rank takes n_head / T "
                         "heads); pick a tensor size that divides the head count",
                         tp, shape.n_head));
  ZERO_CHECK(shape.kv_heads() % tp == 0 || tp % shape.kv_heads() == 0,
             fmt::format("tensor parallelism {}: it and the {} key/value heads divide neither way (each rank takes "
                         "whole query groups with their key/value heads, or part of one group with its key/value "
                         "head replicated); pick a tensor size that divides n_kv_head or is a multiple of it",
                         tp, shape.kv_heads()));
  ZERO_CHECK(
      shape.mlp_hidden() % tp == 0,
      fmt::format("tensor parallelism {}: the MLP's hidden width {} is not a multiple of it", tp, shape.mlp_hidden()));
  ZERO_CHECK(shape.padded_vocab() % tp == 0,
             fmt::format("tensor parallelism {}: the padded vocabulary {} is not a multiple of it (the embedding "
                         "is split by rows); pick a tensor size that divides it",
                         tp, shape.padded_vocab()));
  ZERO_CHECK(pp <= shape.n_layer, fmt::format("pipeline parallelism {}: more pipeline parts than the {} blocks; use at "
                                              "most n_layer parts",
                                              pp, shape.n_layer));
}

TensorCut gpt_tensor_cut(const GptShape& s, std::string_view name, int tp) {
  auto ends = [&](std::string_view suffix) { return name.ends_with(suffix); };
  if (s.kv_replicated(tp) && (ends("attn.c_attn.weight") || ends("attn.c_attn.bias") || ends("attn.c_proj.weight")))
    return {true, -1, 1};
  if (name == "wte.weight" || name == "lm_head.weight") return {false, 0, 1};  // vocabulary rows
  // q | k | v columns: n_head / n_kv_head query blocks and a k and a v block, each cut T ways, so
  // a rank holds whole query groups with their key/value heads (qkv_width).
  if (ends("attn.c_attn.weight")) return {false, 1, s.qkv_blocks()};
  if (ends("attn.c_attn.bias")) return {false, 0, s.qkv_blocks()};
  // Column-parallel; SwiGLU's gate | up in two blocks, so a rank's gate and up columns match.
  if (ends("mlp.c_fc.weight")) return {false, 1, s.gated_mlp() ? 2 : 1};
  if (ends("mlp.c_fc.bias")) return {false, 0, 1};
  // Row-parallel; the attention output's rows follow the query heads: n_head / n_kv_head blocks.
  if (ends("attn.c_proj.weight")) return {false, 0, s.n_head / s.kv_heads()};
  if (ends("mlp.c_proj.weight")) return {false, 0, 1};
  return {true, -1, 1};  // norms, wpe, row-parallel biases
}

Layout gpt_part_layout(const GptShape& s, const PipelinePart& part) {
  check_split(s, part.tp, part.pp);
  ZERO_CHECK(part.index >= 0 && part.index < part.pp,
             fmt::format("gpt_part_layout: part {} is outside 0..{}", part.index, part.pp - 1));
  const std::int64_t C = s.n_embd, F = s.mlp_hidden();
  using Params = std::vector<std::pair<std::string, Layout::Shape>>;
  // A norm's tensors: the weight, and the bias of a LayerNorm.
  auto norm = [&](const std::string& p, Params& out) {
    out.push_back({p + ".weight", {C}});
    if (!s.rms_norm()) out.push_back({p + ".bias", {C}});
  };
  // The whole shapes, cut here (the one place a part's shape follows from the cut) and marked.
  Layout layout;
  auto add = [&](const std::string& unit, Params params) {
    std::vector<TensorCut> cuts;
    for (auto& [name, shape] : params) {
      cuts.push_back(gpt_tensor_cut(s, name, part.tp));
      if (!cuts.back().replicated) shape[static_cast<std::size_t>(cuts.back().axis)] /= part.tp;
    }
    const int id = layout.add_unit(unit, params);
    for (const auto& [name, shape] : params)  // the tied LM head's copy too
      if (name == "wte.weight" || name == "wpe.weight" || name == "lm_head.weight") layout.set_embedding(id, name);
    for (std::size_t i = 0; i < params.size() && part.tp > 1; ++i) {
      if (cuts[i].replicated)
        layout.set_replicated(id, params[i].first);
      else
        layout.set_split(id, params[i].first, cuts[i].axis, cuts[i].blocks);
    }
  };
  if (part.first()) {
    Params emb{{"wte.weight", {s.padded_vocab(), C}}};
    if (s.learned_positions()) emb.push_back({"wpe.weight", {s.seq_len, C}});
    if (s.embedding_norm()) norm("ln_e", emb);
    add("embeddings", emb);
  }
  int first_block = 0;
  for (int k = 0; k < part.index; ++k) first_block += PipelinePart{part.tp, part.pp, k}.blocks(s);
  for (int l = first_block; l < first_block + part.blocks(s); ++l) {
    const std::string unit = fmt::format("h.{}", l), p = unit + ".";
    const std::int64_t fc = F * (s.gated_mlp() ? 2 : 1);
    Params b;
    norm(p + "ln_1", b);
    b.push_back({p + "attn.c_attn.weight", {C, s.qkv_width()}});
    if (s.biases()) b.push_back({p + "attn.c_attn.bias", {s.qkv_width()}});
    b.push_back({p + "attn.c_proj.weight", {C, C}});
    if (s.biases()) b.push_back({p + "attn.c_proj.bias", {C}});
    norm(p + "ln_2", b);
    b.push_back({p + "mlp.c_fc.weight", {C, fc}});
    if (s.biases()) b.push_back({p + "mlp.c_fc.bias", {fc}});
    b.push_back({p + "mlp.c_proj.weight", {F, C}});
    if (s.biases()) b.push_back({p + "mlp.c_proj.bias", {C}});
    add(unit, b);
  }
  if (part.last()) {
    // The tied head: the last part keeps its own copy of the embedding's rows when it is not
    // the first (its gradient is all-reduced with the first part's). An untied head is the
    // last unit's.
    if (!part.first() && s.tied_head) add("lm_head", {{"wte.weight", {s.padded_vocab(), C}}});
    Params f;
    norm("ln_f", f);
    if (!s.tied_head) f.push_back({"lm_head.weight", {s.padded_vocab(), C}});
    add("ln_f", f);
  }
  return layout;
}

std::int64_t part_activation_bytes(const GptShape& s, const PipelinePart& part, int micro, int in_flight,
                                   bool checkpointing, int element_bytes, AttentionStore attention) {
  check_split(s, part.tp, part.pp);
  ZERO_CHECK(micro >= 1 && in_flight >= 1,
             fmt::format("activation_bytes: the micro-batch and the micro-batches in flight must be >= 1 (got {}, {})",
                         micro, in_flight));
  const std::int64_t B = micro, T = s.seq_len, C = s.n_embd, NH = s.n_head, TP = part.tp;
  const std::int64_t Lb = part.blocks(s);
  const std::int64_t N = B * T, NC = N * C;
  // What the attention keeps per block and the backward's scratch beside it, in floats; the
  // heads are split across the tensor group.
  const std::int64_t att = (attention == AttentionStore::probabilities ? B * NH * T * T : B * NH * T) / TP;
  // A block's buffers in elements: ln1, res2, ln2 replicated (3 widths); split across the tensor
  // group: qkv, the attention output (C), the MLP's input product (F, or gate and up: 2F) and its
  // activation (F). In fp32: 4 norm statistics per row and the attention's.
  const std::int64_t F = s.mlp_hidden(), fc_in = s.gated_mlp() ? 2 * F : F;
  const std::int64_t block_elements = 3 * NC + N * s.qkv_part_width(part.tp) + N * (C + fc_in + F) / TP;
  const std::int64_t block_floats = 4 * N + att;
  // Kept per micro-batch: every block's buffers (or none under checkpointing), the residual
  // stream at each block boundary of the part, in the first part the embedding before its
  // norm (bloom) and its statistics, in the last part ln_f and the logits over the padded
  // vocabulary / T with ln_f's statistics and the losses; token ids.
  std::int64_t kept_elements = (checkpointing ? 0 : Lb * block_elements) + (Lb + 1) * NC;
  std::int64_t kept_floats = checkpointing ? 0 : Lb * block_floats;
  if (part.first() && s.embedding_norm()) {
    kept_elements += NC;
    kept_floats += 2 * N;
  }
  if (part.last()) {
    kept_elements += NC + N * s.padded_vocab() / TP;
    kept_floats += 3 * N;
  }
  // Once: the block being recomputed under checkpointing; the backward's dres, dtmp
  // (replicated), dqkv, dfc and (SwiGLU) the activation's gradient split, and the attention
  // backward's scratch.
  const std::int64_t once_elements = (checkpointing ? block_elements : 0) + 2 * NC + N * s.qkv_part_width(part.tp) +
                                     N * (fc_in + (s.gated_mlp() ? F : 0)) / TP;
  const std::int64_t once_floats = (checkpointing ? block_floats : 0) + att;
  const std::int64_t ints = 2 * N;
  const std::int64_t f = static_cast<std::int64_t>(sizeof(float));
  const std::int64_t per_micro =
      kept_elements * element_bytes + kept_floats * f + ints * static_cast<std::int64_t>(sizeof(std::int32_t));
  return in_flight * per_micro + once_elements * element_bytes + once_floats * f;
}

double pipeline_bubble(int pp, int micro_batches) {
  ZERO_CHECK(pp >= 1 && micro_batches >= 1,
             fmt::format("pipeline_bubble: parts ({}) and micro-batches ({}) must be >= 1", pp, micro_batches));
  return (pp - 1.0) / (micro_batches + pp - 1.0);
}

}  // namespace zero::plan
