// The whole GPT model: gradient check against finite differences, activation checkpointing,
// the gradient-accumulation contract, padded vocabulary, layout and initialisation.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "forwarding_ops.hpp"
#include "gpt/gpt_config.hpp"
#include "gpt/gpt_model.hpp"
#include "gpt/ops.hpp"
#include "zero/error.hpp"
#include "zero/layout.hpp"

using namespace zero::gpt;

namespace {

GptConfig small_config() {
  GptConfig c;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  c.seq_len = 8;
  c.vocab_size = 40;  // padded to 128: most of wte is padding, which must stay inert
  return c;
}

struct Batch {
  std::vector<std::int32_t> inputs, targets;
};

Batch random_batch(const GptConfig& c, int B, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> tok(0, c.vocab_size - 1);
  Batch b;
  for (int i = 0; i < B * c.seq_len; ++i) {
    b.inputs.push_back(tok(rng));
    b.targets.push_back(tok(rng));
  }
  return b;
}

double loss_of(GptModel& m, const HostParams& p) { return forward_all(m, p); }

// Host arithmetic that also adds up the floating-point work of every product the model asks
// for: matrix products exactly (2 per multiply-add, the input gradient only when requested),
// attention with the causal convention of training_flops_per_token (T/2 keys per query).
class CountingOps final : public zero::gpt::test::ForwardingOps {
 public:
  double flops = 0;
  const char* name() const override { return "counting"; }
  void matmul_forward(Act* o, const Act* i, const Act* w, const Act* b, int N, int C, int OC, Act* pre_gelu) override {
    flops += 2.0 * N * C * OC;
    ForwardingOps::matmul_forward(o, i, w, b, N, C, OC, pre_gelu);
  }
  void matmul_backward(Act* di, Act* dw, Act* db, const Act* d, const Act* i, const Act* w, int N, int C, int OC,
                       const Act* pre_gelu) override {
    flops += (di ? 4.0 : 2.0) * N * C * OC;
    ForwardingOps::matmul_backward(di, dw, db, d, i, w, N, C, OC, pre_gelu);
  }
  void attention_forward(Act* o, float* st, const Act* qkv, const AttentionShape& s) override {
    flops += 2.0 * s.B * s.T * s.T * s.width();
    ForwardingOps::attention_forward(o, st, qkv, s);
  }
  void attention_backward(Act* dqkv, float* sc, const Act* d, const Act* qkv, const Act* o, const float* st,
                          const AttentionShape& s) override {
    flops += 4.0 * s.B * s.T * s.T * s.width();
    ForwardingOps::attention_backward(dqkv, sc, d, qkv, o, st, s);
  }
  void logits_forward(Act* l, const Act* x, const Act* w, int N, int C, int Vp) override {
    flops += 2.0 * N * C * Vp;
    ForwardingOps::logits_forward(l, x, w, N, C, Vp);
  }
  void logits_backward(Act* dx, Act* dw, const Act* dl, const Act* x, const Act* w, int N, int C, int Vp) override {
    flops += 4.0 * N * C * Vp;
    ForwardingOps::logits_backward(dx, dw, dl, x, w, N, C, Vp);
  }
};

// The floating-point work of one training micro-step (forward and backward), per token.
double counted_flops_per_token(const GptConfig& cfg, int B) {
  CountingOps ops;
  GptModel model(cfg, B, ops);
  HostParams p(cfg), g(cfg);
  p.init(3);
  const Batch batch = random_batch(cfg, B, 5);
  model.set_batch(batch.inputs.data(), batch.targets.data(), B, cfg.seq_len);
  forward_all(model, p);
  backward_all(model, p, g);
  return ops.flops / (static_cast<double>(B) * cfg.seq_len);
}

}  // namespace

TEST_CASE("the whole model's gradient matches finite differences", "[gpt][model]") {
  // The model computes in fp32. A single-element finite difference would drown in fp32 rounding
  // of the loss (~1e-7 relative), so each tensor is checked along one direction: its own
  // gradient direction d = g/|g|, where the analytic directional derivative is |g| (large), and
  // a wrong gradient *direction* also shows (the true derivative along d is then < |g|). With
  // step 1e-2 the rounding contributes ~1e-5 and the truncation error (eps^2 * third
  // derivative) ~1e-4 of |g| (measured: at most 1e-3); 1% relative tolerance leaves a margin of
  // ten while a mis-scaled term fails (10% off in one term of the GELU derivative moves the
  // directional derivatives by 2-3%).
  const GptConfig cfg = small_config();
  auto ops = make_host_ops();
  const int B = 2;
  GptModel model(cfg, B, *ops);
  HostParams params(cfg), grads(cfg);
  params.init(1234);
  // Larger weights than GPT-2's 0.02 so that every path carries a measurable gradient.
  std::mt19937_64 rng(99);
  std::normal_distribution<float> jitter(0.0f, 0.3f);
  for (int u = 0; u < params.num_units(); ++u)
    for (auto& v : params.unit_data(u)) v += jitter(rng);
  const Batch batch = random_batch(cfg, B, 7);
  model.set_batch(batch.inputs.data(), batch.targets.data(), B, cfg.seq_len);
  loss_of(model, params);
  backward_all(model, params, grads);

  const double eps = 1e-2;
  for (int u = 0; u < params.num_units(); ++u) {
    const auto& spec = params.specs()[static_cast<std::size_t>(u)];
    for (std::size_t i = 0; i < spec.tensors.size(); ++i) {
      const auto& t = spec.tensors[i];
      auto p = params.tensor(t.name);
      auto g = grads.tensor(t.name);
      double norm = 0;
      for (float v : g) norm += double(v) * v;
      norm = std::sqrt(norm);
      INFO(t.name << " |g| = " << norm);
      REQUIRE(norm > 1e-4);
      std::vector<float> keep(p.begin(), p.end());
      auto shifted_loss = [&](double s) {
        for (std::size_t k = 0; k < p.size(); ++k) p[k] = static_cast<float>(keep[k] + s * g[k] / norm);
        return loss_of(model, params);
      };
      const double numeric = (shifted_loss(eps) - shifted_loss(-eps)) / (2 * eps);
      std::copy(keep.begin(), keep.end(), p.begin());
      INFO("directional derivative: numeric " << numeric << ", analytic " << norm);
      CHECK(std::abs(numeric - norm) <= 1e-2 * norm);
    }
  }
}

TEST_CASE("padded vocabulary rows get exactly zero gradient", "[gpt][model]") {
  const GptConfig cfg = small_config();
  auto ops = make_host_ops();
  GptModel model(cfg, 2, *ops);
  HostParams params(cfg), grads(cfg);
  params.init(5);
  const Batch batch = random_batch(cfg, 2, 3);
  model.set_batch(batch.inputs.data(), batch.targets.data(), 2, cfg.seq_len);
  forward_all(model, params);
  backward_all(model, params, grads);
  auto wte = params.tensor("wte.weight");
  auto dwte = grads.tensor("wte.weight");
  const std::size_t real = static_cast<std::size_t>(cfg.vocab_size) * cfg.n_embd;
  REQUIRE(dwte.size() == static_cast<std::size_t>(cfg.padded_vocab_size()) * cfg.n_embd);
  for (std::size_t i = real; i < dwte.size(); ++i) {
    REQUIRE(dwte[i] == 0.0f);
    REQUIRE(wte[i] == 0.0f);  // initialised to zero too
  }
  double real_norm = 0;
  for (std::size_t i = 0; i < real; ++i) real_norm += std::abs(dwte[i]);
  CHECK(real_norm > 0);
}

TEST_CASE("activation checkpointing gives the same loss and gradients", "[gpt][model]") {
  GptConfig cfg = small_config();
  auto ops = make_host_ops();
  const Batch batch = random_batch(cfg, 2, 11);
  HostParams params(cfg);
  params.init(77);

  GptModel plain(cfg, 2, *ops);
  HostParams g_plain(cfg);
  plain.set_batch(batch.inputs.data(), batch.targets.data(), 2, cfg.seq_len);
  const double l_plain = forward_all(plain, params);
  backward_all(plain, params, g_plain);

  cfg.activation_checkpointing = true;
  GptModel ckpt(cfg, 2, *ops);
  HostParams g_ckpt(cfg);
  ckpt.set_batch(batch.inputs.data(), batch.targets.data(), 2, cfg.seq_len);
  const double l_ckpt = forward_all(ckpt, params);
  backward_all(ckpt, params, g_ckpt);

  // The recompute runs the same operations on the same inputs: bit-identical results.
  CHECK(l_ckpt == l_plain);
  for (int u = 0; u < params.num_units(); ++u) CHECK(g_ckpt.unit_data(u) == g_plain.unit_data(u));
  CHECK(ckpt.activation_bytes() < plain.activation_bytes());
}

TEST_CASE("FLOPs per token: what the model computes, recompute included", "[gpt][model][flops]") {
  GptConfig cfg = small_config();
  cfg.seq_len = 16;
  const double plain = counted_flops_per_token(cfg, 2);
  const TokenFlops f = training_flops_per_token(cfg);
  CHECK(f.recompute == 0.0);
  // 6N + 6LTC counts 6 per parameter, the matrix products' weights and also the parameters
  // that take part in no product (wpe, biases, LayerNorm): with those added to what the
  // products computed, the two agree.
  double in_products = 0;
  for (const UnitSpec& u : gpt_units(cfg))
    for (const TensorSpec& t : u.tensors)
      if (t.name == "wte.weight" || t.name.ends_with("c_attn.weight") || t.name.ends_with("c_proj.weight") ||
          t.name.ends_with("c_fc.weight"))
        in_products += static_cast<double>(t.numel());
  const double outside = static_cast<double>(cfg.num_params()) - in_products;
  CHECK(plain + 6 * outside == Approx(f.model).epsilon(1e-12));

  // With checkpointing the counted extra work is exactly the stated recompute: every block's
  // forward up to the MLP's output projection, 2/3 of a block's products.
  cfg.activation_checkpointing = true;
  const double ckpt = counted_flops_per_token(cfg, 2);
  const TokenFlops fc = training_flops_per_token(cfg);
  CHECK(fc.model == f.model);
  CHECK(ckpt - plain == Approx(fc.recompute).epsilon(1e-12));
  CHECK(fc.recompute == Approx(cfg.n_layer * block_forward_flops_per_token(cfg, true)));

  // GPT-2 124M (N = 124,475,904 with the vocabulary padded to 50304; L 12, T 1024, C 768),
  // by hand: 6N + 6LTC = 803.5M per token (F 6.455 of which attention 0.455); the recompute
  // adds L (16 C^2 + 2 T C) = 132.1M, so F = 7.516 where a flat "8 with checkpointing" said 8.
  GptConfig gpt2 = gpt_preset("gpt2");
  gpt2.activation_checkpointing = true;
  const TokenFlops g = training_flops_per_token(gpt2);
  const double N = static_cast<double>(gpt2.num_params());
  CHECK(N == 124475904.0);
  CHECK(g.model / N == Approx(6.4549).epsilon(1e-4));
  CHECK(g.total() / N == Approx(7.5163).epsilon(1e-4));
}

TEST_CASE("backward adds into the gradients (micro-batch accumulation)", "[gpt][model]") {
  const GptConfig cfg = small_config();
  auto ops = make_host_ops();
  GptModel model(cfg, 2, *ops);
  HostParams params(cfg), once(cfg), twice(cfg);
  params.init(3);
  const Batch batch = random_batch(cfg, 2, 4);
  model.set_batch(batch.inputs.data(), batch.targets.data(), 2, cfg.seq_len);
  forward_all(model, params);
  backward_all(model, params, once, 0.5f);
  forward_all(model, params);
  backward_all(model, params, twice, 0.5f);
  forward_all(model, params);
  backward_all(model, params, twice, 0.5f);
  for (int u = 0; u < params.num_units(); ++u) {
    const auto& a = once.unit_data(u);
    const auto& b = twice.unit_data(u);
    for (std::size_t i = 0; i < a.size(); ++i) REQUIRE(b[i] == Approx(2 * a[i]).margin(1e-7));
  }
}

TEST_CASE("a shorter batch and sampling use the same activations", "[gpt][model]") {
  const GptConfig cfg = small_config();
  auto ops = make_host_ops();
  GptModel model(cfg, 2, *ops);
  HostParams params(cfg);
  params.init(9);
  const Batch batch = random_batch(cfg, 1, 5);
  // Causality: the logits at position 2 depend only on tokens 0..2, whatever the length.
  model.set_batch(batch.inputs.data(), nullptr, 1, 3);
  forward_all(model, params);
  std::vector<float> short_logits, long_logits;
  model.logits_at(0, 2, short_logits);
  model.set_batch(batch.inputs.data(), nullptr, 1, cfg.seq_len);
  forward_all(model, params);
  model.logits_at(0, 2, long_logits);
  REQUIRE(short_logits.size() == static_cast<std::size_t>(cfg.vocab_size));
  for (std::size_t i = 0; i < short_logits.size(); ++i) CHECK(short_logits[i] == Approx(long_logits[i]).margin(1e-6));
  CHECK_THROWS_AS(model.set_batch(batch.inputs.data(), nullptr, 3, 4), zero::Error);
}

TEST_CASE("sample_token", "[gpt][model]") {
  const std::vector<float> logits = {0.1f, 3.0f, -1.0f, 2.9f};
  CHECK(sample_token(logits, 0.0f, 0, 0.5) == 1);   // greedy
  CHECK(sample_token(logits, 1.0f, 1, 0.99) == 1);  // top-1 is greedy too
  // top-2 keeps ids 1 and 3 only, whatever the coin.
  for (double coin : {0.0, 0.3, 0.6, 0.999}) {
    int t = sample_token(logits, 1.0f, 2, coin);
    CHECK((t == 1 || t == 3));
  }
  CHECK(sample_token(logits, 1.0f, 0, 0.0) == 1);
  CHECK(sample_token(logits, 1.0f, 0, 0.9999) == 2);  // the least likely comes last
}

TEST_CASE("layout: units, names and sizes", "[gpt][model]") {
  const GptConfig gpt2 = gpt_preset("gpt2");
  // GPT-2 124M with the vocabulary padded to 50304 (llm.c's count).
  CHECK(gpt2.num_params() == 124475904);
  const zero::Layout layout = build_layout(gpt2);
  REQUIRE(layout.num_units() == 14);
  CHECK(layout.num_params() == gpt2.num_params());
  CHECK(layout.unit(0).name == "embeddings");
  CHECK(layout.unit(1).name == "h.0");
  CHECK(layout.unit(13).name == "ln_f");
  const auto& h3 = layout.unit(block_unit(3));
  REQUIRE(h3.params.size() == static_cast<std::size_t>(kBlockTensors));
  CHECK(h3.params[kAttnW].name == "h.3.attn.c_attn.weight");
  CHECK(h3.params[kAttnW].shape == std::vector<std::int64_t>{768, 2304});
  CHECK(h3.params[kFcProjW].name == "h.3.mlp.c_proj.weight");
  CHECK(h3.params[kFcProjW].shape == std::vector<std::int64_t>{3072, 768});
  CHECK(layout.unit(0).params[kWte].shape == std::vector<std::int64_t>{50304, 768});

  CHECK(gpt_preset("gpt2-xl").n_embd == 1600);
  CHECK(gpt_preset("gpt2-medium").n_layer == 24);
  CHECK(gpt_preset("gpt2-large").n_head == 20);
  CHECK_THROWS_WITH(gpt_preset("gtp2"), Catch::Contains("did you mean 'gpt2'"));
  GptConfig bad = gpt2;
  bad.n_head = 7;
  CHECK_THROWS_WITH(bad.validate(), Catch::Contains("not a multiple of n_head 7"));
}

TEST_CASE("initialisation is GPT-2's and depends only on seed and name", "[gpt][model]") {
  GptConfig cfg = small_config();
  cfg.n_embd = 64;
  cfg.n_layer = 8;
  HostParams a(cfg), b(cfg), c(cfg);
  a.init(42);
  b.init(42);
  c.init(43);
  for (int u = 0; u < a.num_units(); ++u) CHECK(a.unit_data(u) == b.unit_data(u));
  CHECK(a.unit_data(1) != c.unit_data(1));

  auto stddev = [](std::span<const float> v) {
    double s = 0, s2 = 0;
    for (float x : v) {
      s += x;
      s2 += double(x) * x;
    }
    const double n = static_cast<double>(v.size());
    return std::sqrt(s2 / n - (s / n) * (s / n));
  };
  CHECK(stddev(a.tensor("h.2.attn.c_attn.weight")) == Approx(0.02).epsilon(0.05));
  CHECK(stddev(a.tensor("h.2.mlp.c_proj.weight")) == Approx(0.02 / std::sqrt(16.0)).epsilon(0.05));
  for (float v : a.tensor("h.1.ln_2.weight")) REQUIRE(v == 1.0f);
  for (float v : a.tensor("h.1.mlp.c_fc.bias")) REQUIRE(v == 0.0f);
  for (float v : a.tensor("ln_f.bias")) REQUIRE(v == 0.0f);

  // A tensor's values do not depend on the others (the engine may ask in any order).
  std::vector<float> alone(a.tensor("h.5.attn.c_proj.weight").size());
  init_parameter(cfg, "h.5.attn.c_proj.weight", alone, 42);
  auto ref = a.tensor("h.5.attn.c_proj.weight");
  CHECK(std::equal(alone.begin(), alone.end(), ref.begin()));
}

TEST_CASE("weight decay: matrices and embeddings only, as GPT-2 and nanoGPT", "[gpt]") {
  GptConfig cfg;
  cfg.n_layer = 2;
  const zero::Layout layout = build_layout(cfg);
  int decayed = 0, kept = 0;
  for (const auto& u : layout.units())
    for (const auto& p : u.params) {
      INFO(p.name);
      const bool matrix = p.name == "wte.weight" || p.name == "wpe.weight" || p.name.ends_with("c_attn.weight") ||
                          p.name.ends_with("c_proj.weight") || p.name.ends_with("c_fc.weight");
      CHECK(p.decay == matrix);
      (p.decay ? decayed : kept) += 1;
    }
  CHECK(decayed == 2 + 4 * cfg.n_layer);  // wte, wpe; c_attn, attn.c_proj, c_fc, mlp.c_proj
  CHECK(kept == 8 * cfg.n_layer + 2);     // biases and LayerNorm gains/shifts, ln_f
  // The per-parameter switch any loop can use, with a did-you-mean on a typo.
  zero::Layout l = layout;
  l.set_decay(0, "wpe.weight", false);
  CHECK_FALSE(l.unit(0).params[1].decay);
  CHECK_THROWS_WITH(l.set_decay(0, "wpe.weigth", false), Catch::Contains("did you mean 'wpe.weight'"));
}
