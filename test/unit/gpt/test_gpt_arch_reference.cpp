// Each architecture's host forward and backward against a double-precision model written here
// from the architectures' equations, in Hugging Face's terms (GPT2LMHeadModel, BloomForCausalLM,
// LlamaForCausalLM), not from the trainer's kernels. The trainer's parameters are read into it
// through the documented correspondence (gpt_config.hpp, plan.hpp GptShape::qkv_width): weights
// [in, out]; the fused attention product holds q heads, then k, then v, with q head
// r * n_kv_head + g the Hugging Face head g * (n_head / n_kv_head) + r (and the output
// projection's input rows in that stored order); SwiGLU's product holds gate, then up. Logits must agree within 1e-5,
// and every gradient checked (a sample of each tensor's elements) with the reference's central differences within 1e-5.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <memory>
#include <numbers>
#include <random>
#include <string>
#include <vector>

#include "gpt/gpt_config.hpp"
#include "gpt/gpt_model.hpp"
#include "gpt/ops.hpp"

using namespace zero::gpt;
using zero::plan::Arch;

namespace {

using Vec = std::vector<double>;

// The reference: every parameter by name, as double, in the trainer's storage order.
struct Weights {
  const GptConfig& c;
  std::vector<std::string> names;
  std::vector<Vec> values;
  const Vec& at(const std::string& name) const {
    for (std::size_t i = 0; i < names.size(); ++i)
      if (names[i] == name) return values[i];
    FAIL("no parameter " << name);
    return values[0];
  }
  bool has(const std::string& name) const {
    for (const auto& n : names)
      if (n == name) return true;
    return false;
  }
};

Weights read_weights(const HostParams& p) {
  Weights w{p.config(), {}, {}};
  for (int u = 0; u < p.num_units(); ++u) {
    std::size_t off = 0;
    for (const auto& t : p.specs()[static_cast<std::size_t>(u)].tensors) {
      const auto& d = p.unit_data(u);
      w.names.push_back(t.name);
      w.values.emplace_back(d.begin() + static_cast<std::ptrdiff_t>(off),
                            d.begin() + static_cast<std::ptrdiff_t>(off + static_cast<std::size_t>(t.numel())));
      off += static_cast<std::size_t>(t.numel());
    }
  }
  return w;
}

// x [C] -> LayerNorm (eps 1e-5, biased variance) or RMSNorm (HF's LlamaRMSNorm).
Vec norm(const Weights& w, const std::string& prefix, const Vec& x) {
  const std::size_t C = x.size();
  Vec y(C);
  const Vec& g = w.at(prefix + ".weight");
  if (w.c.arch == Arch::llama) {
    double ss = 0;
    for (double v : x) ss += v * v;
    const double r = 1.0 / std::sqrt(ss / static_cast<double>(C) + w.c.norm_eps);
    for (std::size_t i = 0; i < C; ++i) y[i] = g[i] * (x[i] * r);
    return y;
  }
  const Vec& b = w.at(prefix + ".bias");
  double m = 0, v = 0;
  for (double e : x) m += e;
  m /= static_cast<double>(C);
  for (double e : x) v += (e - m) * (e - m);
  v /= static_cast<double>(C);
  for (std::size_t i = 0; i < C; ++i) y[i] = (x[i] - m) / std::sqrt(v + 1e-5) * g[i] + b[i];
  return y;
}

// y = x W (+ b) with W [in, out] starting at column `col0` of a matrix `width` wide, `out` columns.
Vec linear(const Vec& x, const Vec& W, std::size_t width, std::size_t col0, std::size_t out, const Vec* b = nullptr) {
  Vec y(out, 0.0);
  for (std::size_t o = 0; o < out; ++o) {
    double s = b ? (*b)[col0 + o] : 0.0;
    for (std::size_t i = 0; i < x.size(); ++i) s += x[i] * W[i * width + col0 + o];
    y[o] = s;
  }
  return y;
}

// BLOOM's ALiBi slopes (build_alibi_tensor): 2^(-8/m) to the powers 1..m for the largest power of
// two m <= n, then 2^(-4/m) to the odd powers for the remaining heads.
double bloom_slope(int h, int n) {
  const int m = 1 << static_cast<int>(std::floor(std::log2(n)));
  const double base = std::pow(2.0, -std::pow(2.0, -(std::log2(m) - 3)));
  if (h < m) return std::pow(base, h + 1);
  const double extra = std::pow(2.0, -std::pow(2.0, -(std::log2(2 * m) - 3)));
  return std::pow(extra, 2 * (h - m) + 1);
}

// Llama's rotary embedding of one head at position t: q cos + rotate_half(q) sin, with
// rotate_half(q) = (-q2, q1) and inv_freq_i = theta^(-2i / hs).
Vec rope(const Vec& q, int t, double theta) {
  const std::size_t hs = q.size(), half = hs / 2;
  Vec y(hs);
  for (std::size_t i = 0; i < hs; ++i) {
    const std::size_t f = i % half;
    const double angle = t * std::pow(theta, -2.0 * static_cast<double>(f) / static_cast<double>(hs));
    const double rot = i < half ? -q[i + half] : q[i - half];
    y[i] = q[i] * std::cos(angle) + rot * std::sin(angle);
  }
  return y;
}

double gelu_tanh(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (x + 0.044715 * x * x * x)));
}

struct Output {
  std::vector<Vec> logits;  // per token, the first vocab_size
  double loss = 0;
};

Output reference(const Weights& w, const std::vector<std::int32_t>& in, const std::vector<std::int32_t>& tg, int B,
                 int T) {
  const GptConfig& c = w.c;
  const std::size_t C = static_cast<std::size_t>(c.n_embd), NH = static_cast<std::size_t>(c.n_head),
                    KV = static_cast<std::size_t>(c.kv_heads()), hs = C / NH, G = NH / KV,
                    F = static_cast<std::size_t>(c.mlp_hidden()), W = static_cast<std::size_t>(c.qkv_width()),
                    V = static_cast<std::size_t>(c.vocab_size);
  Output o;
  for (int b = 0; b < B; ++b) {
    std::vector<Vec> x(static_cast<std::size_t>(T));
    for (int t = 0; t < T; ++t) {
      const std::size_t id = static_cast<std::size_t>(in[static_cast<std::size_t>(b * T + t)]);
      Vec e(w.at("wte.weight").begin() + static_cast<std::ptrdiff_t>(id * C),
            w.at("wte.weight").begin() + static_cast<std::ptrdiff_t>((id + 1) * C));
      if (c.arch == Arch::gpt2)
        for (std::size_t i = 0; i < C; ++i) e[i] += w.at("wpe.weight")[static_cast<std::size_t>(t) * C + i];
      if (c.arch == Arch::bloom) e = norm(w, "ln_e", e);
      x[static_cast<std::size_t>(t)] = e;
    }
    for (int l = 0; l < c.n_layer; ++l) {
      const std::string p = "h." + std::to_string(l) + ".";
      const bool bias = c.arch != Arch::llama;
      const Vec& Wa = w.at(p + "attn.c_attn.weight");
      const Vec* ba = bias ? &w.at(p + "attn.c_attn.bias") : nullptr;
      // Per position: q of every Hugging Face head h (stored as head (h % G) KV + h / G), k and v
      // of every key/value head.
      std::vector<std::vector<Vec>> q(static_cast<std::size_t>(T)), k(static_cast<std::size_t>(T)),
          v(static_cast<std::size_t>(T));
      for (int t = 0; t < T; ++t) {
        const Vec h1 = norm(w, p + "ln_1", x[static_cast<std::size_t>(t)]);
        for (std::size_t h = 0; h < NH; ++h) {
          const std::size_t stored = (h % G) * KV + h / G;
          Vec qh = linear(h1, Wa, W, stored * hs, hs, ba);
          if (c.arch == Arch::llama) qh = rope(qh, t, c.rope_theta);
          q[static_cast<std::size_t>(t)].push_back(qh);
        }
        for (std::size_t g = 0; g < KV; ++g) {
          Vec kh = linear(h1, Wa, W, (NH + g) * hs, hs, ba);
          if (c.arch == Arch::llama) kh = rope(kh, t, c.rope_theta);
          k[static_cast<std::size_t>(t)].push_back(kh);
          v[static_cast<std::size_t>(t)].push_back(linear(h1, Wa, W, (NH + KV + g) * hs, hs, ba));
        }
      }
      for (int t = 0; t < T; ++t) {
        Vec att(C, 0.0);
        for (std::size_t h = 0; h < NH; ++h) {
          const std::size_t g = h / G;
          // The head's place in the fused output is its stored one (the output projection's rows
          // follow the stored q heads).
          const std::size_t stored = (h % G) * KV + h / G;
          std::vector<double> s(static_cast<std::size_t>(t) + 1);
          double mx = -1e300;
          for (int t2 = 0; t2 <= t; ++t2) {
            double d = 0;
            for (std::size_t i = 0; i < hs; ++i)
              d += q[static_cast<std::size_t>(t)][h][i] * k[static_cast<std::size_t>(t2)][g][i];
            d /= std::sqrt(static_cast<double>(hs));
            if (c.arch == Arch::bloom) d += bloom_slope(static_cast<int>(h), c.n_head) * t2;
            s[static_cast<std::size_t>(t2)] = d;
            mx = std::max(mx, d);
          }
          double z = 0;
          for (double& e : s) z += e = std::exp(e - mx);
          for (int t2 = 0; t2 <= t; ++t2)
            for (std::size_t i = 0; i < hs; ++i)
              att[stored * hs + i] += s[static_cast<std::size_t>(t2)] / z * v[static_cast<std::size_t>(t2)][g][i];
        }
        const Vec proj =
            linear(att, w.at(p + "attn.c_proj.weight"), C, 0, C, bias ? &w.at(p + "attn.c_proj.bias") : nullptr);
        for (std::size_t i = 0; i < C; ++i) x[static_cast<std::size_t>(t)][i] += proj[i];
        const Vec h2 = norm(w, p + "ln_2", x[static_cast<std::size_t>(t)]);
        Vec act(F);
        if (c.arch == Arch::llama) {
          const Vec gate = linear(h2, w.at(p + "mlp.c_fc.weight"), 2 * F, 0, F);
          const Vec up = linear(h2, w.at(p + "mlp.c_fc.weight"), 2 * F, F, F);
          for (std::size_t i = 0; i < F; ++i) act[i] = gate[i] / (1.0 + std::exp(-gate[i])) * up[i];
        } else {
          const Vec pre = linear(h2, w.at(p + "mlp.c_fc.weight"), F, 0, F, &w.at(p + "mlp.c_fc.bias"));
          for (std::size_t i = 0; i < F; ++i) act[i] = gelu_tanh(pre[i]);
        }
        const Vec m =
            linear(act, w.at(p + "mlp.c_proj.weight"), C, 0, C, bias ? &w.at(p + "mlp.c_proj.bias") : nullptr);
        for (std::size_t i = 0; i < C; ++i) x[static_cast<std::size_t>(t)][i] += m[i];
      }
    }
    const Vec& head = c.tied_head ? w.at("wte.weight") : w.at("lm_head.weight");
    for (int t = 0; t < T; ++t) {
      const Vec f = norm(w, "ln_f", x[static_cast<std::size_t>(t)]);
      Vec logits(V);
      for (std::size_t id = 0; id < V; ++id) {
        double s = 0;
        for (std::size_t i = 0; i < C; ++i) s += f[i] * head[id * C + i];
        logits[id] = s;
      }
      double mx = -1e300, z = 0;
      for (double e : logits) mx = std::max(mx, e);
      for (double e : logits) z += std::exp(e - mx);
      const std::size_t target = static_cast<std::size_t>(tg[static_cast<std::size_t>(b * T + t)]);
      o.loss += std::log(z) + mx - logits[target];
      o.logits.push_back(std::move(logits));
    }
  }
  o.loss /= B * T;
  return o;
}

GptConfig arch_config(Arch arch) {
  GptConfig c;
  c.arch = arch;
  c.n_layer = 2;
  c.n_embd = 48;
  c.seq_len = 7;
  c.vocab_size = 40;  // padded to 128: the padded rows take no part
  c.n_head = 6;       // not a power of two: BLOOM's extra ALiBi slopes
  if (arch == Arch::llama) {
    c.n_head = 4;
    c.n_kv_head = 2;  // grouped-query: two query heads per key/value head
    c.ffn_hidden = 40;
    c.tied_head = false;
    c.norm_eps = 1e-6;
    c.rope_theta = 500.0;  // large enough angles over 7 positions to matter
  }
  return c;
}

// Every parameter random (norm weights around 1, biases nonzero), padded vocabulary rows 0.
void randomize(HostParams& p, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> n(0.0, 1.0);
  const GptConfig& c = p.config();
  for (int u = 0; u < p.num_units(); ++u)
    for (const auto& t : p.specs()[static_cast<std::size_t>(u)].tensors) {
      auto v = p.tensor(t.name);
      const bool norm_weight = t.name.ends_with("ln_1.weight") || t.name.ends_with("ln_2.weight") ||
                               t.name == "ln_f.weight" || t.name == "ln_e.weight";
      const double scale = t.shape.size() == 2 ? 0.3 : 0.1;
      for (auto& e : v) e = static_cast<float>((norm_weight ? 1.0 : 0.0) + scale * n(rng));
      if (t.name == "wte.weight" || t.name == "lm_head.weight")
        for (std::size_t i = static_cast<std::size_t>(c.vocab_size) * c.n_embd; i < v.size(); ++i) v[i] = 0.0f;
    }
}

void check_architecture(Arch arch) {
  const GptConfig c = arch_config(arch);
  const int B = 2, T = c.seq_len;
  std::mt19937_64 rng(11);
  std::uniform_int_distribution<int> tok(0, c.vocab_size - 1);
  std::vector<std::int32_t> in, tg;
  for (int i = 0; i < B * T; ++i) {
    in.push_back(tok(rng));
    tg.push_back(tok(rng));
  }
  HostParams p(c), g(c);
  randomize(p, 5);
  auto ops = make_host_ops();
  GptModel model(c, B, *ops);
  model.set_batch(in.data(), tg.data(), B, T);
  const double loss = forward_all(model, p);

  const Weights w = read_weights(p);
  const Output ref = reference(w, in, tg, B, T);
  INFO("architecture " << zero::plan::arch_name(arch));
  CHECK(std::abs(loss - ref.loss) < 1e-5);
  double worst = 0;
  std::vector<float> row;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      model.logits_at(b, t, row);
      const Vec& r = ref.logits[static_cast<std::size_t>(b * T + t)];
      REQUIRE(row.size() == r.size());
      for (std::size_t i = 0; i < r.size(); ++i) worst = std::max(worst, std::abs(row[i] - r[i]));
    }
  INFO("largest logit difference " << worst);
  CHECK(worst < 1e-5);

  backward_all(model, p, g);
  // Central differences of the reference loss on a spread of each tensor's elements.
  Weights probe = w;
  int checked = 0;
  double worst_grad = 0, largest = 0;
  for (std::size_t k = 0; k < probe.names.size(); ++k) {
    const std::string& name = probe.names[k];
    const auto grad = g.tensor(name);
    Vec& values = probe.values[k];
    std::size_t limit = values.size();
    if (name == "wte.weight" || name == "lm_head.weight") limit = static_cast<std::size_t>(c.vocab_size) * c.n_embd;
    const std::size_t stride = std::max<std::size_t>(1, limit / 5);
    for (std::size_t i = stride / 2; i < limit; i += stride) {
      const double keep = values[i], h = 1e-5;
      values[i] = keep + h;
      const double up = reference(probe, in, tg, B, T).loss;
      values[i] = keep - h;
      const double down = reference(probe, in, tg, B, T).loss;
      values[i] = keep;
      const double want = (up - down) / (2 * h);
      INFO(name << "[" << i << "]: ours " << grad[i] << ", reference " << want);
      CHECK(std::abs(grad[i] - want) < 1e-5);
      worst_grad = std::max(worst_grad, std::abs(grad[i] - want));
      largest = std::max(largest, std::abs(want));
      ++checked;
    }
    // The padded vocabulary rows get no gradient.
    for (std::size_t i = limit; i < grad.size(); ++i) REQUIRE(grad[i] == 0.0f);
  }
  INFO(checked << " gradient elements, worst difference " << worst_grad << ", largest " << largest);
  CHECK(checked > 50);
  CHECK(largest > 1e-2);  // the check is not of gradients that are all near zero
}

}  // namespace

TEST_CASE("gpt2: host forward and backward match a double-precision reference", "[gpt][arch]") {
  check_architecture(Arch::gpt2);
}

TEST_CASE("bloom: ALiBi and the embedding LayerNorm match a double-precision reference", "[gpt][arch]") {
  check_architecture(Arch::bloom);
}

TEST_CASE("llama: RMSNorm, rotary, SwiGLU, grouped-query attention and an untied head match a reference",
          "[gpt][arch]") {
  check_architecture(Arch::llama);
}
