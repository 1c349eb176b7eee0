// GPT-2 forward and backward, one engine unit at a time.
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
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "gpt_config.hpp"
#include "ops.hpp"

namespace zero::gpt {

// An array of T in an Ops' memory (RAII, move-only).
template <class T>
class OpsBuffer {
 public:
  OpsBuffer() = default;
  OpsBuffer(Ops& ops, std::size_t n)
      : ops_(&ops), data_(static_cast<T*>(ops.allocate(n * sizeof(T)))), size_(n) {}
  OpsBuffer(OpsBuffer&& o) noexcept
      : ops_(o.ops_), data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  OpsBuffer& operator=(OpsBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      ops_ = o.ops_;
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  OpsBuffer(const OpsBuffer&) = delete;
  OpsBuffer& operator=(const OpsBuffer&) = delete;
  ~OpsBuffer() { reset(); }

  T* get() const { return data_; }
  std::size_t size() const { return size_; }
  void reset() {
    if (data_) ops_->deallocate(data_);
    data_ = nullptr;
    size_ = 0;
  }

 private:
  Ops* ops_ = nullptr;
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

class GptModel {
 public:
  // Activations for micro-batches of up to `max_batch` sequences of up to cfg.seq_len tokens.
  GptModel(const GptConfig& cfg, int max_batch, Ops& ops);

  const GptConfig& config() const { return cfg_; }
  Ops& ops() const { return *ops_; }
  int max_batch() const { return max_b_; }
  int batch() const { return b_; }
  int seq_len() const { return t_; }
  std::size_t activation_bytes() const { return activation_bytes_; }

  // The micro-batch: B sequences of T tokens (host arrays of B*T ids). targets may be null
  // (sampling): the forward then stops at the logits and there is no loss or backward.
  void set_batch(const std::int32_t* inputs, const std::int32_t* targets, int B, int T);

  // Forward, in unit order. Each pointer array lists the unit's tensors in gpt_units() order.
  void forward_embeddings(const float* const* emb);
  void forward_block(int layer, const float* const* block);
  void forward_head(const float* const* ln_f, const float* const* emb);
  // Mean cross-entropy (nats/token) of the last forward; needs targets.
  double loss() const { return loss_; }
  // The first vocab_size logits at (b, t) of the last forward, copied to `out`. Only valid
  // before backward_head, which overwrites the logits with their gradient.
  void logits_at(int b, int t, std::vector<float>& out) const;

  // Backward, in reverse unit order; every gradient is added into the given pointers.
  // dloss is the derivative of the objective with respect to loss(): 1 for plain training,
  // loss_scale / micro-steps under the engine.
  void backward_head(const float* const* ln_f, float* const* d_ln_f, const float* const* emb,
                     float* const* d_emb, float dloss);
  void backward_block(int layer, const float* const* block, float* const* d_block);
  void backward_embeddings(float* const* d_emb);

 private:
  struct BlockActs {
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *att, *res2, *ln2, *ln2_mean, *ln2_rstd, *fch,
        *fch_gelu;
  };
  void block_forward(const BlockActs& a, const float* in, float* out, const float* const* p);
  const BlockActs& acts(int layer) const {
    return blocks_[cfg_.activation_checkpointing ? 0 : static_cast<std::size_t>(layer)];
  }
  float* residual(int layer) const {
    return residual_.get() + static_cast<std::size_t>(layer) * max_b_ * cfg_.seq_len * cfg_.n_embd;
  }
  void check_layer(int layer, const char* what) const;

  GptConfig cfg_;
  Ops* ops_;
  int max_b_;
  int b_ = 0, t_ = 0;
  bool has_targets_ = false;
  double loss_ = 0.0;
  std::size_t activation_bytes_ = 0;

  OpsBuffer<std::int32_t> inputs_, targets_;
  OpsBuffer<float> block_store_;  // every BlockActs, carved
  std::vector<BlockActs> blocks_;
  OpsBuffer<float> residual_;     // [L+1][B,T,C]: the input of each block, then the last output
  OpsBuffer<float> lnf_, lnf_mean_, lnf_rstd_, logits_, losses_;
  // Gradient scratch, one block's worth, reused layer after layer.
  OpsBuffer<float> dres_, dtmp_, dqkv_, dfch_gelu_, dfch_, datt_;
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
  // The tensor called `name` ("h.0.ln_1.weight"); throws zero::Error when there is none.
  std::span<float> tensor(std::string_view name);

 private:
  GptConfig cfg_;
  std::vector<UnitSpec> specs_;
  std::vector<std::vector<float>> data_;
  std::vector<std::vector<float*>> ptrs_;
};

// The whole forward with parameters in `p` (after model.set_batch); returns the loss when the
// batch has targets, else 0.
double forward_all(GptModel& model, const HostParams& p);
// The whole backward, adding into `grads`; call after forward_all with targets.
void backward_all(GptModel& model, const HostParams& p, HostParams& grads, float dloss = 1.0f);

// Picks the next token from one position's logits: softmax at `temperature` over the top_k
// largest (top_k <= 0: all), inverse-CDF with `coin` uniform in [0, 1). temperature <= 0 is
// greedy (argmax).
int sample_token(std::span<const float> logits, float temperature, int top_k, double coin);

}  // namespace zero::gpt
