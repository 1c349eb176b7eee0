// GPT shapes for planning: presets, the trainer's unit structure, shape families and the
// trainer's activation memory.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "runtime/strings.hpp"
#include "zero/error.hpp"
#include "zero/plan/plan.hpp"

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
    ZERO_CHECK(v > 0 && v <= (1 << 24),
               fmt::format("GPT shape{}: {} must be in [1, 2^24] (got {})",
                           name.empty() ? std::string() : fmt::format(" '{}'", name), field, v));
  };
  positive(n_layer, "n_layer");
  positive(n_head, "n_head");
  positive(n_embd, "n_embd");
  positive(seq_len, "seq_len");
  positive(vocab_size, "vocab_size");
  ZERO_CHECK(
      n_embd % n_head == 0,
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
  const int emb =
      layout.add_unit("embeddings", {{"wte.weight", {s.padded_vocab(), C}}, {"wpe.weight", {s.seq_len, C}}});
  layout.set_embedding(emb, "wte.weight");  // the tied LM head too
  layout.set_embedding(emb, "wpe.weight");
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
  return stage_activation_bytes(s, StagePart{}, micro, 1, checkpointing, element_bytes, attention);
}

int StagePart::blocks(const GptShape& shape) const { return shape.n_layer / pp + (stage < shape.n_layer % pp ? 1 : 0); }

void check_split(const GptShape& shape, int tp, int pp) {
  shape.validate();
  ZERO_CHECK(tp >= 1 && pp >= 1,
             fmt::format("model parallelism: tensor ({}) and pipeline ({}) sizes must be >= 1", tp, pp));
  ZERO_CHECK(shape.n_head % tp == 0,
             fmt::format("tensor parallelism {}: n_head {} is not a multiple of it (each rank takes n_head / T "
                         "heads); pick a tensor size that divides the head count",
                         tp, shape.n_head));
  ZERO_CHECK(shape.padded_vocab() % tp == 0,
             fmt::format("tensor parallelism {}: the padded vocabulary {} is not a multiple of it (the embedding "
                         "is split by rows); pick a tensor size that divides it",
                         tp, shape.padded_vocab()));
  ZERO_CHECK(pp <= shape.n_layer, fmt::format("pipeline parallelism {}: more stages than the {} blocks; use at most "
                                              "n_layer stages",
                                              pp, shape.n_layer));
}

Layout gpt_stage_layout(const GptShape& s, const StagePart& part) {
  check_split(s, part.tp, part.pp);
  ZERO_CHECK(part.stage >= 0 && part.stage < part.pp,
             fmt::format("gpt_stage_layout: stage {} is outside 0..{}", part.stage, part.pp - 1));
  const std::int64_t C = s.n_embd, T = part.tp;
  Layout layout;
  if (part.first())
    layout.add_unit("embeddings", {{"wte.weight", {s.padded_vocab() / T, C}}, {"wpe.weight", {s.seq_len, C}}});
  int first_block = 0;
  for (int k = 0; k < part.stage; ++k) first_block += StagePart{part.tp, part.pp, k}.blocks(s);
  for (int l = first_block; l < first_block + part.blocks(s); ++l) {
    const std::string unit = fmt::format("h.{}", l), p = unit + ".";
    layout.add_unit(unit, {{p + "ln_1.weight", {C}},
                           {p + "ln_1.bias", {C}},
                           {p + "attn.c_attn.weight", {C, 3 * C / T}},
                           {p + "attn.c_attn.bias", {3 * C / T}},
                           {p + "attn.c_proj.weight", {C / T, C}},
                           {p + "attn.c_proj.bias", {C}},
                           {p + "ln_2.weight", {C}},
                           {p + "ln_2.bias", {C}},
                           {p + "mlp.c_fc.weight", {C, 4 * C / T}},
                           {p + "mlp.c_fc.bias", {4 * C / T}},
                           {p + "mlp.c_proj.weight", {4 * C / T, C}},
                           {p + "mlp.c_proj.bias", {C}}});
  }
  if (part.last()) {
    // The tied head: the last stage keeps its own copy of the embedding's rows when it is not
    // the first (its gradient is all-reduced with the first stage's).
    if (!part.first()) layout.add_unit("lm_head", {{"wte.weight", {s.padded_vocab() / T, C}}});
    layout.add_unit("ln_f", {{"ln_f.weight", {C}}, {"ln_f.bias", {C}}});
  }
  return layout;
}

std::int64_t stage_activation_bytes(const GptShape& s, const StagePart& part, int micro, int in_flight,
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
  // A block's buffers in elements: ln1, res2, ln2 replicated (3 widths); qkv (3), attention
  // output, fc (4) and gelu(fc) (4) split (12 widths / T). In fp32: 4 LayerNorm statistics per
  // row and the attention's.
  const std::int64_t block_elements = 3 * NC + 12 * NC / TP;
  const std::int64_t block_floats = 4 * N + att;
  // Kept per micro-batch: every block's buffers (or none under checkpointing), the residual
  // stream at each block boundary of the stage, on the last stage ln_f and the logits over
  // the padded vocabulary / T with ln_f's statistics and the losses; token ids.
  std::int64_t kept_elements = (checkpointing ? 0 : Lb * block_elements) + (Lb + 1) * NC;
  std::int64_t kept_floats = checkpointing ? 0 : Lb * block_floats;
  if (part.last()) {
    kept_elements += NC + N * s.padded_vocab() / TP;
    kept_floats += 3 * N;
  }
  // Once: the block being recomputed under checkpointing; the backward's dres, dtmp
  // (replicated), dqkv (3) and dfc (4) split, and the attention backward's scratch.
  const std::int64_t once_elements = (checkpointing ? block_elements : 0) + 2 * NC + 7 * NC / TP;
  const std::int64_t once_floats = (checkpointing ? block_floats : 0) + att;
  const std::int64_t ints = 2 * N;
  const std::int64_t f = static_cast<std::int64_t>(sizeof(float));
  const std::int64_t per_micro =
      kept_elements * element_bytes + kept_floats * f + ints * static_cast<std::int64_t>(sizeof(std::int32_t));
  return in_flight * per_micro + once_elements * element_bytes + once_floats * f;
}

double pipeline_bubble(int pp, int micro_batches) {
  ZERO_CHECK(pp >= 1 && micro_batches >= 1,
             fmt::format("pipeline_bubble: stages ({}) and micro-batches ({}) must be >= 1", pp, micro_batches));
  return (pp - 1.0) / (micro_batches + pp - 1.0);
}

}  // namespace zero::plan
