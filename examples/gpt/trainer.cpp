#include "gpt/trainer.hpp"

#if ZERO_GPT_CUDA
#include "gpt/cuda_library.hpp"
#endif

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <optional>
#include <sstream>

#include "zero/checkpoint.hpp"
#include "zero/comm.hpp"
#include "zero/config_schema.hpp"
#include "zero/error.hpp"
#include "zero/formats/hf_gpt2.hpp"
#include "zero/util/strings.hpp"
#include "gpt/reporter.hpp"
#include "gpt/tensor_parallel.hpp"

namespace zero::gpt {

namespace {

// A double-quoted YAML scalar: safe for globs ("*" would start an alias) and paths. Control
// bytes are escaped (a raw newline in a quoted scalar reads back as a space), so the saved
// config says exactly what ran.
std::string quoted(const std::string& s) {
  std::string q = "\"";
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      q += '\\';
      q += ch;
    } else if (c == '\n') {
      q += "\\n";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      q += buf;
    } else {
      q += ch;
    }
  }
  return q + "\"";
}

// The shortest text that reads back as the same double.
std::string number(double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

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

}  // namespace

// ------------------------------------------------------------------------------ settings

GptSettings read_gpt_settings(const zero::Config& cfg) {
  // With backend: cuda the model runs on CudaOps (cuda/cuda_ops.hpp, loaded from libzero_gpt_cuda
  // by cuda_library.hpp), which compute in bf16 on
  // the engine's device storage: the engine's compute dtype must be the same.
  if (cfg.backend == zero::BackendKind::cuda) {
#if !ZERO_GPT_CUDA
    ZERO_THROW("zero-gpt: backend: cuda, but this build has no CUDA support (configure with "
               "-DZERO_CUDA=ON on a machine with the CUDA toolkit), or set backend: host");
#endif
    ZERO_CHECK(cfg.compute_dtype() == zero::DType::bf16,
               std::string("zero-gpt: backend: cuda trains in bf16 (the GPT CUDA kernels take bf16 parameters, "
                           "gradients and activations), but the config computes in ") +
                   std::string(zero::dtype_name(cfg.compute_dtype())) +
                   "; set bf16.enabled: true" + (cfg.fp16.enabled ? " and fp16.enabled: false" : ""));
  }
  GptSettings s;
  {
    zero::StrictSection m = zero::extra_section(cfg, "model");
    s.preset = m.get_choice("preset", s.preset, gpt_preset_names());
    GptConfig c = gpt_preset(s.preset);
    c.n_layer = static_cast<int>(m.get_int("n_layer", c.n_layer, 1, 4096));
    c.n_head = static_cast<int>(m.get_int("n_head", c.n_head, 1, 4096));
    c.n_embd = static_cast<int>(m.get_int("n_embd", c.n_embd, 1, 1 << 20));
    c.seq_len = static_cast<int>(m.get_int("seq_len", c.seq_len, 1, 1 << 20));
    c.vocab_size = static_cast<int>(m.get_int("vocab_size", c.vocab_size, 2, 65536));
    c.activation_checkpointing = m.get_bool("activation_checkpointing", false);
    s.tensor_parallel = static_cast<int>(m.get_int("tensor_parallel", 1, 1, 4096));
    s.pipeline_parallel = static_cast<int>(m.get_int("pipeline_parallel", 1, 1, 4096));
    s.init_seed = static_cast<std::uint64_t>(m.get_int("seed", 42, 0));
    s.init_from = m.get_string("init_from", "");
    if (c.n_embd % c.n_head != 0)
      m.fail(m.has("n_head") ? "n_head" : "n_embd",
             "n_embd = " + std::to_string(c.n_embd) + " is not divisible by n_head = " +
                 std::to_string(c.n_head) + "; pick n_head among the divisors of n_embd");
    try {
      check_tensor_parallel(c, s.tensor_parallel);
    } catch (const zero::Error& e) {
      m.fail("tensor_parallel", e.what());
    }
    // backend: cuda multiplies bf16 rows through cuBLASLt, which needs every row 16-byte
    // aligned: a tensor rank's widths (n_embd, and 3, 1 and 4 x n_embd / T) and its part of the
    // padded vocabulary must be multiples of 8 elements. Said here, naming the keys, rather than
    // by the first product with a width the user never set.
    const int T = s.tensor_parallel;
    if (cfg.backend == zero::BackendKind::cuda && c.n_embd % c.n_head == 0 && c.n_head % T == 0) {
      if ((c.n_embd / T) % 8 != 0)
        m.fail(m.has("n_embd") || T == 1 ? "n_embd" : "tensor_parallel",
               "backend: cuda needs n_embd / tensor_parallel (" + std::to_string(c.n_embd) + " / " +
                   std::to_string(T) + ") to be a multiple of 8: its bf16 matrix rows must be 16-byte "
                   "aligned; choose n_embd a multiple of 8 x tensor_parallel (" + std::to_string(8 * T) +
                   ")" + (T > 1 ? " or a smaller tensor_parallel" : ""));
      else if (c.padded_vocab_size() % T == 0 && (c.padded_vocab_size() / T) % 8 != 0)
        m.fail("tensor_parallel",
               "backend: cuda needs each tensor rank's part of the padded vocabulary (" +
                   std::to_string(c.padded_vocab_size()) + " / " + std::to_string(T) + " ids) to be a "
                   "multiple of 8: its logits rows must be 16-byte aligned; choose tensor_parallel "
                   "dividing " + std::to_string(c.padded_vocab_size() / 8));
    }
    if (s.pipeline_parallel > c.n_layer)
      m.fail("pipeline_parallel", std::to_string(s.pipeline_parallel) + " stages for " + std::to_string(c.n_layer) +
                                      " blocks (n_layer): every stage needs at least one block; use at most " +
                                      std::to_string(c.n_layer));
    m.finish();
    s.model = c;
  }
  {
    zero::StrictSection d = zero::extra_section(cfg, "data");
    s.train = d.get_string("train", s.train);
    s.val = d.get_string("val", s.val);
    s.data_seed = static_cast<std::uint64_t>(d.get_int("seed", 1337, 0));
    if (s.train.empty()) d.fail("train", "is empty; give 'shakespeare', a .txt file or a glob of .bin shards");
    if (!s.val.empty() && s.val != "none" && s.val.ends_with(".txt"))
      d.fail("val", "a text file's validation part is its last 10% and is taken automatically; "
                    "leave data.val empty, or give a glob of .bin shards, or 'none'");
    d.finish();
  }
  {
    zero::StrictSection r = zero::extra_section(cfg, "run");
    s.steps = r.get_int("steps", s.steps, 1);
    s.eval_interval = r.get_int("eval_interval", s.eval_interval, 0);
    // A count of micro-batches meant other tokens at another micro-batch size or rank count.
    r.reject("eval_batches", "was replaced by run.eval_sequences (validation windows of seq_len "
                             "tokens, the same at any micro-batch size and rank count; 0: the "
                             "whole validation split)");
    s.eval_sequences = r.get_int("eval_sequences", s.eval_sequences, 0);
    s.sample_tokens = static_cast<int>(r.get_int("sample_tokens", s.sample_tokens, 0, 1 << 20));
    s.temperature = r.get_double("temperature", s.temperature, zero::Range::at_least(0));
    s.top_k = static_cast<int>(r.get_int("top_k", s.top_k, 0, 1 << 20));
    s.out_dir = r.get_string("out_dir", "runs/" + s.preset);
    s.save_interval = r.get_int("save_interval", s.save_interval, 0);
    s.keep_checkpoints = static_cast<int>(r.get_int("keep_checkpoints", s.keep_checkpoints, 0, 1 << 20));
    s.token_budget = r.get_double("token_budget", s.token_budget, zero::Range::above(0));
    s.log_jsonl = r.get_bool("log_jsonl", s.log_jsonl);
    s.strict_outputs = r.get_bool("strict_outputs", s.strict_outputs);
    s.progress = r.get_choice("progress", s.progress, {"auto", "on", "off"});
    s.peak_tflops = r.get_double("peak_tflops", s.peak_tflops, zero::Range::at_least(0));
    r.finish();
  }
  return s;
}

std::map<std::string, std::string> GptSettings::sections() const {
  std::ostringstream m, d, r;
  m << "preset: " << preset << "\n"
    << "n_layer: " << model.n_layer << "\n"
    << "n_head: " << model.n_head << "\n"
    << "n_embd: " << model.n_embd << "\n"
    << "seq_len: " << model.seq_len << "\n"
    << "vocab_size: " << model.vocab_size << "\n"
    << "activation_checkpointing: " << (model.activation_checkpointing ? "true" : "false") << "\n"
    << "tensor_parallel: " << tensor_parallel << "\n"
    << "pipeline_parallel: " << pipeline_parallel << "\n"
    << "seed: " << init_seed << "\n";
  if (!init_from.empty()) m << "init_from: " << quoted(init_from) << "\n";
  d << "train: " << quoted(train) << "\n"
    << "val: " << quoted(val) << "\n"
    << "seed: " << data_seed << "\n";
  r << "steps: " << steps << "\n"
    << "eval_interval: " << eval_interval << "\n"
    << "eval_sequences: " << eval_sequences << "\n"
    << "sample_tokens: " << sample_tokens << "\n"
    << "temperature: " << number(temperature) << "\n"
    << "top_k: " << top_k << "\n"
    << "out_dir: " << quoted(out_dir) << "\n"
    << "save_interval: " << save_interval << "\n"
    << "keep_checkpoints: " << keep_checkpoints << "\n"
    << "token_budget: " << number(token_budget) << "\n"
    << "log_jsonl: " << (log_jsonl ? "true" : "false") << "\n"
    << "strict_outputs: " << (strict_outputs ? "true" : "false") << "\n"
    << "progress: " << progress << "\n"
    << "peak_tflops: " << number(peak_tflops) << "\n";
  return {{"model", m.str()}, {"data", d.str()}, {"run", r.str()}};
}

std::string gpt_settings_help() {
  std::string presets;
  for (const auto& p : gpt_preset_names()) presets += (presets.empty() ? "" : ", ") + p;
  return "Trainer sections of the config file (next to the engine's DeepSpeed-style keys):\n"
         "model:\n"
         "  preset: tiny                 " + presets + "\n"
         "  n_layer / n_head / n_embd    override the preset's shape\n"
         "  seq_len                      context length T (size of the position embedding)\n"
         "  vocab_size                   256 for bytes, 50257 for GPT-2 tokens (padded to x128)\n"
         "  activation_checkpointing: false  keep only block inputs, recompute in backward\n"
         "  tensor_parallel: 1           ranks that split each layer (Megatron-style: heads, MLP\n"
         "                               columns and vocabulary); must divide n_head, the padded\n"
         "                               vocabulary and the number of ranks (the rest is data\n"
         "                               parallel)\n"
         "  pipeline_parallel: 1         P pipeline stages of contiguous blocks, 1F1B over the\n"
         "                               gradient_accumulation_steps micro-batches; ranks =\n"
         "                               T x P x data-parallel ranks; ZeRO stages 0-1, host backend\n"
         "  seed: 42                     initialisation seed (same model at any world size)\n"
         "  init_from: \"\"                GPT-2 weights to start from: a Hugging Face directory\n"
         "                               (model.safetensors, config.json), a .safetensors file\n"
         "                               or an llm.c checkpoint (gpt2_124M.bin); shapes must\n"
         "                               match the model section\n"
         "data:\n"
         "  train: shakespeare           'shakespeare' (embedded), a .txt file (bytes), or a\n"
         "                               glob of llm.c .bin token shards\n"
         "  val: \"\"                      '': a text's last 10% (shards: none); a glob; none\n"
         "  seed: 1337                   shuffle seed (each epoch is a new permutation)\n"
         "run:\n"
         "  steps: 1000                  optimizer steps\n"
         "  eval_interval: 100           validation every N steps (0: only at the end)\n"
         "  eval_sequences: 0            validation windows (seq_len tokens) per evaluation,\n"
         "                               the split's first ones; 0: the whole split (the same\n"
         "                               tokens at any micro-batch size and rank count)\n"
         "  sample_tokens: 200           tokens sampled at the end (0: none)\n"
         "  temperature: 0.8             sampling temperature (0: greedy)\n"
         "  top_k: 40                    sample among the k most likely (0: all)\n"
         "  out_dir: runs/<preset>       config.yaml, metrics.jsonl, sample.txt, checkpoints/\n"
         "  save_interval: 0             checkpoint every N steps and at the end (0: never)\n"
         "  keep_checkpoints: 3          complete checkpoints kept in out_dir/checkpoints (0: all)\n"
         "  token_budget: 100e9          tokens for the 'days to train' projection\n"
         "  log_jsonl: true              write metrics.jsonl\n"
         "  strict_outputs: false        a failed write to out_dir (log, metrics, config.yaml,\n"
         "                               sample) ends the run; false: a warning, training goes on\n"
         "  progress: auto               live step/ETA line: auto (a single process on a\n"
         "                               terminal: mpirun gives every rank a terminal even\n"
         "                               when its own output is a file), on, off\n"
         "  peak_tflops: 0               peak TFLOPs per device that MFU divides by; 0: measure\n"
         "                               OpenBLAS sgemm at start (the host's practical peak), or\n"
         "                               on a GPU its preset's bf16 peak (none: MFU n/a)\n";
}

int gpt_data_parallel_size(const GptSettings& settings, int world_size) {
  const int T = settings.tensor_parallel, P = settings.pipeline_parallel;
  ZERO_CHECK(T >= 1 && P >= 1 && world_size % (T * P) == 0,
             "zero-gpt: " + std::to_string(world_size) + " ranks cannot form groups of model.tensor_parallel = " +
                 std::to_string(T) + " x pipeline_parallel = " + std::to_string(P) + " ranks; run a multiple of " +
                 std::to_string(T * P) + " ranks (tensor x pipeline x data-parallel), or change the sizes");
  return world_size / (T * P);
}

// ------------------------------------------------------------------------------ trainer

namespace {

// This rank's part of the model: the whole of it, its tensor part, or its stage's tensor part.
zero::Layout rank_layout(const GptSettings& settings, const zero::ProcessGroups* groups) {
  const GptConfig& mc = settings.model;
  const int T = settings.tensor_parallel, P = settings.pipeline_parallel;
  if (!groups) return build_layout(mc);
  if (P > 1) return stage_layout(mc, stage_split(mc.n_layer, P, groups->coord().pipeline), T);
  return tensor_parallel_layout(mc, T);
}

void check_groups_match(const GptSettings& settings, const zero::ProcessGroups* groups) {
  const int T = settings.tensor_parallel, P = settings.pipeline_parallel;
  ZERO_CHECK(groups ? groups->tensor_size() == T && groups->pipeline_size() == P : T == 1 && P == 1,
             "zero-gpt: model.tensor_parallel = " + std::to_string(T) + " x pipeline_parallel = " + std::to_string(P) +
                 (groups ? " on process groups of tensor " + std::to_string(groups->tensor_size()) + " x pipeline " +
                               std::to_string(groups->pipeline_size())
                         : " without process groups") +
                 "; build the groups with ProcessGroups(ctx, {tensor_parallel, pipeline_parallel})");
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
  std::optional<zero::hf::Gpt2Weights> weights;
  if (!settings.init_from.empty()) {
    weights.emplace(settings.init_from);
    weights->check(mc.plan_shape());
  }
  const zero::Layout layout = rank_layout(settings, groups);
  auto engine = groups ? std::make_unique<zero::Engine>(ctx, cfg, layout, *groups)
                       : std::make_unique<zero::Engine>(ctx, cfg, layout);
  // Under tensor parallelism each rank computes the whole tensor and keeps its part, so the
  // model is the same at every T.
  const int t = groups ? groups->coord().tensor : 0;
  std::vector<float> whole;
  engine->init_params([&](const zero::ParamInfo& p, std::span<float> v) {
    const std::vector<std::int64_t> shape = whole_shape(p, T);
    whole.resize(static_cast<std::size_t>(p.numel) * (p.split_axis >= 0 ? T : 1));
    if (weights) weights->read(p.name, shape, whole);
    else init_parameter(mc, p.name, whole, settings.init_seed);
    take_part(whole, p, T, t, v);
  });
  return engine;
}

GptTrainer::GptTrainer(zero::Context& ctx, const zero::Config& cfg, const GptSettings& settings)
    : GptTrainer(ctx, cfg, settings, nullptr, nullptr) {}

GptTrainer::GptTrainer(zero::Context& ctx, zero::Engine& engine, const GptSettings& settings)
    : GptTrainer(ctx, engine.config(), settings, &engine, nullptr) {}

GptTrainer::GptTrainer(zero::Context& ctx, zero::Engine& engine, zero::ProcessGroups& groups,
                       const GptSettings& settings)
    : GptTrainer(ctx, engine.config(), settings, &engine, &groups) {}

GptTrainer::GptTrainer(zero::Context& ctx, const zero::Config& cfg, const GptSettings& settings,
                       zero::Engine* borrowed, zero::ProcessGroups* borrowed_groups)
    : ctx_(ctx), settings_(settings) {
  const GptConfig& mc = settings_.model;
  mc.validate();
  ZERO_CHECK(cfg.train_micro_batch_size_per_gpu >= 1 && cfg.train_micro_batch_size_per_gpu <= INT32_MAX &&
                 cfg.gradient_accumulation_steps >= 1 && cfg.gradient_accumulation_steps <= INT32_MAX,
             "GptTrainer: the micro batch and accumulation steps must fit an int; use a resolved Config");
  // The grid: T tensor ranks x P pipeline stages, data parallel over the rest.
  const int T = settings_.tensor_parallel, P = settings_.pipeline_parallel;
  check_tensor_parallel(mc, T);
  const int data_size = gpt_data_parallel_size(settings_, ctx.world_size());
  ZERO_CHECK(cfg.train_batch_size == cfg.train_micro_batch_size_per_gpu * cfg.gradient_accumulation_steps * data_size,
             "GptTrainer: the config is resolved for " +
                 std::to_string(cfg.train_batch_size /
                                std::max<std::int64_t>(1, cfg.train_micro_batch_size_per_gpu * cfg.gradient_accumulation_steps)) +
                 " data-parallel ranks, but " + std::to_string(ctx.world_size()) + " ranks at tensor_parallel " +
                 std::to_string(T) + " x pipeline_parallel " + std::to_string(P) + " give " +
                 std::to_string(data_size) + "; resolve it with gpt_data_parallel_size(settings, world size)");
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
    pipe_->split = stage_split(mc.n_layer, P, groups_->coord().pipeline);
  }

  // Data first: a bad path should fail before any memory is committed.
  const std::string& train = settings_.train;
  if (train == "shakespeare" || train.ends_with(".txt")) {
    const std::string path = train == "shakespeare" ? find_shakespeare() : train;
    train_set_ = std::make_unique<TokenSet>(TokenSet::from_text_file(path, false));
    if (settings_.val.empty())
      val_set_ = std::make_unique<TokenSet>(TokenSet::from_text_file(path, true));
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
               "GptTrainer: the engine it was given holds another model (" +
                   std::to_string(borrowed->layout().num_params()) + " parameters, this rank's part of this GPT has " +
                   std::to_string(expected.num_params()) + "); build the engine with make_gpt_engine");
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
    if (groups_ && T > 1) tp = {T, groups_->coord().tensor, &groups_->tensor()};
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
  return format_grid(tensor_parallel_size(), data_parallel_size(), pipeline_stages());
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
}  // namespace

void GptTrainer::save_checkpoint(const std::string& root) {
  const std::int64_t samples = train_loader_->micro_step() * train_loader_->samples_per_micro_step();
  zero::CheckpointOptions o;
  o.keep_last = settings_.keep_checkpoints;
  zero::save_checkpoint(*engine_, root, {{kSamplesKey, std::to_string(samples)}}, o);
}

std::int64_t GptTrainer::load_checkpoint(const std::string& root, const std::string& tag, bool read_only) {
  zero::CheckpointLoadOptions o;
  o.lock_root = !read_only;
  const zero::ClientState client = zero::load_checkpoint(*engine_, root, tag, o);
  const auto it = client.find(kSamplesKey);
  ZERO_CHECK(it != client.end(), "load_checkpoint: '" + root + "' has no " + kSamplesKey +
                                     " entry: it was not written by zero-gpt");
  // The checkpoint's checksums cover the bytes, not their meaning: a hand-edited or foreign
  // value must not send the data stream backwards or past the end of int64.
  const std::string& text = it->second;
  std::int64_t samples = -1;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), samples);
  const std::int64_t per = train_loader_->samples_per_micro_step();
  const std::int64_t most = std::numeric_limits<std::int64_t>::max() / 2;
  ZERO_CHECK(ec == std::errc() && end == text.data() + text.size() && samples >= 0 && samples <= most,
             "load_checkpoint: client state " + std::string(kSamplesKey) + " = '" + zero::escape_bytes(text) +
                 "' in '" + root + "' is not a count of samples in [0, " + std::to_string(most) +
                 "]; the checkpoint was damaged or edited: resume from another step (--checkpoint "
                 "<root>/step_N)");
  ZERO_CHECK(samples % per == 0,
             "load_checkpoint: the checkpoint stopped after " + std::to_string(samples) +
                 " samples, which is not a whole number of this run's micro-steps (" +
                 std::to_string(per) + " samples: micro-batch x data-parallel ranks); resume with a "
                 "micro-batch and rank count whose product divides it");
  train_loader_->seek(samples / per);
  return engine_->global_step();
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
  model_->backward_embeddings(ge);
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
