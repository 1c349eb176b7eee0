// The decoder's forward and backward (gpt2, bloom or llama: GptConfig::arch), one engine unit at
// a time. The block is one pre-norm block whatever the architecture; the config's predicates
// choose its norm (LayerNorm or RMSNorm), positions (learned, ALiBi in the attention, or rotary
// on q and k), attention heads (grouped-query for llama), MLP (GELU or SwiGLU) and head (tied or
// not), so there is one schedule to keep right.
//
// The model owns activations, never parameters: each call receives the pointers of one unit's
// tensors (in gpt_units() order), so the training loop can hand it whatever the engine gathered
// for that unit and release it before the next (ZeRO stage 3 gathers layer by layer). The
// forward goes embeddings, h.0 .. h.{L-1}, then ln_f + the LM head, which needs the embeddings
// unit again because the head is tied to wte. The backward goes the other way and adds (+=)
// into the gradient pointers it is given, the engine's contract.
//
// Activation memory is sized once from (micro-batch B, seq_len T, n_embd C): per block the
// LayerNorm outputs, qkv, the attention probabilities [B, NH, T, T], the MLP hidden layer; plus
// the residual stream at each block boundary. With activation checkpointing only the block
// inputs (the residual stream) are kept, and each block's forward is recomputed just before its
// backward into a single block's worth of scratch: about 1/L of the activation memory for one
// extra forward pass (the 8 instead of 6 in the FLOPs-per-token accounting).
//
// Under tensor parallelism (tensor_parallel.hpp) the model computes one rank's part: the unit
// pointers are that rank's parts of the parameters, attention runs on its heads, the MLP on its
// columns, the head on its vocabulary ids; the calls that end a row-parallel product, the
// embedding, or the backward of a column-parallel one all-reduce over the tensor group, so every
// rank of the group must make the same calls in the same order.
//
// Under pipeline parallelism a model holds one pipeline part (ModelPart): a contiguous range of
// blocks, the embeddings on the first part, ln_f and the head on the last, and activations for
// `slots` micro-batches at once (1F1B keeps up to P - p of them in flight on part p; set_slot()
// picks the one the next calls use). Only the stored activations (block internals, the residual
// stream, the token ids) are per slot; the backward's gradient scratch and the head's logits
// are shared (one backward runs at a time, and the last part holds one micro-batch).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "gpt/gpt_config.hpp"
#include "gpt/ops.hpp"
#include "gpt/replicated_attention.hpp"
#include "gpt/tensor_parallel.hpp"

namespace zero::gpt {

// Memory in an Ops' space (RAII, move-only), viewed as elements of one type: std::int32_t,
// float, or Act (the Ops' element type, whose size the Ops knows).
class OpsBuffer {
 public:
  OpsBuffer() = default;
  OpsBuffer(Ops& ops, std::size_t bytes) : ops_(&ops), data_(ops.allocate(bytes)), bytes_(bytes) {}
  OpsBuffer(OpsBuffer&& o) noexcept
      : ops_(o.ops_), data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  OpsBuffer& operator=(OpsBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      ops_ = o.ops_;
      data_ = std::exchange(o.data_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  OpsBuffer(const OpsBuffer&) = delete;
  OpsBuffer& operator=(const OpsBuffer&) = delete;
  ~OpsBuffer() { reset(); }

  template <class T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  std::size_t bytes() const { return bytes_; }
  void reset() {
    if (data_) ops_->deallocate(data_);
    data_ = nullptr;
    bytes_ = 0;
  }

 private:
  Ops* ops_ = nullptr;
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

// The part of the model one pipeline part runs (the whole model by default).
struct ModelPart {
  int first_layer = 0;
  int end_layer = -1;      // one past the last block; -1: n_layer
  bool embeddings = true;  // the first part: the token and position embeddings
  bool head = true;        // the last part: ln_f, the tied LM head and the loss
  int slots = 1;           // micro-batches whose activations are held at once
};

class GptModel {
 public:
  // Activations for micro-batches of up to `max_batch` sequences of up to cfg.seq_len tokens.
  // With tp active, this rank's part of the model (see above); cfg is the whole model's shape.
  // part: the pipeline part's blocks, ends and activation slots (the whole model by default).
  GptModel(const GptConfig& cfg, int max_batch, Ops& ops, const TensorParallel& tp = {}, ModelPart part = {});

  const GptConfig& config() const { return cfg_; }
  const TensorParallel& tensor_parallel() const { return tp_; }
  Ops& ops() const { return *ops_; }
  int max_batch() const { return max_b_; }
  int batch() const { return b_; }
  int seq_len() const { return t_; }
  std::size_t activation_bytes() const { return activation_bytes_; }
  const ModelPart& part() const { return part_; }

  // Pipeline parts: the micro-batch slot the following calls use (set_batch included).
  void set_slot(int slot);
  int slot() const { return slot_; }
  // The current slot's part input (the residual stream entering the first block: where a
  // received activation goes) and output (leaving the last block: what is sent on), and the
  // gradient of the output (received before backward_block of the last block; after the first
  // block's backward it holds the gradient of the input, to send back). Each is
  // boundary_elements() elements of the Ops' dtype.
  Act* part_input() const { return residual(part_.first_layer); }
  Act* part_output() const { return residual(part_.end_layer); }
  Act* output_grad() const { return dres_.as<Act>(); }
  std::size_t boundary_elements() const { return static_cast<std::size_t>(b_) * t_ * cfg_.n_embd; }

  // The micro-batch: B sequences of T tokens (host arrays of B*T ids). targets may be null
  // (sampling): the forward then stops at the logits and there is no loss or backward.
  void set_batch(const std::int32_t* inputs, const std::int32_t* targets, int B, int T);

  // Forward, in unit order. Each pointer array lists the unit's tensors in gpt_units() order.
  // forward_head's and backward_head's emb is the unit holding the tied head (wte), unused (may
  // be null) when the head is not tied: it is then ln_f's lm_head.weight.
  void forward_embeddings(const Act* const* emb);
  void forward_block(int layer, const Act* const* block);
  void forward_head(const Act* const* ln_f, const Act* const* emb);
  // Mean cross-entropy (nats/token) of the last forward, 0 for a batch without targets. Waits
  // for the forward.
  double loss() const;
  // Every forward with targets also adds its mean loss to a running total kept in the Ops'
  // memory, without waiting: the training step reads the mean over its micro-batches once.
  void reset_loss_total();
  double take_mean_loss();  // waits; the mean of the means added since the reset, then resets
  // The first vocab_size logits at (b, t) of the last forward, copied to `out`. Only valid
  // before backward_head, which overwrites the logits with their gradient. Under tensor
  // parallelism the ranks' parts are summed over the group: collective there.
  void logits_at(int b, int t, std::vector<float>& out) const;

  // Backward, in reverse unit order; every gradient is added into the given pointers.
  // dloss is the derivative of the objective with respect to loss(): 1 for plain training,
  // loss_scale / micro-steps under the engine.
  void backward_head(const Act* const* ln_f, Act* const* d_ln_f, const Act* const* emb, Act* const* d_emb, float dloss);
  void backward_block(int layer, const Act* const* block, Act* const* d_block);
  // emb: the embeddings unit's parameters (bloom's ln_e needs its weight).
  void backward_embeddings(const Act* const* emb, Act* const* d_emb);

 private:
  // One block's activations: Act buffers of the Ops' dtype, fp32 statistics. fch is the MLP's
  // input product (GELU's input, or SwiGLU's gate | up), fch_gelu its activation. RMSNorm keeps
  // only the rstd statistics.
  struct BlockActs {
    Act *ln1, *qkv, *atty, *res2, *ln2, *fch, *fch_gelu;
    float *ln1_mean, *ln1_rstd, *att_stats, *ln2_mean, *ln2_rstd;
  };
  void block_forward(const BlockActs& a, const Act* in, Act* out, const Act* const* p);
  // A unit's tensor of `role` (TensorSlots), null where the architecture has none.
  template <class P, std::size_t R>
  static P pick(P const* unit, const std::array<int, R>& slots, int role) {
    const int i = slots[static_cast<std::size_t>(role)];
    return i >= 0 ? unit[i] : nullptr;
  }
  // LayerNorm (with its bias) or RMSNorm (mean unused), forward and backward.
  void norm_forward(Act* out, float* mean, float* rstd, const Act* inp, const Act* w, const Act* b, int N);
  void norm_backward(Act* dinp, Act* dw, Act* db, const Act* dout, const Act* inp, const Act* w, const float* mean,
                     const float* rstd, int N);
  // The slot's embedding before ln_e (bloom) and its statistics.
  Act* embedding_raw() const { return at(emb_raw_, static_cast<std::size_t>(slot_) * nc_max_); }
  float* embedding_stats() const {
    return emb_stats_.as<float>() +
           static_cast<std::size_t>(slot_) * 2 * static_cast<std::size_t>(max_b_) * cfg_.seq_len;
  }
  const BlockActs& acts(int layer) const {
    const std::size_t n = static_cast<std::size_t>(part_.end_layer - part_.first_layer);
    return blocks_[cfg_.activation_checkpointing
                       ? 0
                       : static_cast<std::size_t>(slot_) * n + static_cast<std::size_t>(layer - part_.first_layer)];
  }
  // [B,T,C] slices of the Ops' element type: the slot's residual stream at `layer` (a global
  // index in [first_layer, end_layer]).
  Act* residual(int layer) const {
    const std::size_t per_slot = static_cast<std::size_t>(part_.end_layer - part_.first_layer + 1);
    return at(
        residual_,
        (static_cast<std::size_t>(slot_) * per_slot + static_cast<std::size_t>(layer - part_.first_layer)) * nc_max_);
  }
  std::int32_t* slot_ids(const OpsBuffer& b) const {
    return b.as<std::int32_t>() + static_cast<std::size_t>(slot_) * static_cast<std::size_t>(max_b_) * cfg_.seq_len;
  }
  Act* at(const OpsBuffer& b, std::size_t elements) const { return act_offset(b.as<Act>(), elements, es_); }
  void check_layer(int layer, const char* what) const;
  void require_part(bool held, const char* what) const;
  // losses_ (and, with dlogits non-null, the logits' gradient in place) from logits_: the
  // whole-row softmax cross-entropy, or its vocabulary-parallel passes under tensor parallelism.
  // stats_ready: the row maxima and sums of these logits are already reduced (by the forward).
  void cross_entropy(Act* dlogits, float dloss, bool stats_ready);
  // The attention's qkv and output weights this rank multiplies by: its parameters, or with the
  // key/value heads replicated its heads' columns and rows of the whole ones.
  const Act* attn_weight(const Act* const* p) {
    return rep_ ? rep_->qkv_weight(p[slots_.block[kAttnW]]) : p[slots_.block[kAttnW]];
  }
  const Act* attn_proj_weight(const Act* const* p) {
    return rep_ ? rep_->proj_weight(p[slots_.block[kAttnProjW]]) : p[slots_.block[kAttnProjW]];
  }
  // A row-parallel product's bias enters on tensor rank 0 only: the all-reduce then adds it once.
  const Act* row_bias(const Act* b) const { return tp_.rank == 0 ? b : nullptr; }

  GptConfig cfg_;
  TensorParallel tp_;
  ModelPart part_;
  int slot_ = 0;
  // This rank's widths: attention ca_ = C/T (nh_ heads), qkv_ columns of the attention's input
  // product, MLP hidden fc_ = F/T (its input product fcin_: fc_, or 2 fc_ gated), vocabulary ids
  // [v0_, v0_ + vl_) of the padded vocabulary; att_ the attention's shape at the largest batch.
  int ca_ = 0, nh_ = 0, qkv_ = 0, fc_ = 0, fcin_ = 0, vl_ = 0, v0_ = 0;
  AttentionShape att_;
  std::unique_ptr<ReplicatedAttention> rep_;  // set when the key/value heads are replicated
  // att_ at the current batch's B and T.
  AttentionShape batch_attention() const {
    AttentionShape a = att_;
    a.B = b_;
    a.T = t_;
    return a;
  }
  TensorSlots slots_;
  Ops* ops_;
  std::size_t es_;  // bytes per element of ops_->dtype()
  int max_b_;
  std::size_t nc_max_;  // max_batch * seq_len * n_embd
  int b_ = 0, t_ = 0;
  bool has_targets_ = false;
  bool loss_ready_ = false;  // a forward with targets ran since set_batch
  int loss_terms_ = 0;       // means added to loss_total_
  std::size_t activation_bytes_ = 0;

  OpsBuffer inputs_, targets_;           // per slot
  OpsBuffer block_store_, block_stats_;  // every BlockActs (per slot and block), carved
  std::vector<BlockActs> blocks_;
  OpsBuffer residual_;  // [slots][blocks+1][B,T,C]: the input of each block, then the last output
  OpsBuffer lnf_, lnf_mean_, lnf_rstd_, logits_, losses_, loss_total_;
  OpsBuffer ce_max_, ce_sums_;     // vocabulary-parallel cross-entropy: [N] and [2N] fp32
  OpsBuffer emb_raw_, emb_stats_;  // bloom: per slot [B,T,C] and 2 [B,T] fp32
  // Gradient scratch, one block's worth, reused layer after layer (dact_: SwiGLU's output).
  OpsBuffer dres_, dtmp_, dqkv_, dfch_, dact_, att_scratch_;
  mutable std::vector<float> host_losses_;
};

// Floating-point operations per trained token, a multiply-add counting 2. Attention counts the
// causal half of the T x T scores (T/2 keys per query on average), as llm.c and PaLM count it.
struct TokenFlops {
  // Forward and backward: 6 per parameter plus 6 L T C for attention (llm.c's 6N + 6LTC, the
  // numerator of MFU).
  double model = 0;
  // What activation checkpointing computes a second time: each block's forward up to, not
  // including, the MLP's output projection (backward_block recomputes only what it reads).
  double recompute = 0;
  double total() const { return model + recompute; }
};
TokenFlops training_flops_per_token(const GptConfig& cfg);
// One block's forward per token: through the MLP's output projection, or (recompute) up to it.
double block_forward_flops_per_token(const GptConfig& cfg, bool recompute);

// Every parameter (or gradient) of a model in plain host memory, one flat vector per unit, with
// the per-tensor pointer arrays GptModel takes. For tests and for sampling without an engine.
class HostParams {
 public:
  explicit HostParams(const GptConfig& cfg);  // zero-filled
  void init(std::uint64_t seed);              // GPT-2 initialisation (init_parameter)
  void zero();

  const GptConfig& config() const { return cfg_; }
  int num_units() const { return static_cast<int>(specs_.size()); }
  const std::vector<UnitSpec>& specs() const { return specs_; }
  std::vector<float>& unit_data(int u) { return data_[static_cast<std::size_t>(u)]; }
  const std::vector<float>& unit_data(int u) const { return data_[static_cast<std::size_t>(u)]; }
  float* const* unit(int u) { return ptrs_[static_cast<std::size_t>(u)].data(); }
  const float* const* unit(int u) const { return ptrs_[static_cast<std::size_t>(u)].data(); }
  // The same pointers as the model takes them (HostOps: Act is float).
  Act* const* acts(int u) { return acts_[static_cast<std::size_t>(u)].data(); }
  const Act* const* acts(int u) const { return acts_[static_cast<std::size_t>(u)].data(); }
  // The tensor called `name` ("h.0.ln_1.weight"); throws zero::Error when there is none.
  std::span<float> tensor(std::string_view name);

 private:
  GptConfig cfg_;
  std::vector<UnitSpec> specs_;
  std::vector<std::vector<float>> data_;
  std::vector<std::vector<float*>> ptrs_;
  std::vector<std::vector<Act*>> acts_;
};

// The whole forward with parameters in `p` (after model.set_batch); returns the loss when the
// batch has targets, else 0. The model's Ops must compute in host fp32 memory (HostOps).
double forward_all(GptModel& model, const HostParams& p);
// The whole backward, adding into `grads`; call after forward_all with targets.
void backward_all(GptModel& model, const HostParams& p, HostParams& grads, float dloss = 1.0f);

// Picks the next token from one position's logits: softmax at `temperature` over the top_k
// largest (top_k <= 0: all), inverse-CDF with `coin` uniform in [0, 1). temperature <= 0 is
// greedy (argmax).
int sample_token(std::span<const float> logits, float temperature, int top_k, double coin);

}  // namespace zero::gpt
