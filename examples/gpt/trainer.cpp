#include "gpt/trainer.hpp"

#if ZERO_GPT_CUDA
#include "gpt/cuda_library.hpp"
#endif

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>

#include "zero/checkpoint.hpp"
#include "zero/comm.hpp"
#include "zero/error.hpp"
#include "zero/formats/hf.hpp"
#include "zero/util/strings.hpp"
#include "gpt/reporter.hpp"
#include "gpt/tensor_parallel.hpp"

namespace zero::gpt {

namespace {

// The engine outlives the trainer's Ops (owned_engine_ is declared before ops_; a borrowed
// engine lives on, and the autotuner builds the next trainer on it) but holds the Ops' stream as
// its compute stream, which ~CudaOps destroys. Before that, the engine gets the default stream
// back (ordered after the Ops' work), so its teardown and any later use never touch a destroyed
// stream.
void return_engine_stream(zero::Engine* engine, const Ops* ops) noexcept {
  if (!engine || !ops || !ops->stream()) return;
  try {
    engine->set_stream(nullptr);
  } catch (...) {
  }
}

// This rank's part of the model: the whole of it, its tensor part, or its pipeline part's tensor part.
zero::Layout rank_layout(const GptSettings& settings, const zero::ProcessGroups* groups) {
  const GptConfig& mc = settings.model;
  const int T = settings.tensor_parallel, P = settings.pipeline_parallel;
  if (!groups) return build_layout(mc);
  if (P > 1) return part_layout(mc, part_split(mc.n_layer, P, groups->coord().pipeline), T);
  return tensor_parallel_layout(mc, T);
}

void check_groups_match(const GptSettings& settings, const zero::ProcessGroups* groups) {
  const int T = settings.tensor_parallel, P = settings.pipeline_parallel;
  ZERO_CHECK(groups ? groups->tensor_size() == T && groups->pipeline_size() == P : T == 1 && P == 1,
             fmt::format("zero-gpt: model.tensor_parallel = {} x pipeline_parallel = {}{}; build the groups with "
                         "ProcessGroups(ctx, {{tensor_parallel, pipeline_parallel}})",
                         T, P,
                         groups ? fmt::format(" on process groups of tensor {} x pipeline {}", groups->tensor_size(),
                                              groups->pipeline_size())
                                : " without process groups"));
}

}  // namespace

std::unique_ptr<zero::Engine> make_gpt_engine(zero::Context& ctx, const zero::Config& cfg, const GptSettings& settings,
                                              zero::ProcessGroups* groups) {
  const GptConfig& mc = settings.model;
  const int T = settings.tensor_parallel;
  check_groups_match(settings, groups);
  check_tensor_parallel(mc, T);
  check_pipeline_config(cfg, settings.pipeline_parallel);
  // Pretrained weights are checked against the model before any memory is committed.
  std::optional<zero::hf::PretrainedWeights> weights;
  if (!settings.init_from.empty()) {
    weights.emplace(settings.init_from);
    weights->check(mc.plan_shape());
  }
  const zero::Layout layout = rank_layout(settings, groups);
  auto engine = groups ? std::make_unique<zero::Engine>(ctx, cfg, layout, *groups)
                       : std::make_unique<zero::Engine>(ctx, cfg, layout);
  // Under tensor parallelism each rank computes the whole tensor and keeps its part, so the
  // model is the same at every T; pretrained weights are read part by part (only the file
  // stretches that hold this rank's part).
  const int t = groups ? groups->coord().tensor : 0;
  std::vector<float> whole;
  engine->init_params([&](const zero::ParamInfo& p, std::span<float> v) {
    const std::vector<std::int64_t> shape = whole_shape(p, T);
    if (weights) {
      weights->read_part(p.name, shape, {.axis = p.split_axis, .blocks = p.split_blocks, .parts = T, .part = t}, v);
      return;
    }
    whole.resize(static_cast<std::size_t>(p.numel) * (p.split_axis >= 0 ? T : 1));
    init_parameter(mc, p.name, whole, settings.init_seed);
    take_part(whole, p, T, t, v);
  });
  if (weights && ctx.is_root())
    fmt::print("init_from: read {:.2f} MiB of tensors from {} on rank 0 (tensor rank {} of {})\n",
               static_cast<double>(weights->bytes_read()) / (1 << 20), settings.init_from, t, T);
  return engine;
}

GptTrainer::GptTrainer(zero::Context& ctx, const zero::Config& cfg, const GptSettings& settings)
    : GptTrainer(ctx, cfg, settings, nullptr, nullptr) {}

GptTrainer::GptTrainer(zero::Context& ctx, zero::Engine& engine, const GptSettings& settings)
    : GptTrainer(ctx, engine.config(), settings, &engine, nullptr) {}

GptTrainer::GptTrainer(zero::Context& ctx, zero::Engine& engine, zero::ProcessGroups& groups,
                       const GptSettings& settings)
    : GptTrainer(ctx, engine.config(), settings, &engine, &groups) {}

GptTrainer::GptTrainer(zero::Context& ctx, const zero::Config& cfg, const GptSettings& settings, zero::Engine* borrowed,
                       zero::ProcessGroups* borrowed_groups)
    : ctx_(ctx), settings_(settings) {
  const GptConfig& mc = settings_.model;
  mc.validate();
  ZERO_CHECK(cfg.train_micro_batch_size_per_gpu >= 1 && cfg.train_micro_batch_size_per_gpu <= INT32_MAX &&
                 cfg.gradient_accumulation_steps >= 1 && cfg.gradient_accumulation_steps <= INT32_MAX,
             "GptTrainer: the micro batch and accumulation steps must fit an int; use a resolved Config");
  // The grid: T tensor ranks x P pipeline parts, data parallel over the rest.
  const int T = settings_.tensor_parallel, P = settings_.pipeline_parallel;
  check_tensor_parallel(mc, T);
  const int data_size = gpt_data_parallel_size(settings_, ctx.world_size());
  ZERO_CHECK(cfg.train_batch_size == cfg.train_micro_batch_size_per_gpu * cfg.gradient_accumulation_steps * data_size,
             fmt::format("GptTrainer: the config is resolved for {} data-parallel ranks, but {} ranks at "
                         "tensor_parallel {} x pipeline_parallel {} give {}; resolve it with "
                         "gpt_data_parallel_size(settings, world size)",
                         cfg.train_batch_size / std::max<std::int64_t>(1, cfg.train_micro_batch_size_per_gpu *
                                                                              cfg.gradient_accumulation_steps),
                         ctx.world_size(), T, P, data_size));
  micro_batch_ = static_cast<int>(cfg.train_micro_batch_size_per_gpu);
  gas_ = static_cast<int>(cfg.gradient_accumulation_steps);
  dtype_ = cfg.compute_dtype();
  if (borrowed) {
    groups_ = borrowed_groups;
    check_groups_match(settings_, groups_);
  } else if (T > 1 || P > 1) {
    owned_groups_ = std::make_unique<zero::ProcessGroups>(ctx, zero::GridSpec{.tensor = T, .pipeline = P});
    groups_ = owned_groups_.get();
  }
  if (P > 1) {
    check_pipeline_config(cfg, P);
    pipe_ = std::make_unique<PipelineState>();
    pipe_->split = part_split(mc.n_layer, P, groups_->coord().pipeline);
  }

  // Data first: a bad path should fail before any memory is committed.
  const std::string& train = settings_.train;
  if (train == "shakespeare" || train.ends_with(".txt")) {
    const std::string path = train == "shakespeare" ? find_shakespeare() : train;
    train_set_ = std::make_unique<TokenSet>(TokenSet::from_text_file(path, false));
    if (settings_.val.empty()) val_set_ = std::make_unique<TokenSet>(TokenSet::from_text_file(path, true));
  } else {
    train_set_ = std::make_unique<TokenSet>(TokenSet::from_shards(train));
  }
  if (!settings_.val.empty() && settings_.val != "none")
    val_set_ = std::make_unique<TokenSet>(TokenSet::from_shards(settings_.val));

  DataLoader::Options lo;
  lo.batch = micro_batch_;
  lo.seq_len = mc.seq_len;
  // Ranks of one tensor group or one pipeline read the same batches: the loader counts
  // data-parallel ranks only.
  lo.rank = data_parallel_rank();
  lo.world = data_parallel_size();
  lo.seed = settings_.data_seed;
  lo.vocab_size = mc.vocab_size;
  train_loader_ = std::make_unique<DataLoader>(*train_set_, lo);
  if (val_set_) {
    lo.shuffle = false;  // the same validation batches every time
    val_loader_ = std::make_unique<DataLoader>(*val_set_, lo);
  }

  if (borrowed) {
    const zero::Layout expected = rank_layout(settings_, groups_);
    ZERO_CHECK(borrowed->layout().num_units() == expected.num_units() &&
                   borrowed->layout().num_params() == expected.num_params(),
               fmt::format("GptTrainer: the engine it was given holds another model ({} parameters, this rank's part "
                           "of this GPT has {}); build the engine with make_gpt_engine",
                           borrowed->layout().num_params(), expected.num_params()));
    engine_ = borrowed;
  } else {
    owned_engine_ = make_gpt_engine(ctx, cfg, settings_, groups_);
    engine_ = owned_engine_.get();
  }
#if ZERO_GPT_CUDA
  if (engine_->config().backend == zero::BackendKind::cuda) {
    // The model's kernels run on a stream of the Ops' own; the engine orders its collectives
    // after them (and the next kernels after its gathers) through it.
    ops_ = gpt_cuda_library().make_ops(nullptr);
    engine_->set_stream(ops_->stream());
  }
#endif
  if (!ops_) ops_ = make_host_ops();
  try {
    TensorParallel tp;
    if (groups_ && T > 1) {
      tp = {T, groups_->coord().tensor, &groups_->tensor()};
      // On CUDA the activations' all-reduces stay on the device: a communicator of the tensor
      // group for the Ops' memory (collective over the group, as every rank builds its trainer).
      if (!ops_->host_memory()) {
        if (!tensor_device_) tensor_device_ = engine_->device_comm(groups_->tensor());
        tp.device = tensor_device_.get();
      }
    }
    model_ = std::make_unique<GptModel>(mc, micro_batch_, *ops_, tp, pipeline_part());
    if (pipe_) setup_pipeline_buffers();
  } catch (...) {
    // No destructor runs for a constructor that throws (out of memory is expected while the
    // autotuner tries micro-batch sizes), and ops_ is about to go.
    model_.reset();
    return_engine_stream(engine_, ops_.get());
    throw;
  }
  const std::size_t n = static_cast<std::size_t>(micro_batch_) * mc.seq_len;
  inputs_.resize(n);
  targets_.resize(n);
}

GptTrainer::~GptTrainer() { return_engine_stream(engine_, ops_.get()); }

std::string GptTrainer::grid() const {
  return format_grid(tensor_parallel_size(), data_parallel_size(), pipeline_parts());
}

zero::TrafficBytes GptTrainer::tensor_traffic() const {
  return groups_ ? groups_->tensor().traffic() : zero::TrafficBytes{};
}

zero::TrafficBytes GptTrainer::traffic() const {
  zero::TrafficBytes t = engine_->traffic();
  t += tensor_traffic();
  if (pipe_) t += groups_->pipeline().traffic();  // activations, their gradients, the tied wte
  return t;
}

std::int64_t GptTrainer::tokens_per_step() const {
  return engine_->config().train_batch_size * settings_.model.seq_len;
}

namespace {
// The data position is kept as a global count of samples read, which means the same thing at
// any world size and micro-batch.
constexpr const char* kSamplesKey = "gpt.samples_read";

// The model keys that change what the parameters compute without changing a shape (the head
// split of the attention, the vocabulary the loss is taken over, whose padding keeps the shape):
// the engine's load checks shapes only, so the trainer records these with every save and a
// resume compares them.
struct ModelKey {
  const char* name;
  int GptConfig::*field;
};
constexpr ModelKey kComputeKeys[] = {{"n_head", &GptConfig::n_head}, {"vocab_size", &GptConfig::vocab_size}};

std::string client_key(const ModelKey& k) { return fmt::format("gpt.model.{}", k.name); }
}  // namespace

void GptTrainer::save_checkpoint(const std::string& root) {
  const std::int64_t samples = train_loader_->micro_step() * train_loader_->samples_per_micro_step();
  zero::CheckpointOptions o;
  o.keep_last = settings_.keep_checkpoints;
  zero::ClientState client{{kSamplesKey, fmt::format("{}", samples)}};
  for (const ModelKey& k : kComputeKeys) client[client_key(k)] = fmt::format("{}", settings_.model.*k.field);
  zero::save_checkpoint(*engine_, root, client, o);
}

std::int64_t GptTrainer::load_checkpoint(const std::string& root, const std::string& tag, bool read_only,
                                         bool dry_run) {
  zero::CheckpointLoadOptions o;
  o.lock_root = !read_only;
  o.dry_run = dry_run;
  const zero::ClientState client = zero::load_checkpoint(*engine_, root, tag, o);
  const auto it = client.find(kSamplesKey);
  ZERO_CHECK(it != client.end(),
             fmt::format("load_checkpoint: '{}' has no {} entry: it was not written by zero-gpt", root, kSamplesKey));
  // The checkpoint's checksums cover the bytes, not their meaning: a hand-edited or foreign
  // value must not send the data stream backwards or past the end of int64.
  const std::string& text = it->second;
  std::int64_t samples = -1;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), samples);
  const std::int64_t per = train_loader_->samples_per_micro_step();
  const std::int64_t most = std::numeric_limits<std::int64_t>::max() / 2;
  ZERO_CHECK(ec == std::errc() && end == text.data() + text.size() && samples >= 0 && samples <= most,
             fmt::format("load_checkpoint: client state {} = '{}' in '{}' is not a count of samples in [0, {}]; the "
                         "checkpoint was damaged or edited: resume from another step (--checkpoint <root>/step_N)",
                         kSamplesKey, zero::escape_bytes(text), root, most));
  ZERO_CHECK(samples % per == 0,
             fmt::format("load_checkpoint: the checkpoint stopped after {} samples, which is not a whole number of "
                         "this run's micro-steps ({} samples: micro-batch x data-parallel ranks); resume with a "
                         "micro-batch and rank count whose product divides it",
                         samples, per));
  check_model_keys(client, root);
  if (dry_run) return engine_->global_step();
  train_loader_->seek(samples / per);
  return engine_->global_step();
}

void GptTrainer::check_model_keys(const zero::ClientState& client, const std::string& root) const {
  for (const ModelKey& k : kComputeKeys) {
    const auto it = client.find(client_key(k));
    if (it == client.end()) continue;  // saved before zero-gpt recorded it
    const int now = settings_.model.*k.field;
    if (it->second == fmt::format("{}", now)) continue;
    if (settings_.allow_model_change) {
      if (ctx_.is_root())
        std::fputs(fmt::format("zero-gpt: warning: the checkpoint in {} was trained with model.{} = {}; this run "
                               "continues with model.{} = {} (run.allow_model_change: true)\n",
                               root, k.name, zero::escape_bytes(it->second), k.name, now)
                       .c_str(),
                   stderr);
      continue;
    }
    ZERO_THROW(fmt::format(
        "load_checkpoint: the checkpoint in {} was trained with model.{} = {}, this run's "
        "config has model.{} = {}: the parameters have the same shapes but would compute "
        "another model; set model.{}: {} to continue the same model, or run.allow_model_change: "
        "true to train on with {}",
        root, k.name, zero::escape_bytes(it->second), k.name, now, k.name, zero::escape_bytes(it->second), now));
  }
}

int GptTrainer::start_token() const {
  const int V = settings_.model.vocab_size;
  if (V == 256) return '\n';
  if (V == 50257) return 50256;  // <|endoftext|>
  return 0;
}

const Act* const* GptTrainer::param_ptrs(const zero::UnitParams& p, UnitSlot& slot) {
  const zero::UnitInfo& ui = engine_->layout().unit(p.unit());
  Act* base = static_cast<Act*>(p.data());
  if (widen()) {
    slot.scratch.resize(static_cast<std::size_t>(ui.numel));
    zero::convert(p.data(), dtype_, slot.scratch.data(), zero::DType::f32, slot.scratch.size());
    base = reinterpret_cast<Act*>(slot.scratch.data());
  }
  const std::size_t es = widen() ? sizeof(float) : ops_->elem_bytes();
  slot.ptrs.resize(ui.params.size());
  for (std::size_t i = 0; i < ui.params.size(); ++i)
    slot.ptrs[i] = act_offset(base, static_cast<std::size_t>(ui.params[i].offset), es);
  return slot.ptrs.data();
}

Act* const* GptTrainer::grad_ptrs(int unit, const zero::UnitGrads& g, UnitSlot& slot) {
  const zero::UnitInfo& ui = engine_->layout().unit(unit);
  Act* base = static_cast<Act*>(g.data());
  if (widen()) {
    slot.scratch.assign(static_cast<std::size_t>(ui.numel), 0.0f);
    base = reinterpret_cast<Act*>(slot.scratch.data());
  }
  const std::size_t es = widen() ? sizeof(float) : ops_->elem_bytes();
  slot.ptrs.resize(ui.params.size());
  for (std::size_t i = 0; i < ui.params.size(); ++i)
    slot.ptrs[i] = act_offset(base, static_cast<std::size_t>(ui.params[i].offset), es);
  return slot.ptrs.data();
}

void GptTrainer::commit_grads(int unit, const zero::UnitGrads& g, const UnitSlot& slot) {
  if (!widen()) return;  // the backward wrote into the engine's storage
  const std::size_t n = static_cast<std::size_t>(engine_->layout().unit(unit).numel);
  for (std::size_t i = 0; i < n; ++i)
    zero::store_from_f32(g.data(), i, dtype_, zero::load_as_f32(g.data(), i, dtype_) + slot.scratch[i]);
}

double GptTrainer::run_micro_batch(bool train) {
  const GptConfig& c = settings_.model;
  const int emb = embeddings_unit(), lnf = ln_f_unit(c);
  // The embeddings stay gathered for the whole micro-step: the tied head needs wte at the end
  // of the forward, and its gradient is added to at both ends of the backward.
  zero::UnitParams E = engine_->gather(emb);
  const Act* const* pe = param_ptrs(E, emb_params_);
  model_->forward_embeddings(pe);
  for (int l = 0; l < c.n_layer; ++l) {
    zero::UnitParams P = engine_->gather(block_unit(l));
    model_->forward_block(l, param_ptrs(P, unit_params_));
  }
  {
    zero::UnitParams P = engine_->gather(lnf);
    model_->forward_head(param_ptrs(P, unit_params_), pe);
  }
  if (!train) return model_->loss();

  // The engine divides by loss_scale x gradient_accumulation_steps and averages over ranks.
  const float dloss = engine_->loss_scale();
  zero::UnitGrads GE = engine_->grads(emb);
  Act* const* ge = grad_ptrs(emb, GE, emb_grads_);
  {
    zero::UnitParams P = engine_->gather(lnf);
    zero::UnitGrads G = engine_->grads(lnf);
    model_->backward_head(param_ptrs(P, unit_params_), grad_ptrs(lnf, G, unit_grads_), pe, ge, dloss);
    commit_grads(lnf, G, unit_grads_);
    engine_->reduce(lnf);
  }
  for (int l = c.n_layer - 1; l >= 0; --l) {
    const int u = block_unit(l);
    zero::UnitParams P = engine_->gather(u);
    zero::UnitGrads G = engine_->grads(u);
    model_->backward_block(l, param_ptrs(P, unit_params_), grad_ptrs(u, G, unit_grads_));
    commit_grads(u, G, unit_grads_);
    engine_->reduce(u);
  }
  model_->backward_embeddings(pe, ge);
  commit_grads(emb, GE, emb_grads_);
  engine_->reduce(emb);
  return 0.0;  // the training loss is read once per step (GptModel::take_mean_loss)
}

GptTrainer::Step GptTrainer::train_step() {
  if (pipe_) return pipeline_train_step();
  const int T = settings_.model.seq_len;
  model_->reset_loss_total();
  for (int k = 0; k < gas_; ++k) {
    train_loader_->next(inputs_.data(), targets_.data());
    model_->set_batch(inputs_.data(), targets_.data(), micro_batch_, T);
    run_micro_batch(true);
  }
  Step s;
  s.result = engine_->step();
  // The sum of the micro-batches' means over gas, as the engine averages the gradients.
  s.loss = ctx_.comm().all_reduce_scalar(model_->take_mean_loss(), zero::ReduceOp::avg);
  return s;
}

}  // namespace zero::gpt
