#include "gpt_model.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "zero/error.hpp"

namespace zero::gpt {

GptModel::GptModel(const GptConfig& cfg, int max_batch, Ops& ops)
    : cfg_(cfg), ops_(&ops), max_b_(max_batch) {
  cfg_.validate();
  ZERO_CHECK(max_batch >= 1, "GptModel: the micro-batch size must be >= 1 (got " +
                                 std::to_string(max_batch) + ")");
  const std::size_t B = static_cast<std::size_t>(max_batch), T = cfg_.seq_len, C = cfg_.n_embd,
                    NH = cfg_.n_head, L = cfg_.n_layer, Vp = cfg_.padded_vocab_size();
  const std::size_t N = B * T;
  const std::size_t att = B * NH * T * T;
  // Per block: ln1, qkv(3), atty, res2, ln2, fch(4), fch_gelu(4) of width C; 4 LayerNorm
  // statistics per row; the attention probabilities.
  const std::size_t per_block = N * C * (1 + 3 + 1 + 1 + 1 + 4 + 4) + 4 * N + att;
  const std::size_t stored_blocks = cfg_.activation_checkpointing ? 1 : L;

  inputs_ = OpsBuffer<std::int32_t>(ops, N);
  targets_ = OpsBuffer<std::int32_t>(ops, N);
  block_store_ = OpsBuffer<float>(ops, per_block * stored_blocks);
  float* p = block_store_.get();
  auto take = [&p](std::size_t n) {
    float* q = p;
    p += n;
    return q;
  };
  for (std::size_t l = 0; l < stored_blocks; ++l) {
    BlockActs a{};
    a.ln1 = take(N * C);
    a.ln1_mean = take(N);
    a.ln1_rstd = take(N);
    a.qkv = take(3 * N * C);
    a.atty = take(N * C);
    a.att = take(att);
    a.res2 = take(N * C);
    a.ln2 = take(N * C);
    a.ln2_mean = take(N);
    a.ln2_rstd = take(N);
    a.fch = take(4 * N * C);
    a.fch_gelu = take(4 * N * C);
    blocks_.push_back(a);
  }
  residual_ = OpsBuffer<float>(ops, (L + 1) * N * C);
  lnf_ = OpsBuffer<float>(ops, N * C);
  lnf_mean_ = OpsBuffer<float>(ops, N);
  lnf_rstd_ = OpsBuffer<float>(ops, N);
  logits_ = OpsBuffer<float>(ops, N * Vp);
  losses_ = OpsBuffer<float>(ops, N);
  dres_ = OpsBuffer<float>(ops, N * C);
  dtmp_ = OpsBuffer<float>(ops, N * C);
  dqkv_ = OpsBuffer<float>(ops, 3 * N * C);
  dfch_gelu_ = OpsBuffer<float>(ops, 4 * N * C);
  dfch_ = OpsBuffer<float>(ops, 4 * N * C);
  datt_ = OpsBuffer<float>(ops, att);
  host_losses_.resize(N);

  activation_bytes_ = 2 * N * sizeof(std::int32_t) +
                      sizeof(float) * (block_store_.size() + residual_.size() + lnf_.size() +
                                       2 * N + logits_.size() + N + dres_.size() + dtmp_.size() +
                                       dqkv_.size() + dfch_gelu_.size() + dfch_.size() + att);
}

void GptModel::set_batch(const std::int32_t* inputs, const std::int32_t* targets, int B, int T) {
  ZERO_CHECK(B >= 1 && B <= max_b_ && T >= 1 && T <= cfg_.seq_len,
             "GptModel::set_batch: batch " + std::to_string(B) + "x" + std::to_string(T) +
                 " does not fit the activations sized for " + std::to_string(max_b_) + "x" +
                 std::to_string(cfg_.seq_len) + "; build the model with a larger max_batch");
  b_ = B;
  t_ = T;
  const std::size_t bytes = static_cast<std::size_t>(B) * T * sizeof(std::int32_t);
  ops_->upload(inputs_.get(), inputs, bytes);
  has_targets_ = targets != nullptr;
  if (has_targets_) ops_->upload(targets_.get(), targets, bytes);
  loss_ = 0.0;
}

void GptModel::check_layer(int layer, const char* what) const {
  ZERO_CHECK(layer >= 0 && layer < cfg_.n_layer,
             std::string("GptModel::") + what + ": layer " + std::to_string(layer) +
                 " out of range [0, " + std::to_string(cfg_.n_layer) + ")");
  ZERO_CHECK(b_ > 0, std::string("GptModel::") + what + ": call set_batch first");
}

void GptModel::forward_embeddings(const float* const* emb) {
  ZERO_CHECK(b_ > 0, "GptModel::forward_embeddings: call set_batch first");
  ops_->encoder_forward(residual(0), inputs_.get(), emb[kWte], emb[kWpe], b_, t_, cfg_.n_embd);
}

void GptModel::block_forward(const BlockActs& a, const float* in, float* out,
                             const float* const* p) {
  const int N = b_ * t_, C = cfg_.n_embd;
  const std::size_t NC = static_cast<std::size_t>(N) * C;
  ops_->layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, in, p[kLn1W], p[kLn1B], N, C);
  ops_->matmul_forward(a.qkv, a.ln1, p[kAttnW], p[kAttnB], N, C, 3 * C);
  ops_->attention_forward(a.atty, a.att, a.qkv, b_, t_, C, cfg_.n_head);
  ops_->matmul_forward(a.res2, a.atty, p[kAttnProjW], p[kAttnProjB], N, C, C);
  ops_->residual_forward(a.res2, a.res2, in, NC);
  ops_->layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, p[kLn2W], p[kLn2B], N, C);
  ops_->matmul_forward(a.fch, a.ln2, p[kFcW], p[kFcB], N, C, 4 * C);
  ops_->gelu_forward(a.fch_gelu, a.fch, 4 * NC);
  // The recompute before a backward needs only the block's internals, not its output.
  if (!out) return;
  ops_->matmul_forward(out, a.fch_gelu, p[kFcProjW], p[kFcProjB], N, 4 * C, C);
  ops_->residual_forward(out, out, a.res2, NC);
}

double block_forward_flops_per_token(const GptConfig& cfg, bool recompute) {
  const double C = cfg.n_embd, T = cfg.seq_len;
  // The products of block_forward, in its order.
  const double qkv = 2 * C * 3 * C, attention = 2 * T * C, proj = 2 * C * C, fc = 2 * C * 4 * C,
               fc_proj = 2 * 4 * C * C;
  const double up_to_fc = qkv + attention + proj + fc;
  return recompute ? up_to_fc : up_to_fc + fc_proj;
}

TokenFlops training_flops_per_token(const GptConfig& cfg) {
  const double L = cfg.n_layer, C = cfg.n_embd, T = cfg.seq_len;
  TokenFlops f;
  f.model = 6.0 * static_cast<double>(cfg.num_params()) + 6.0 * L * T * C;
  if (cfg.activation_checkpointing) f.recompute = L * block_forward_flops_per_token(cfg, true);
  return f;
}

void GptModel::forward_block(int layer, const float* const* block) {
  check_layer(layer, "forward_block");
  block_forward(acts(layer), residual(layer), residual(layer + 1), block);
}

void GptModel::forward_head(const float* const* ln_f, const float* const* emb) {
  ZERO_CHECK(b_ > 0, "GptModel::forward_head: call set_batch first");
  const int N = b_ * t_, C = cfg_.n_embd, Vp = cfg_.padded_vocab_size();
  ops_->layernorm_forward(lnf_.get(), lnf_mean_.get(), lnf_rstd_.get(), residual(cfg_.n_layer),
                          ln_f[kLnfW], ln_f[kLnfB], N, C);
  ops_->logits_forward(logits_.get(), lnf_.get(), emb[kWte], N, C, Vp);
  if (!has_targets_) return;
  ops_->softmax_cross_entropy(losses_.get(), nullptr, logits_.get(), targets_.get(), N,
                              cfg_.vocab_size, Vp, 0.0f);
  ops_->download(host_losses_.data(), losses_.get(), static_cast<std::size_t>(N) * sizeof(float));
  double sum = 0.0;
  for (int i = 0; i < N; ++i) sum += host_losses_[static_cast<std::size_t>(i)];
  loss_ = sum / N;
}

void GptModel::logits_at(int b, int t, std::vector<float>& out) const {
  ZERO_CHECK(b >= 0 && b < b_ && t >= 0 && t < t_,
             "GptModel::logits_at: position (" + std::to_string(b) + ", " + std::to_string(t) +
                 ") is outside the last batch " + std::to_string(b_) + "x" + std::to_string(t_));
  out.resize(static_cast<std::size_t>(cfg_.vocab_size));
  const std::size_t row = static_cast<std::size_t>(b) * t_ + t;
  ops_->download(out.data(), logits_.get() + row * cfg_.padded_vocab_size(),
                 out.size() * sizeof(float));
}

void GptModel::backward_head(const float* const* ln_f, float* const* d_ln_f,
                             const float* const* emb, float* const* d_emb, float dloss) {
  ZERO_CHECK(has_targets_, "GptModel::backward_head: the batch has no targets (set_batch with "
                           "targets before a training forward)");
  const int N = b_ * t_, C = cfg_.n_embd, Vp = cfg_.padded_vocab_size();
  const std::size_t NC = static_cast<std::size_t>(N) * C;
  // The loss is a mean over the N positions; the logits become their own gradient in place.
  ops_->softmax_cross_entropy(losses_.get(), logits_.get(), logits_.get(), targets_.get(), N,
                              cfg_.vocab_size, Vp, dloss / static_cast<float>(N));
  ops_->fill_zero(dtmp_.get(), NC);
  ops_->logits_backward(dtmp_.get(), d_emb[kWte], logits_.get(), lnf_.get(), emb[kWte], N, C, Vp);
  ops_->fill_zero(dres_.get(), NC);
  ops_->layernorm_backward(dres_.get(), d_ln_f[kLnfW], d_ln_f[kLnfB], dtmp_.get(),
                           residual(cfg_.n_layer), ln_f[kLnfW], lnf_mean_.get(), lnf_rstd_.get(),
                           N, C);
}

void GptModel::backward_block(int layer, const float* const* p, float* const* g) {
  check_layer(layer, "backward_block");
  const int N = b_ * t_, C = cfg_.n_embd;
  const std::size_t NC = static_cast<std::size_t>(N) * C;
  const float* in = residual(layer);
  if (cfg_.activation_checkpointing) block_forward(acts(layer), in, nullptr, p);
  const BlockActs& a = acts(layer);
  float* dres = dres_.get();  // d(block output) on entry, d(block input) on exit
  float* dtmp = dtmp_.get();

  // MLP branch: out = res2 + fcproj(gelu(fc(ln2(res2)))).
  ops_->fill_zero(dfch_gelu_.get(), 4 * NC);
  ops_->matmul_backward(dfch_gelu_.get(), g[kFcProjW], g[kFcProjB], dres, a.fch_gelu, p[kFcProjW],
                        N, 4 * C, C);
  ops_->fill_zero(dfch_.get(), 4 * NC);
  ops_->gelu_backward(dfch_.get(), a.fch, dfch_gelu_.get(), 4 * NC);
  ops_->fill_zero(dtmp, NC);
  ops_->matmul_backward(dtmp, g[kFcW], g[kFcB], dfch_.get(), a.ln2, p[kFcW], N, C, 4 * C);
  // The residual path passes dres through unchanged; the LayerNorm adds its branch to it.
  ops_->layernorm_backward(dres, g[kLn2W], g[kLn2B], dtmp, a.res2, p[kLn2W], a.ln2_mean,
                           a.ln2_rstd, N, C);

  // Attention branch: res2 = in + proj(attention(qkv(ln1(in)))).
  ops_->fill_zero(dtmp, NC);
  ops_->matmul_backward(dtmp, g[kAttnProjW], g[kAttnProjB], dres, a.atty, p[kAttnProjW], N, C, C);
  ops_->fill_zero(dqkv_.get(), 3 * NC);
  ops_->attention_backward(dqkv_.get(), datt_.get(), dtmp, a.qkv, a.att, b_, t_, C, cfg_.n_head);
  ops_->fill_zero(dtmp, NC);
  ops_->matmul_backward(dtmp, g[kAttnW], g[kAttnB], dqkv_.get(), a.ln1, p[kAttnW], N, C, 3 * C);
  ops_->layernorm_backward(dres, g[kLn1W], g[kLn1B], dtmp, in, p[kLn1W], a.ln1_mean, a.ln1_rstd,
                           N, C);
}

void GptModel::backward_embeddings(float* const* d_emb) {
  ZERO_CHECK(b_ > 0, "GptModel::backward_embeddings: call set_batch first");
  ops_->encoder_backward(d_emb[kWte], d_emb[kWpe], dres_.get(), inputs_.get(), b_, t_,
                         cfg_.n_embd);
}

HostParams::HostParams(const GptConfig& cfg) : cfg_(cfg), specs_(gpt_units(cfg)) {
  for (const auto& u : specs_) {
    std::int64_t n = 0;
    for (const auto& t : u.tensors) n += t.numel();
    auto& d = data_.emplace_back(static_cast<std::size_t>(n), 0.0f);
    auto& ptrs = ptrs_.emplace_back();
    std::size_t off = 0;
    for (const auto& t : u.tensors) {
      ptrs.push_back(d.data() + off);
      off += static_cast<std::size_t>(t.numel());
    }
  }
}

void HostParams::init(std::uint64_t seed) {
  for (std::size_t u = 0; u < specs_.size(); ++u)
    for (std::size_t i = 0; i < specs_[u].tensors.size(); ++i) {
      const auto& t = specs_[u].tensors[i];
      init_parameter(cfg_, t.name, {ptrs_[u][i], static_cast<std::size_t>(t.numel())}, seed);
    }
}

void HostParams::zero() {
  for (auto& d : data_) std::fill(d.begin(), d.end(), 0.0f);
}

std::span<float> HostParams::tensor(std::string_view name) {
  for (std::size_t u = 0; u < specs_.size(); ++u)
    for (std::size_t i = 0; i < specs_[u].tensors.size(); ++i)
      if (specs_[u].tensors[i].name == name)
        return {ptrs_[u][i], static_cast<std::size_t>(specs_[u].tensors[i].numel())};
  ZERO_THROW("HostParams: no tensor named '" + std::string(name) +
             "'; names follow Hugging Face GPT-2 (wte.weight, h.0.attn.c_attn.weight, ...)");
}

double forward_all(GptModel& model, const HostParams& p) {
  const int L = model.config().n_layer;
  model.forward_embeddings(p.unit(embeddings_unit()));
  for (int l = 0; l < L; ++l) model.forward_block(l, p.unit(block_unit(l)));
  model.forward_head(p.unit(ln_f_unit(model.config())), p.unit(embeddings_unit()));
  return model.loss();
}

void backward_all(GptModel& model, const HostParams& p, HostParams& grads, float dloss) {
  const int L = model.config().n_layer;
  const int lnf = ln_f_unit(model.config());
  model.backward_head(p.unit(lnf), grads.unit(lnf), p.unit(embeddings_unit()),
                      grads.unit(embeddings_unit()), dloss);
  for (int l = L - 1; l >= 0; --l) model.backward_block(l, p.unit(block_unit(l)), grads.unit(block_unit(l)));
  model.backward_embeddings(grads.unit(embeddings_unit()));
}

int sample_token(std::span<const float> logits, float temperature, int top_k, double coin) {
  ZERO_CHECK(!logits.empty(), "sample_token: empty logits");
  if (temperature <= 0.0f)
    return static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  std::vector<int> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  const std::size_t k = (top_k <= 0 || static_cast<std::size_t>(top_k) > ids.size())
                            ? ids.size()
                            : static_cast<std::size_t>(top_k);
  auto at = [&](int id) { return logits[static_cast<std::size_t>(id)]; };
  // Largest first; ties broken by id so the choice is reproducible.
  std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(),
                    [&](int a, int b) { return at(a) > at(b) || (at(a) == at(b) && a < b); });
  const double mx = at(ids[0]);
  std::vector<double> p(k);
  double sum = 0.0;
  for (std::size_t i = 0; i < k; ++i) sum += p[i] = std::exp((at(ids[i]) - mx) / temperature);
  const double target = coin * sum;
  double acc = 0.0;
  for (std::size_t i = 0; i < k; ++i) {
    acc += p[i];
    if (target < acc) return ids[i];
  }
  return ids[k - 1];
}

}  // namespace zero::gpt
