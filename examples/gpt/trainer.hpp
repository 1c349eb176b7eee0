// GPT training through the ZeRO engine: one optimizer step, evaluation and sampling (the
// trainer's own settings, the model / data / run sections, are settings.hpp's).
//
// One micro-step walks the units the way stage 3 needs them: gather the embeddings and keep
// them (the tied LM head uses wte again at the end of the forward and its gradient at both ends
// of the backward), gather each block in turn and let it go, then ln_f and the head. The
// backward runs the other way; each unit's gradient is added into engine.grads(u) and handed
// over with engine.reduce(u) as soon as it is complete, so reduction overlaps the rest of the
// backward. The embeddings are reduced last.
//
// With model.pipeline_parallel > 1 a rank holds one pipeline part and a step is the 1F1B
// schedule of pipeline.hpp over that part's units.
//
// The host model computes in fp32. When the config asks for bf16 or fp16 parameters, each
// gathered unit is widened into an fp32 scratch copy and its fp32 gradient is added into the
// engine's 16-bit gradient storage when the unit is done (rounded once per micro-step).
//
// With model.tensor_parallel: T > 1 or pipeline_parallel: P > 1 the trainer builds the process
// groups ProcessGroups(ctx, {T, P}) (zero/groups.hpp): the model holds this rank's part
// (tensor_parallel.hpp: its share of every layer of its pipeline part), the engine shards, reduces and
// steps over the data-parallel group, and the ranks of one tensor group and of one pipeline
// read the same batches (the data loader's rank is the data-parallel coordinate, its world the
// data-parallel size world / (T x P)).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gpt/data.hpp"
#include "gpt/gpt_config.hpp"
#include "gpt/gpt_model.hpp"
#include "gpt/pipeline.hpp"
#include "gpt/settings.hpp"
#include "zero/checkpoint.hpp"
#include "zero/config.hpp"
#include "zero/context.hpp"
#include "zero/engine.hpp"
#include "zero/groups.hpp"

namespace zero::gpt {

// This rank's engine for `settings` (cfg resolved as GptTrainer wants it): over groups->data()
// with this rank's part of the model (its pipeline part's units, each cut tensor_parallel ways)
// when `groups` is given, else the whole model over the world; the parameters from init_from
// or init_seed, the same model at every grid. `groups` must have the settings' sizes. The
// trainer builds its own engine so; the autotuner builds one per candidate grid.
std::unique_ptr<zero::Engine> make_gpt_engine(zero::Context& ctx, const zero::Config& cfg, const GptSettings& settings,
                                              zero::ProcessGroups* groups);

// Forward-only passes (evaluation, sampling) put the engine in eval mode so that stage 3 does
// not record them as part of the training gather order; the guard restores training mode even
// when the pass throws.
class EvalScope {
 public:
  explicit EvalScope(zero::Engine& e) : e_(e) { e_.set_eval(true); }
  ~EvalScope() {
    try {
      e_.set_eval(false);
    } catch (...) {
    }
  }
  EvalScope(const EvalScope&) = delete;
  EvalScope& operator=(const EvalScope&) = delete;

 private:
  zero::Engine& e_;
};

// The uniform draws of sampling: SplitMix64, the same stream for the same seed whatever the
// world size or grid.
class SampleCoin {
 public:
  explicit SampleCoin(std::uint64_t seed) : state_(seed) {}
  double operator()() {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return static_cast<double>((z ^ (z >> 31)) >> 11) * 0x1p-53;
  }

 private:
  std::uint64_t state_;
};

class GptTrainer {
 public:
  // cfg must be resolved for gpt_data_parallel_size(settings, ctx.world_size()).
  GptTrainer(zero::Context& ctx, const zero::Config& cfg, const GptSettings& settings);
  // Trains on an engine someone else owns and has initialised (the autotuner builds one per
  // candidate): the batch settings come from engine.config(), the parameters are left as they
  // are, and the engine must outlive the trainer.
  GptTrainer(zero::Context& ctx, zero::Engine& engine, const GptSettings& settings);
  // The same with model parallelism: the engine runs over groups.data() (make_gpt_engine), the
  // groups have the settings' tensor and pipeline sizes and outlive the trainer.
  GptTrainer(zero::Context& ctx, zero::Engine& engine, zero::ProcessGroups& groups, const GptSettings& settings);
  ~GptTrainer();
  GptTrainer(const GptTrainer&) = delete;
  GptTrainer& operator=(const GptTrainer&) = delete;

  struct Step {
    zero::StepResult result;
    double loss = 0.0;  // mean training loss of the step's global batch (all ranks agree)
  };
  // One optimizer step: gradient_accumulation_steps micro-steps, then engine.step().
  Step train_step();

  bool has_validation() const { return val_loader_ != nullptr; }
  struct Evaluation {
    double loss = 0.0;           // mean over every token evaluated
    std::int64_t sequences = 0;  // the validation split's first `sequences` windows
    std::int64_t tokens = 0;
  };
  // The validation loss over the whole split, or over its first run.eval_sequences windows:
  // the same tokens whatever the micro-batch size and the number of ranks, which share them
  // out. Collective.
  Evaluation evaluate();
  // Continues `prompt` by `n` tokens on rank 0; other ranks get an empty list. Collective only
  // at its start (Engine::gather_all), so the other ranks do not wait in every forward pass;
  // under pipeline parallelism data-parallel rank 0's pipeline takes part in every token.
  // The tokens depend only on the weights, the prompt and the seed.
  std::vector<int> sample(std::vector<int> prompt, int n, float temperature, int top_k, std::uint64_t seed);
  // Collective: writes a checkpoint (engine state and the data position) under `root`.
  void save_checkpoint(const std::string& root);
  // Collective: restores a checkpoint (tag "latest" or a step number) saved by any number of
  // ranks at any stage; the data stream continues where it stopped. Returns the optimizer
  // steps taken so far. read_only: the root is not locked (a sample beside a running job).
  // dry_run: every check and the library's account of the load; the engine and data stay as they were.
  std::int64_t load_checkpoint(const std::string& root, const std::string& tag = "latest", bool read_only = false,
                               bool dry_run = false);

  // The token a sample starts from when there is no prompt (newline for bytes, GPT-2's
  // <|endoftext|> for its vocabulary, else 0).
  int start_token() const;

  zero::Engine& engine() { return *engine_; }
  const GptConfig& model_config() const { return settings_.model; }
  const GptSettings& settings() const { return settings_; }
  std::int64_t tokens_per_step() const;  // global: train_batch_size * seq_len
  const TokenSet& train_data() const { return *train_set_; }
  const TokenSet* val_data() const { return val_set_.get(); }
  std::size_t activation_bytes() const { return model_->activation_bytes(); }
  // The grid (zero/groups.hpp): tensor x data x pipeline ranks, and this rank's data-parallel
  // place (the engine's and the data loader's rank and world). Without model parallelism there
  // are no groups: the engine runs over the world.
  int tensor_parallel_size() const { return settings_.tensor_parallel; }
  int tensor_parallel_rank() const { return groups_ ? groups_->coord().tensor : 0; }
  int data_parallel_size() const { return groups_ ? groups_->data_size() : ctx_.world_size(); }
  int data_parallel_rank() const { return groups_ ? groups_->coord().data : ctx_.rank(); }
  int pipeline_parts() const { return settings_.pipeline_parallel; }
  std::string grid() const;  // "TP 2 x DP 1 x PP 2"
  // Bytes this rank sent: the engine's collectives, the model's tensor-parallel all-reduces and
  // the pipeline's point-to-point sends.
  zero::TrafficBytes traffic() const;
  zero::TrafficBytes tensor_traffic() const;  // the all-reduces over the tensor group alone
  // This rank's pipeline part, its schedule's figures and the activation peak seen so far.
  PipelineReport pipeline_report() const;

 private:
  // Refuses a checkpoint whose recorded n_head / vocab_size differ from this run's (same shapes,
  // another model) unless run.allow_model_change is set, naming both values.
  void check_model_keys(const zero::ClientState& client, const std::string& root) const;
  // Pointer arrays for the model, one "slot" per unit in use at once (the embeddings, and the
  // unit currently gathered). When the engine's compute dtype is the Ops' (fp32 on the host,
  // bf16 on CUDA) they point into the engine's storage; otherwise (16-bit compute with HostOps)
  // units are widened into fp32 scratch and gradients added back.
  struct UnitSlot {
    std::vector<Act*> ptrs;
    std::vector<float> scratch;
  };
  const Act* const* param_ptrs(const zero::UnitParams& p, UnitSlot& slot);
  Act* const* grad_ptrs(int unit, const zero::UnitGrads& g, UnitSlot& slot);
  void commit_grads(int unit, const zero::UnitGrads& g, const UnitSlot& slot);
  bool widen() const { return dtype_ != ops_->dtype(); }
  // One micro-batch (already set on the model): forward, and backward when training. Returns
  // the loss of an evaluation pass (a wait for the device); a training pass returns 0 and
  // leaves its loss in the model's running total.
  double run_micro_batch(bool train);
  // The validation windows shared out over `world` ranks (this one `rank`): forward() runs the
  // batch set on the model and returns its loss, which enters the mean where `counts`.
  Evaluation evaluate_windows(std::int64_t world, std::int64_t rank, bool counts,
                              const std::function<double()>& forward);

  GptTrainer(zero::Context& ctx, const zero::Config& cfg, const GptSettings& settings, zero::Engine* borrowed,
             zero::ProcessGroups* borrowed_groups);

  // Pipeline parallelism (pipeline.cpp).
  ModelPart pipeline_part() const;
  void setup_pipeline_buffers();
  std::size_t tied_elements() const;  // this rank's rows of wte, padded vocabulary included
  zero::Communicator& pipe_comm();    // the pipeline group's, for the Ops' memory
  void part_forward();                // this part's forward of the current slot
  void part_backward(bool last_micro);
  // The transfers between two ops of the part's schedule (pipe_transfers), receives waited.
  void pipe_exchange(const PipeOp* done, const PipeOp* next);
  void exchange_tied();  // after the step's last transfers: the tied wte gradients, committed
  void pipeline_forward_only();
  Step pipeline_train_step();
  Evaluation pipeline_evaluate();

  zero::Context& ctx_;
  GptSettings settings_;
  // With tensor or pipeline parallelism; before the engine, which uses it, so it outlives it.
  std::unique_ptr<zero::ProcessGroups> owned_groups_;
  zero::ProcessGroups* groups_ = nullptr;  // owned_groups_, or the borrowed ones
  std::unique_ptr<zero::Engine> owned_engine_;
  zero::Engine* engine_ = nullptr;  // owned_engine_, or the borrowed one
  // backend: cuda with T > 1: the tensor group's device communicator (after the engine, whose
  // backend made it; before the model, which uses it).
  std::unique_ptr<zero::Communicator> tensor_device_;
  std::unique_ptr<Ops> ops_;
  std::unique_ptr<GptModel> model_;
  std::unique_ptr<PipelineState> pipe_;  // P > 1; after ops_, whose memory its buffers hold
  std::unique_ptr<TokenSet> train_set_, val_set_;
  std::unique_ptr<DataLoader> train_loader_, val_loader_;
  int micro_batch_ = 1, gas_ = 1;
  zero::DType dtype_ = zero::DType::f32;
  std::vector<std::int32_t> inputs_, targets_;
  UnitSlot emb_params_, emb_grads_, unit_params_, unit_grads_;
};

}  // namespace zero::gpt
