#include "gpt/gpt_model.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "zero/error.hpp"

namespace zero::gpt {

GptModel::GptModel(const GptConfig& cfg, int max_batch, Ops& ops, const TensorParallel& tp, ModelPart part)
    : cfg_(cfg), tp_(tp), part_(part), ops_(&ops), es_(ops.elem_bytes()), max_b_(max_batch) {
  cfg_.validate();
  check_tensor_parallel(cfg_, tp_.size);
  ZERO_CHECK(
      tp_.rank >= 0 && tp_.rank < tp_.size && (tp_.size == 1 || tp_.comm),
      fmt::format("GptModel: tensor rank {} of {} needs a communicator of the tensor group", tp_.rank, tp_.size));
  ZERO_CHECK(max_batch >= 1, fmt::format("GptModel: the micro-batch size must be >= 1 (got {})", max_batch));
  if (part_.end_layer < 0) part_.end_layer = cfg_.n_layer;
  ZERO_CHECK(part_.first_layer >= 0 && part_.first_layer < part_.end_layer && part_.end_layer <= cfg_.n_layer &&
                 (!part_.embeddings || part_.first_layer == 0) && (!part_.head || part_.end_layer == cfg_.n_layer),
             fmt::format("GptModel: the part [{}, {}) is not a non-empty range of the {} blocks that starts at 0 when "
                         "it holds the embeddings and ends at n_layer when it holds the head",
                         part_.first_layer, part_.end_layer, cfg_.n_layer));
  ZERO_CHECK(part_.slots >= 1 && (!part_.head || part_.slots == 1),
             fmt::format("GptModel: {} micro-batch slots; a part needs at least one, and the part with the head "
                         "exactly one (its micro-batch's backward follows its forward)",
                         part_.slots));
  ca_ = cfg_.n_embd / tp_.size;
  nh_ = cfg_.n_head / tp_.size;
  qkv_ = static_cast<int>(cfg_.qkv_part_width(tp_.size));
  if (tp_.active() && cfg_.kv_replicated(tp_.size)) rep_ = std::make_unique<ReplicatedAttention>(cfg_, tp_, ops);
  fc_ = static_cast<int>(cfg_.mlp_hidden() / tp_.size);
  fcin_ = cfg_.gated_mlp() ? 2 * fc_ : fc_;
  vl_ = tp_.vocab_rows(cfg_);
  v0_ = tp_.vocab_begin(cfg_);
  slots_ = tensor_slots(cfg_);
  att_ = AttentionShape{.B = max_batch,
                        .T = cfg_.seq_len,
                        .NH = nh_,
                        .NKV = rep_ ? 1 : cfg_.kv_heads() / tp_.size,
                        .hs = cfg_.head_size(),
                        .alibi_heads = cfg_.alibi() ? cfg_.n_head : 0,
                        .head0 = tp_.rank * nh_};
  const std::size_t B = static_cast<std::size_t>(max_batch), T = cfg_.seq_len, C = cfg_.n_embd,
                    L = static_cast<std::size_t>(part_.end_layer - part_.first_layer),
                    Vl = static_cast<std::size_t>(vl_), S = static_cast<std::size_t>(part_.slots);
  const std::size_t CA = static_cast<std::size_t>(ca_), FC = static_cast<std::size_t>(fc_),
                    FCIN = static_cast<std::size_t>(fcin_), QKV = static_cast<std::size_t>(qkv_);
  const std::size_t N = B * T;
  nc_max_ = N * C;
  const std::size_t stats = ops.attention_stats_floats(max_batch, cfg_.seq_len, nh_);
  // Per block: ln1, res2, ln2 of width C; this rank's qkv, atty (CA), fch (FCIN) and fch_gelu
  // (FC) in the Ops' dtype; 4 norm statistics per row and the attention's statistics in fp32.
  const std::size_t per_block = N * (3 * C + QKV + CA + FCIN + FC);
  const std::size_t per_block_stats = 4 * N + stats;
  const std::size_t stored_blocks = cfg_.activation_checkpointing ? 1 : L * S;
  const std::size_t f4 = sizeof(float), i4 = sizeof(std::int32_t);

  inputs_ = OpsBuffer(ops, S * N * i4);
  targets_ = OpsBuffer(ops, S * N * i4);
  block_store_ = OpsBuffer(ops, per_block * stored_blocks * es_);
  block_stats_ = OpsBuffer(ops, per_block_stats * stored_blocks * f4);
  std::size_t next = 0, next_stat = 0;
  auto take = [&](std::size_t n) {
    Act* q = at(block_store_, next);
    next += n;
    return q;
  };
  auto take_stat = [&](std::size_t n) {
    float* q = block_stats_.as<float>() + next_stat;
    next_stat += n;
    return q;
  };
  for (std::size_t l = 0; l < stored_blocks; ++l) {
    BlockActs a{};
    a.ln1 = take(N * C);
    a.qkv = take(N * QKV);
    a.atty = take(N * CA);
    a.res2 = take(N * C);
    a.ln2 = take(N * C);
    a.fch = take(N * FCIN);
    a.fch_gelu = take(N * FC);
    a.ln1_mean = take_stat(N);
    a.ln1_rstd = take_stat(N);
    a.ln2_mean = take_stat(N);
    a.ln2_rstd = take_stat(N);
    a.att_stats = take_stat(stats);
    blocks_.push_back(a);
  }
  residual_ = OpsBuffer(ops, S * (L + 1) * N * C * es_);
  if (part_.embeddings && cfg_.embedding_norm()) {
    emb_raw_ = OpsBuffer(ops, S * N * C * es_);
    emb_stats_ = OpsBuffer(ops, S * 2 * N * f4);
  }
  if (part_.head) {
    lnf_ = OpsBuffer(ops, N * C * es_);
    lnf_mean_ = OpsBuffer(ops, N * f4);
    lnf_rstd_ = OpsBuffer(ops, N * f4);
    logits_ = OpsBuffer(ops, N * Vl * es_);
    if (tp_.active()) {
      ce_max_ = OpsBuffer(ops, N * f4);
      ce_sums_ = OpsBuffer(ops, 2 * N * f4);
    }
    losses_ = OpsBuffer(ops, N * f4);
    host_losses_.resize(N);
  }
  loss_total_ = OpsBuffer(ops, sizeof(double));
  ops.fill_zero(loss_total_.as<void>(), sizeof(double));
  dres_ = OpsBuffer(ops, N * C * es_);
  dtmp_ = OpsBuffer(ops, N * C * es_);
  dqkv_ = OpsBuffer(ops, N * QKV * es_);
  dfch_ = OpsBuffer(ops, N * FCIN * es_);
  if (cfg_.gated_mlp()) dact_ = OpsBuffer(ops, N * FC * es_);
  att_scratch_ = OpsBuffer(ops, ops.attention_scratch_floats(max_batch, cfg_.seq_len, nh_) * f4);
  ops.reserve(static_cast<int>(N), cfg_.seq_len, cfg_.n_embd, cfg_.n_head);
  tp_.reserve(ops, N * C);  // the largest all-reduce: [N, C] activations (the statistics are fp32)

  for (const OpsBuffer* b : {&inputs_, &targets_,  &block_store_, &block_stats_, &residual_, &emb_raw_, &emb_stats_,
                             &lnf_,    &lnf_mean_, &lnf_rstd_,    &logits_,      &losses_,   &dres_,    &dtmp_,
                             &dqkv_,   &dfch_,     &dact_,        &att_scratch_, &ce_max_,   &ce_sums_})
    activation_bytes_ += b->bytes();
}

void GptModel::set_slot(int slot) {
  ZERO_CHECK(slot >= 0 && slot < part_.slots,
             fmt::format("GptModel::set_slot: slot {} out of range [0, {})", slot, part_.slots));
  slot_ = slot;
}

void GptModel::set_batch(const std::int32_t* inputs, const std::int32_t* targets, int B, int T) {
  ZERO_CHECK(B >= 1 && B <= max_b_ && T >= 1 && T <= cfg_.seq_len,
             fmt::format("GptModel::set_batch: batch {}x{} does not fit the activations sized for {}x{}; build the "
                         "model with a larger max_batch",
                         B, T, max_b_, cfg_.seq_len));
  b_ = B;
  t_ = T;
  const std::size_t bytes = static_cast<std::size_t>(B) * T * sizeof(std::int32_t);
  ops_->upload(slot_ids(inputs_), inputs, bytes);
  has_targets_ = targets != nullptr;
  if (has_targets_) ops_->upload(slot_ids(targets_), targets, bytes);
  loss_ready_ = false;
}

void GptModel::require_part(bool held, const char* what) const {
  ZERO_CHECK(held, fmt::format("GptModel::{}: this pipeline part (blocks {} to {}) does not hold {}", what,
                               part_.first_layer, part_.end_layer - 1,
                               std::string_view(what).find("head") != std::string_view::npos
                                   ? "ln_f and the head (the last part does)"
                                   : "the embeddings (the first part does)"));
}

void GptModel::check_layer(int layer, const char* what) const {
  ZERO_CHECK(
      layer >= part_.first_layer && layer < part_.end_layer,
      fmt::format("GptModel::{}: layer {} out of range [{}, {}){}", what, layer, part_.first_layer, part_.end_layer,
                  part_.end_layer - part_.first_layer < cfg_.n_layer ? " (this pipeline part's blocks)" : ""));
  ZERO_CHECK(b_ > 0, std::string("GptModel::") + what + ": call set_batch first");
}

void GptModel::norm_forward(Act* out, float* mean, float* rstd, const Act* inp, const Act* w, const Act* b, int N) {
  if (cfg_.rms_norm())
    ops_->rmsnorm_forward(out, rstd, inp, w, N, cfg_.n_embd, static_cast<float>(cfg_.norm_eps));
  else
    ops_->layernorm_forward(out, mean, rstd, inp, w, b, N, cfg_.n_embd);
}

void GptModel::norm_backward(Act* dinp, Act* dw, Act* db, const Act* dout, const Act* inp, const Act* w,
                             const float* mean, const float* rstd, int N) {
  if (cfg_.rms_norm())
    ops_->rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, cfg_.n_embd);
  else
    ops_->layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, cfg_.n_embd);
}

void GptModel::forward_embeddings(const Act* const* emb) {
  ZERO_CHECK(b_ > 0, "GptModel::forward_embeddings: call set_batch first");
  require_part(part_.embeddings, "forward_embeddings");
  const auto& e = slots_.embeddings;
  const Act* wpe = pick(emb, e, kWpe);
  // bloom normalises the embedding (ln_e): the lookup goes to its own buffer first.
  Act* out = cfg_.embedding_norm() ? embedding_raw() : residual(0);
  const int N = b_ * t_;
  if (!tp_.active()) {
    ops_->encoder_forward(out, slot_ids(inputs_), emb[kWte], wpe, b_, t_, cfg_.n_embd);
  } else {
    // Each rank looks up its own vocabulary rows (zeros for the others' ids), rank 0 adds the
    // positions, and the sum over the group is the embedding.
    ops_->encoder_forward_part(out, slot_ids(inputs_), emb[kWte], row_bias(wpe), b_, t_, cfg_.n_embd, v0_, vl_);
    tp_.all_reduce(*ops_, out, static_cast<std::size_t>(N) * cfg_.n_embd);
  }
  if (cfg_.embedding_norm())
    ops_->layernorm_forward(residual(0), embedding_stats(), embedding_stats() + N, out, pick(emb, e, kLneW),
                            pick(emb, e, kLneB), N, cfg_.n_embd);
}

void GptModel::block_forward(const BlockActs& a, const Act* in, Act* out, const Act* const* p) {
  const int N = b_ * t_, C = cfg_.n_embd;
  const std::size_t NC = static_cast<std::size_t>(N) * C;
  const auto& s = slots_.block;
  const AttentionShape att = batch_attention();
  norm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, in, p[s[kLn1W]], pick(p, s, kLn1B), N);
  // Under tensor parallelism qkv holds this rank's heads (qkv_ columns: its query groups with
  // their key/value heads) and fch its hidden columns; the two output projections make partial
  // sums.
  ops_->matmul_forward(a.qkv, a.ln1, attn_weight(p), pick(p, s, kAttnB), N, C, qkv_);
  if (cfg_.rotary()) ops_->rotary_forward(a.qkv, att, static_cast<float>(cfg_.rope_theta));
  ops_->attention_forward(a.atty, a.att_stats, a.qkv, att);
  ops_->matmul_forward(a.res2, a.atty, attn_proj_weight(p), row_bias(pick(p, s, kAttnProjB)), N, ca_, C);
  tp_.all_reduce(*ops_, a.res2, NC);
  if (cfg_.rms_norm()) {
    ops_->residual_forward(a.res2, a.res2, in, NC);
    norm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, p[s[kLn2W]], nullptr, N);
  } else {
    ops_->residual_layernorm_forward(a.res2, a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, in, p[s[kLn2W]], p[s[kLn2B]], N, C);
  }
  if (cfg_.gated_mlp()) {
    ops_->matmul_forward(a.fch, a.ln2, p[s[kFcW]], nullptr, N, C, fcin_);
    ops_->swiglu_forward(a.fch_gelu, a.fch, N, fc_);
  } else {
    ops_->matmul_forward(a.fch_gelu, a.ln2, p[s[kFcW]], pick(p, s, kFcB), N, C, fc_, a.fch);
  }
  // The recompute before a backward needs only the block's internals, not its output.
  if (!out) return;
  ops_->matmul_forward(out, a.fch_gelu, p[s[kFcProjW]], row_bias(pick(p, s, kFcProjB)), N, fc_, C);
  tp_.all_reduce(*ops_, out, NC);
  ops_->residual_forward(out, out, a.res2, NC);
}

double block_forward_flops_per_token(const GptConfig& cfg, bool recompute) {
  const double C = cfg.n_embd, T = cfg.seq_len, F = static_cast<double>(cfg.mlp_hidden());
  // The products of block_forward, in its order (SwiGLU's gate and up are one product of 2F).
  const double qkv = 2 * C * static_cast<double>(cfg.qkv_width()), attention = 2 * T * C, proj = 2 * C * C,
               fc = 2 * C * F * (cfg.gated_mlp() ? 2 : 1), fc_proj = 2 * F * C;
  const double up_to_fc = qkv + attention + proj + fc;
  return recompute ? up_to_fc : up_to_fc + fc_proj;
}

TokenFlops training_flops_per_token(const GptConfig& cfg) {
  const double L = cfg.n_layer, C = cfg.n_embd, T = cfg.seq_len;
  TokenFlops f;
  f.model = 6.0 * static_cast<double>(cfg.flops_params()) + 6.0 * L * T * C;
  if (cfg.activation_checkpointing) f.recompute = L * block_forward_flops_per_token(cfg, true);
  return f;
}

void GptModel::forward_block(int layer, const Act* const* block) {
  check_layer(layer, "forward_block");
  block_forward(acts(layer), residual(layer), residual(layer + 1), block);
}

void GptModel::forward_head(const Act* const* ln_f, const Act* const* emb) {
  ZERO_CHECK(b_ > 0, "GptModel::forward_head: call set_batch first");
  require_part(part_.head, "forward_head");
  const int N = b_ * t_, C = cfg_.n_embd;
  const auto& s = slots_.ln_f;
  norm_forward(lnf_.as<Act>(), lnf_mean_.as<float>(), lnf_rstd_.as<float>(), residual(cfg_.n_layer), ln_f[s[kLnfW]],
               pick(ln_f, s, kLnfB), N);
  const Act* head = cfg_.tied_head ? emb[kWte] : ln_f[s[kLmHead]];
  ops_->logits_forward(logits_.as<Act>(), lnf_.as<Act>(), head, N, C, vl_);
  if (!has_targets_) return;
  cross_entropy(nullptr, 0.0f, false);
  ops_->add_mean(loss_total_.as<double>(), losses_.as<float>(), N);
  ++loss_terms_;
  loss_ready_ = true;
}

void GptModel::cross_entropy(Act* dlogits, float dloss, bool stats_ready) {
  const int N = b_ * t_, V = cfg_.vocab_size;
  const std::int32_t* targets = slot_ids(targets_);
  if (!tp_.active()) {
    ops_->softmax_cross_entropy(losses_.as<float>(), dlogits, logits_.as<Act>(), targets, N, V,
                                cfg_.padded_vocab_size(), dloss);
    return;
  }
  // The softmax over the whole vocabulary from the parts: the row maximum, then the sum of
  // exp(l - max) and the target's logit, each reduced over the tensor group.
  float* mx = ce_max_.as<float>();
  float* sums = ce_sums_.as<float>();
  const auto n = static_cast<std::size_t>(N);
  if (!stats_ready) {
    ops_->cross_entropy_part_max(mx, logits_.as<Act>(), N, vl_, v0_, V);
    tp_.all_reduce(*ops_, mx, n, zero::ReduceOp::max);
    ops_->cross_entropy_part_sums(sums, logits_.as<Act>(), mx, targets, N, vl_, v0_, V);
    tp_.all_reduce(*ops_, sums, 2 * n, zero::ReduceOp::sum);
  }
  ops_->cross_entropy_part_finish(losses_.as<float>(), dlogits, logits_.as<Act>(), mx, sums, targets, N, vl_, v0_, V,
                                  dloss);
}

double GptModel::loss() const {
  if (!has_targets_) return 0.0;  // sampling: no loss
  ZERO_CHECK(loss_ready_, "GptModel::loss: no forward since the last set_batch");
  const int N = b_ * t_;
  ops_->download(host_losses_.data(), losses_.as<float>(), static_cast<std::size_t>(N) * sizeof(float));
  double sum = 0.0;
  for (int i = 0; i < N; ++i) sum += host_losses_[static_cast<std::size_t>(i)];
  return sum / N;
}

void GptModel::reset_loss_total() {
  ops_->fill_zero(loss_total_.as<void>(), sizeof(double));
  loss_terms_ = 0;
}

double GptModel::take_mean_loss() {
  ZERO_CHECK(loss_terms_ > 0, "GptModel::take_mean_loss: no forward with targets since the reset");
  double total = 0.0;
  ops_->download(&total, loss_total_.as<double>(), sizeof total);
  const double mean = total / loss_terms_;
  reset_loss_total();
  return mean;
}

void GptModel::logits_at(int b, int t, std::vector<float>& out) const {
  ZERO_CHECK(b >= 0 && b < b_ && t >= 0 && t < t_,
             fmt::format("GptModel::logits_at: position ({}, {}) is outside the last batch {}x{}", b, t, b_, t_));
  const std::size_t V = static_cast<std::size_t>(cfg_.vocab_size);
  const std::size_t row = static_cast<std::size_t>(b) * t_ + t;
  // This rank's ids [v0_, v0_ + vl_) in their place of the whole row, zeros elsewhere; under
  // tensor parallelism the group's sum is the whole row.
  const std::size_t Vl = static_cast<std::size_t>(vl_), v0 = static_cast<std::size_t>(v0_);
  std::vector<std::byte> raw(Vl * es_);
  ops_->download(raw.data(), at(logits_, row * Vl), raw.size());
  std::vector<float> whole(static_cast<std::size_t>(cfg_.padded_vocab_size()), 0.0f);
  zero::convert(raw.data(), ops_->dtype(), whole.data() + v0, zero::DType::f32, Vl);
  if (tp_.active()) tp_.comm->all_reduce(whole.data(), whole.size(), zero::DType::f32, zero::ReduceOp::sum);
  out.assign(whole.begin(), whole.begin() + static_cast<std::ptrdiff_t>(V));
}

void GptModel::backward_head(const Act* const* ln_f, Act* const* d_ln_f, const Act* const* emb, Act* const* d_emb,
                             float dloss) {
  require_part(part_.head, "backward_head");
  ZERO_CHECK(has_targets_,
             "GptModel::backward_head: the batch has no targets (set_batch with "
             "targets before a training forward)");
  const int N = b_ * t_, C = cfg_.n_embd;
  const std::size_t NC = static_cast<std::size_t>(N) * C;
  // The loss is a mean over the N positions; the logits become their own gradient in place.
  Act* logits = logits_.as<Act>();
  // Under tensor parallelism the forward's reduced statistics serve again: no all-reduce here.
  cross_entropy(logits, dloss / static_cast<float>(N), true);
  ops_->fill_zero(dtmp_.as<void>(), NC * es_);
  const auto& s = slots_.ln_f;
  const Act* head = cfg_.tied_head ? emb[kWte] : ln_f[s[kLmHead]];
  Act* d_head = cfg_.tied_head ? d_emb[kWte] : d_ln_f[s[kLmHead]];
  ops_->logits_backward(dtmp_.as<Act>(), d_head, logits, lnf_.as<Act>(), head, N, C, vl_);
  // Each rank's ids give part of d(ln_f output).
  tp_.all_reduce(*ops_, dtmp_.as<Act>(), NC);
  ops_->fill_zero(dres_.as<void>(), NC * es_);
  norm_backward(dres_.as<Act>(), d_ln_f[s[kLnfW]], pick(d_ln_f, s, kLnfB), dtmp_.as<Act>(), residual(cfg_.n_layer),
                ln_f[s[kLnfW]], lnf_mean_.as<float>(), lnf_rstd_.as<float>(), N);
}

void GptModel::backward_block(int layer, const Act* const* p, Act* const* g) {
  check_layer(layer, "backward_block");
  const int N = b_ * t_, C = cfg_.n_embd;
  const std::size_t NC = static_cast<std::size_t>(N) * C;
  const Act* in = residual(layer);
  if (cfg_.activation_checkpointing) block_forward(acts(layer), in, nullptr, p);
  const BlockActs& a = acts(layer);
  Act* dres = dres_.as<Act>();  // d(block output) on entry, d(block input) on exit
  Act* dtmp = dtmp_.as<Act>();
  Act* dqkv = dqkv_.as<Act>();
  Act* dfch = dfch_.as<Act>();

  const auto& s = slots_.block;
  const AttentionShape att = batch_attention();

  // MLP branch: out = res2 + fcproj(act(fc(ln2(res2)))). With GELU, the fused product backward
  // overwrites dfch with the gradient of the GELU's input; SwiGLU's backward overwrites it with
  // those of gate and up.
  // Under tensor parallelism the replicated biases of the row-parallel products get the same
  // gradient on every rank (dres is the group's), and each column-parallel product's input
  // gradient is this rank's part of a sum.
  if (cfg_.gated_mlp()) {
    Act* dact = dact_.as<Act>();
    ops_->fill_zero(dact, static_cast<std::size_t>(N) * fc_ * es_);
    ops_->matmul_backward(dact, g[s[kFcProjW]], nullptr, dres, a.fch_gelu, p[s[kFcProjW]], N, fc_, C);
    ops_->swiglu_backward(dfch, dact, a.fch, N, fc_);
  } else {
    ops_->matmul_backward(dfch, g[s[kFcProjW]], pick(g, s, kFcProjB), dres, a.fch_gelu, p[s[kFcProjW]], N, fc_, C,
                          a.fch);
  }
  ops_->fill_zero(dtmp, NC * es_);
  ops_->matmul_backward(dtmp, g[s[kFcW]], pick(g, s, kFcB), dfch, a.ln2, p[s[kFcW]], N, C, fcin_);
  tp_.all_reduce(*ops_, dtmp, NC);
  // The residual path passes dres through unchanged; the norm adds its branch to it.
  norm_backward(dres, g[s[kLn2W]], pick(g, s, kLn2B), dtmp, a.res2, p[s[kLn2W]], a.ln2_mean, a.ln2_rstd, N);

  // Attention branch: res2 = in + proj(attention(qkv(ln1(in)))).
  const std::size_t NCA = static_cast<std::size_t>(N) * ca_;
  ops_->fill_zero(dtmp, NCA * es_);
  Act* d_proj = rep_ ? rep_->proj_grad() : g[s[kAttnProjW]];
  ops_->matmul_backward(dtmp, d_proj, pick(g, s, kAttnProjB), dres, a.atty, attn_proj_weight(p), N, ca_, C);
  ops_->fill_zero(dqkv, static_cast<std::size_t>(N) * qkv_ * es_);
  ops_->attention_backward(dqkv, att_scratch_.as<float>(), dtmp, a.qkv, a.atty, a.att_stats, att);
  if (cfg_.rotary()) ops_->rotary_backward(dqkv, att, static_cast<float>(cfg_.rope_theta));
  ops_->fill_zero(dtmp, NC * es_);
  Act* d_qkv = rep_ ? rep_->qkv_grad() : g[s[kAttnW]];
  ops_->matmul_backward(dtmp, d_qkv, pick(g, s, kAttnB), dqkv, a.ln1, attn_weight(p), N, C, qkv_);
  tp_.all_reduce(*ops_, dtmp, NC);
  if (rep_) rep_->add_grads(g[s[kAttnW]], g[s[kAttnProjW]]);
  norm_backward(dres, g[s[kLn1W]], pick(g, s, kLn1B), dtmp, in, p[s[kLn1W]], a.ln1_mean, a.ln1_rstd, N);
}

void GptModel::backward_embeddings(const Act* const* emb, Act* const* d_emb) {
  ZERO_CHECK(b_ > 0, "GptModel::backward_embeddings: call set_batch first");
  require_part(part_.embeddings, "backward_embeddings");
  const auto& e = slots_.embeddings;
  Act* dwpe = pick(d_emb, e, kWpe);
  const Act* d = dres_.as<Act>();
  if (cfg_.embedding_norm()) {
    // Through ln_e (replicated: dres is the group's, so every rank gets the whole gradient).
    const int N = b_ * t_;
    ops_->fill_zero(dtmp_.as<void>(), static_cast<std::size_t>(N) * cfg_.n_embd * es_);
    ops_->layernorm_backward(dtmp_.as<Act>(), pick(d_emb, e, kLneW), pick(d_emb, e, kLneB), d, embedding_raw(),
                             pick(emb, e, kLneW), embedding_stats(), embedding_stats() + N, N, cfg_.n_embd);
    d = dtmp_.as<Act>();
  }
  if (!tp_.active()) {
    ops_->encoder_backward(d_emb[kWte], dwpe, d, slot_ids(inputs_), b_, t_, cfg_.n_embd);
    return;
  }
  // The gradient is the group's: every rank adds the whole (replicated) wpe gradient and its own
  // rows'.
  ops_->encoder_backward_part(d_emb[kWte], dwpe, d, slot_ids(inputs_), b_, t_, cfg_.n_embd, v0_, vl_);
}

}  // namespace zero::gpt
