// The whole GPT model computed two ways and compared tensor by tensor: the bf16 CUDA model
// against the fp32 host model on the same bf16-rounded weights (test/gpu/test_gpt_cuda_model.cpp),
// and, on any machine, the fp32 host model with every stored activation and gradient rounded
// to bf16 against the plain one (test/unit/gpt/test_gpt_bf16_model.cpp), which shows that the
// tolerances below leave room for bf16 rounding alone and nothing else.
//
// Why these tolerances. bf16 keeps 8 significant bits: rounding to nearest moves a value by at
// most u = 2^-8 of itself, about 2^-8 / sqrt(3) ~ 2.3e-3 root-mean-square when the discarded
// bits are uniform. The CUDA model rounds every tensor it stores (activations, activation
// gradients, parameter gradients) once, with fp32 accumulation inside each operation, so a
// parameter gradient carries the independent roundings of every tensor on its paths: about 8
// per block in the forward and 8 in the backward, plus about 6 in the embeddings and the head,
// K ~ 16 L + 6 = 38 for L = 2. Independent errors add in quadrature and each enters the
// gradient with a gain below 1 (LayerNorm renormalises, the residual stream dilutes a branch's
// error), so a gradient tensor's relative error norm is at most about sqrt(K) 2.3e-3 ~ 1.4e-2,
// and the emulation measures 5.7e-3 .. 7.6e-3 as the worst tensor of each case below (LayerNorm
// weights, whose gradients are sums of products of two rounded tensors, lead). The GPU rounds
// sums of another order, which moves single roundings to the neighbouring bf16 value: errors
// of the same size, independent of the emulation's. kGradRel = 2e-2 is above the bound and
// 2.6x the worst measured; an indexing or sign error in any operation moves some gradient by
// a good fraction of its norm, and even the attention weights' gradients made 3% too large
// fail it (tried on the emulation: rel 3e-2). The cosine is the same comparison blind to scale: a
// gradient only mis-scaled keeps a cosine of 1, one pointing elsewhere does not; with the
// error orthogonal to the gradient, 1 - cos ~ rel^2 / 2, so kGradCos = 0.999 allows rel ~ 4.5e-2
// and is the looser of the two (the emulation: 1 - cos <= 3e-5).
// The loss: the logits are rounded to bf16 (2^-8 of values of O(1) at most, random in sign
// over the vocabulary), the cross-entropy itself is fp32 and the mean over N >= 128 positions
// averages the rest out: the emulation moves it by at most 1e-5 of its value (ln V ~ 5.5 .. 6.9
// at initialisation). kLossRel = 1e-3 (~0.006 nats) is 100x that, and still catches the
// mistakes that matter: the 24 padded logits (0 for the zero rows) of the 1000-id vocabulary
// left in the softmax would raise the loss by ~ln(1024 / 1000) = 0.024, 3.4e-3 of it (tried
// on the emulation: the loss fails while the gradients move by only 1.5e-2; the GPU test also
// requires the padded rows' gradient to be exactly zero).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "gpt/gpt_config.hpp"
#include "gpt/gpt_model.hpp"
#include "zero/dtype.hpp"

namespace zero::gpt::compare {

constexpr double kLossRel = 1e-3;
constexpr double kGradRel = 2e-2;
constexpr double kGradCos = 0.999;

// One model shape of the comparison. B = 2 sequences of the full seq_len.
struct ModelCase {
  int n_layer, n_head, n_embd, seq_len, vocab_size;
  bool checkpointing;
};
constexpr int kBatch = 2;

// Head sizes 32 and 64 (what the attention kernels support besides 128), T a multiple of the
// attention tiles (64) and not (100), the byte vocabulary (no padding) and a padded one
// (1000 of 1024 ids real: the padded logits must be masked out of the loss and its gradient).
inline std::vector<ModelCase> model_cases() {
  return {
      {2, 2, 64, 64, 256, false},  {2, 2, 64, 64, 256, true},    {2, 4, 128, 100, 256, false},
      {2, 4, 128, 100, 256, true}, {2, 2, 128, 64, 1000, false}, {2, 2, 64, 100, 1000, true},
  };
}

inline GptConfig config_of(const ModelCase& m) {
  GptConfig c;
  c.n_layer = m.n_layer;
  c.n_head = m.n_head;
  c.n_embd = m.n_embd;
  c.seq_len = m.seq_len;
  c.vocab_size = m.vocab_size;
  c.activation_checkpointing = m.checkpointing;
  return c;
}

inline std::string describe(const ModelCase& m) { return config_of(m).describe() + " B=" + std::to_string(kBatch); }

struct Batch {
  std::vector<std::int32_t> inputs, targets;
};

// Uniform random ids: every row of the real vocabulary may be used, none of the padding.
inline Batch random_batch(const GptConfig& c, int B, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> tok(0, c.vocab_size - 1);
  Batch b;
  for (int i = 0; i < B * c.seq_len; ++i) {
    b.inputs.push_back(tok(rng));
    b.targets.push_back(tok(rng));
  }
  return b;
}

inline float round_bf16(float v) { return zero::round_to(zero::DType::bf16, v); }

// GPT-2 initialisation rounded to bf16, so that both models start from the same values.
inline void init_bf16(HostParams& p, std::uint64_t seed) {
  p.init(seed);
  for (int u = 0; u < p.num_units(); ++u)
    for (float& v : p.unit_data(u)) v = round_bf16(v);
}

struct Agreement {
  double rel = 0;     // ||got - want|| / ||want||
  double cosine = 0;  // <got, want> / (||got|| ||want||)
  double norm = 0;    // ||want||
  bool finite = true;
};

inline Agreement agreement(std::span<const float> got, std::span<const float> want) {
  double d2 = 0, g2 = 0, w2 = 0, gw = 0;
  Agreement a;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double g = got[i], w = want[i];
    if (!std::isfinite(g)) a.finite = false;
    d2 += (g - w) * (g - w);
    g2 += g * g;
    w2 += w * w;
    gw += g * w;
  }
  a.norm = std::sqrt(w2);
  a.rel = w2 > 0 ? std::sqrt(d2 / w2) : (d2 > 0 ? INFINITY : 0.0);
  a.cosine = g2 > 0 && w2 > 0 ? gw / std::sqrt(g2 * w2) : 0.0;
  return a;
}

struct TensorAgreement {
  std::string name;
  Agreement a;
};

// Every tensor of two gradients held unit by unit in HostParams' layout.
inline std::vector<TensorAgreement> agreement_per_tensor(const std::vector<UnitSpec>& specs,
                                                         const std::vector<std::vector<float>>& got,
                                                         const std::vector<std::vector<float>>& want) {
  std::vector<TensorAgreement> out;
  for (std::size_t u = 0; u < specs.size(); ++u) {
    std::size_t off = 0;
    for (const TensorSpec& t : specs[u].tensors) {
      const auto n = static_cast<std::size_t>(t.numel());
      out.push_back({t.name, agreement(std::span(got[u]).subspan(off, n), std::span(want[u]).subspan(off, n))});
      off += n;
    }
  }
  return out;
}

// One micro-step of a model on host Ops (HostOps or an instrumented one): the loss and the
// gradients, added into zeroed HostParams.
struct HostStep {
  double loss = 0;
  HostParams grads;
};
inline HostStep host_step(Ops& ops, const GptConfig& cfg, const HostParams& params, const Batch& batch) {
  GptModel model(cfg, kBatch, ops);
  HostStep r{0.0, HostParams(cfg)};
  model.set_batch(batch.inputs.data(), batch.targets.data(), kBatch, cfg.seq_len);
  r.loss = forward_all(model, params);
  backward_all(model, params, r.grads);
  return r;
}

inline std::vector<std::vector<float>> units_of(const HostParams& p) {
  std::vector<std::vector<float>> v;
  for (int u = 0; u < p.num_units(); ++u) v.push_back(p.unit_data(u));
  return v;
}

// The worst tensor, printed so that a passing run still shows how much margin is left.
inline void print_summary(const char* what, const std::string& model, double loss_got, double loss_want,
                          const std::vector<TensorAgreement>& t) {
  double worst_rel = 0, worst_cos = 1;
  std::string rel_name, cos_name;
  for (const auto& x : t) {
    if (x.a.rel > worst_rel) worst_rel = x.a.rel, rel_name = x.name;
    if (x.a.cosine < worst_cos) worst_cos = x.a.cosine, cos_name = x.name;
  }
  std::printf(
      "%s | %s: loss %.6f vs %.6f (rel %.2e, tol %.0e); worst grad rel %.2e (%s, tol "
      "%.0e), worst cosine %.6f (%s, min %.3f)\n",
      what, model.c_str(), loss_got, loss_want, std::abs(loss_got - loss_want) / loss_want, kLossRel, worst_rel,
      rel_name.c_str(), kGradRel, worst_cos, cos_name.c_str(), kGradCos);
}

}  // namespace zero::gpt::compare
