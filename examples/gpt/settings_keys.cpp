// The table of the trainer's keys (settings_keys.hpp), the one place each is declared. Order
// matters: keys are read, written back and listed in this order.
#include "gpt/settings_keys.hpp"

#include <fmt/format.h>

#include "zero/plan/plan.hpp"

namespace zero::gpt::keys {

namespace {

Range between(double lo, double hi) { return Range::closed(lo, hi); }
Range at_least(double lo) { return Range::at_least(lo); }

constexpr double kLayers = 4096, kWidth = 1 << 20, kCount = 1 << 20;

}  // namespace

const zero::SettingsTable<GptSettings>& gpt_keys() {
  static const zero::SettingsTable<GptSettings> table(std::vector<Key>{
      // ---- model
      {.section = "model",
       .name = "preset",
       .slot = [](GptSettings& s) -> Slot { return &s.preset; },
       .def = "tiny",
       .choices = gpt_preset_names(),
       .doc = fmt::format("the model's shape by name ({}); the keys below override its parts",
                          fmt::join(gpt_preset_names(), ", ")),
       .then = [](GptSettings& s) { s.model = gpt_preset(s.preset); }},
      {.section = "model",
       .name = "arch",
       .slot = [](GptSettings& s) -> Slot { return &s.arch; },
       .choices = {"gpt2", "bloom", "llama"},
       .doc = "gpt2 (LayerNorm, learned positions, GELU), bloom (ALiBi, a LayerNorm on the embeddings) or llama "
              "(RMSNorm, rotary positions, SwiGLU, grouped-query attention, no biases)",
       .default_text = "the preset's",
       .dynamic_default = [](GptSettings& s) { s.arch = std::string(zero::plan::arch_name(s.model.arch)); },
       .then = [](GptSettings& s) { s.model.arch = zero::plan::parse_arch(s.arch); }},
      {.section = "model",
       .name = "n_layer",
       .slot = [](GptSettings& s) -> Slot { return &s.model.n_layer; },
       .range = between(1, kLayers),
       .doc = "transformer blocks",
       .default_text = "the preset's"},
      {.section = "model",
       .name = "n_head",
       .slot = [](GptSettings& s) -> Slot { return &s.model.n_head; },
       .range = between(1, kLayers),
       .doc = "attention heads; must divide n_embd",
       .default_text = "the preset's"},
      {.section = "model",
       .name = "n_embd",
       .slot = [](GptSettings& s) -> Slot { return &s.model.n_embd; },
       .range = between(1, kWidth),
       .doc = "channels C, the width of the residual stream",
       .default_text = "the preset's"},
      {.section = "model",
       .name = "n_kv_head",
       .slot = [](GptSettings& s) -> Slot { return &s.model.n_kv_head; },
       .range = between(0, kLayers),
       .doc = "llama: key/value heads (grouped-query attention); must divide n_head; 0: n_head",
       .default_text = "the preset's"},
      {.section = "model",
       .name = "ffn_hidden",
       .slot = [](GptSettings& s) -> Slot { return &s.model.ffn_hidden; },
       .range = between(0, kWidth),
       .doc = "the MLP's hidden width (llama: SwiGLU's intermediate size); 0: 4 n_embd",
       .default_text = "the preset's"},
      {.section = "model",
       .name = "tie_word_embeddings",
       .slot = [](GptSettings& s) -> Slot { return &s.model.tied_head; },
       .doc = "the LM head is the token embedding (gpt2 and bloom always; llama either)",
       .default_text = "the preset's"},
      {.section = "model",
       .name = "norm_eps",
       .slot = [](GptSettings& s) -> Slot { return &s.model.norm_eps; },
       .range = Range::above(0),
       .doc = "llama: RMSNorm's epsilon (the LayerNorms use 1e-5)",
       .default_text = "the preset's"},
      {.section = "model",
       .name = "rope_theta",
       .slot = [](GptSettings& s) -> Slot { return &s.model.rope_theta; },
       .range = Range::above(1),
       .doc = "llama: the rotary positions' base",
       .default_text = "the preset's"},
      {.section = "model",
       .name = "seq_len",
       .slot = [](GptSettings& s) -> Slot { return &s.model.seq_len; },
       .range = between(1, kWidth),
       .doc = "context length T (gpt2: the size of the position embedding)",
       .default_text = "the preset's"},
      {.section = "model",
       .name = "vocab_size",
       .slot = [](GptSettings& s) -> Slot { return &s.model.vocab_size; },
       .range = between(2, 1 << 24),
       .doc = "256 for bytes, 50257 for GPT-2 tokens, 128256 for Llama 3, 250880 for BLOOM (padded to x128; "
              "above 65536 the token shards must be uint32)",
       .default_text = "the preset's"},
      {.section = "model",
       .name = "activation_checkpointing",
       .slot = [](GptSettings& s) -> Slot { return &s.model.activation_checkpointing; },
       .def = false,
       .doc = "keep only block inputs, recompute in backward"},
      {.section = "model",
       .name = "tensor_parallel",
       .slot = [](GptSettings& s) -> Slot { return &s.tensor_parallel; },
       .def = 1,
       .range = between(1, kLayers),
       .doc = "ranks that split each layer (Megatron-style: heads, MLP columns and vocabulary); must divide "
              "n_head, the MLP width, the padded vocabulary and the number of ranks (the rest is data parallel), and "
              "divide n_kv_head or be a multiple of it (the key/value heads then replicated)"},
      {.section = "model",
       .name = "pipeline_parallel",
       .slot = [](GptSettings& s) -> Slot { return &s.pipeline_parallel; },
       .def = 1,
       .range = between(1, kLayers),
       .doc = "P pipeline parts of contiguous blocks, 1F1B over the gradient_accumulation_steps "
              "micro-batches; ranks = T x P x data-parallel ranks; ZeRO stages 0-1, host backend"},
      {.section = "model",
       .name = "seed",
       .slot = [](GptSettings& s) -> Slot { return &s.init_seed; },
       .def = 42,
       .range = at_least(0),
       .doc = "initialisation seed (same model at any world size)"},
      {.section = "model",
       .name = "init_from",
       .slot = [](GptSettings& s) -> Slot { return &s.init_from; },
       .def = "",
       .doc = "pretrained weights to start from: a Hugging Face directory of a GPT2LMHeadModel, "
              "BloomForCausalLM or LlamaForCausalLM (config.json with model.safetensors or its shards), a "
              ".safetensors file in the trainer's names, or an llm.c checkpoint (gpt2_124M.bin); config.json must "
              "match the model section (each difference names the key to set)",
       .omitted = [](const GptSettings& s) { return s.init_from.empty(); }},

      // ---- data
      {.section = "data",
       .name = "train",
       .slot = [](GptSettings& s) -> Slot { return &s.train; },
       .def = "shakespeare",
       .doc = "'shakespeare' (embedded), a .txt file (bytes), or a glob of llm.c .bin token shards",
       .check = [](const GptSettings& s) -> std::string {
         return s.train.empty() ? "is empty; give 'shakespeare', a .txt file or a glob of .bin shards" : "";
       }},
      {.section = "data",
       .name = "val",
       .slot = [](GptSettings& s) -> Slot { return &s.val; },
       .def = "",
       .doc = "'': a text's last 10% (shards: none); a glob; none",
       .check = [](const GptSettings& s) -> std::string {
         if (s.val.empty() || s.val == "none" || !s.val.ends_with(".txt")) return "";
         return "a text file's validation part is its last 10% and is taken automatically; leave data.val "
                "empty, or give a glob of .bin shards, or 'none'";
       }},
      {.section = "data",
       .name = "seed",
       .slot = [](GptSettings& s) -> Slot { return &s.data_seed; },
       .def = 1337,
       .range = at_least(0),
       .doc = "shuffle seed (each epoch is a new permutation)"},

      // ---- run
      {.section = "run",
       .name = "steps",
       .slot = [](GptSettings& s) -> Slot { return &s.steps; },
       .def = 1000,
       .range = at_least(1),
       .doc = "optimizer steps"},
      {.section = "run",
       .name = "eval_interval",
       .slot = [](GptSettings& s) -> Slot { return &s.eval_interval; },
       .def = 100,
       .range = at_least(0),
       .doc = "validation every N steps (0: only at the end)"},
      // A count of micro-batches meant other tokens at another micro-batch size or rank count.
      {.section = "run",
       .name = "eval_batches",
       .retired = "was replaced by run.eval_sequences (validation windows of seq_len tokens, the same at any "
                  "micro-batch size and rank count; 0: the whole validation split)"},
      {.section = "run",
       .name = "eval_sequences",
       .slot = [](GptSettings& s) -> Slot { return &s.eval_sequences; },
       .def = 0,
       .range = at_least(0),
       .doc = "validation windows (seq_len tokens) per evaluation, the split's first ones; 0: the whole "
              "split (the same tokens at any micro-batch size and rank count)"},
      {.section = "run",
       .name = "sample_tokens",
       .slot = [](GptSettings& s) -> Slot { return &s.sample_tokens; },
       .def = 200,
       .range = between(0, kCount),
       .doc = "tokens sampled at the end (0: none)"},
      {.section = "run",
       .name = "temperature",
       .slot = [](GptSettings& s) -> Slot { return &s.temperature; },
       .def = 0.8,
       .range = at_least(0),
       .doc = "sampling temperature (0: greedy)"},
      {.section = "run",
       .name = "top_k",
       .slot = [](GptSettings& s) -> Slot { return &s.top_k; },
       .def = 40,
       .range = between(0, kCount),
       .doc = "sample among the k most likely (0: all)"},
      {.section = "run",
       .name = "out_dir",
       .slot = [](GptSettings& s) -> Slot { return &s.out_dir; },
       .doc = "config.yaml, metrics.jsonl, sample.txt, checkpoints/",
       .default_text = "`runs/<preset>`",
       .dynamic_default = [](GptSettings& s) { s.out_dir = "runs/" + s.preset; }},
      {.section = "run",
       .name = "save_interval",
       .slot = [](GptSettings& s) -> Slot { return &s.save_interval; },
       .def = 0,
       .range = at_least(0),
       .doc = "checkpoint every N steps and at the end (0: never)"},
      {.section = "run",
       .name = "keep_checkpoints",
       .slot = [](GptSettings& s) -> Slot { return &s.keep_checkpoints; },
       .def = 3,
       .range = between(0, kCount),
       .doc = "complete checkpoints kept in out_dir/checkpoints (0: all)"},
      {.section = "run",
       .name = "token_budget",
       .slot = [](GptSettings& s) -> Slot { return &s.token_budget; },
       .def = 100e9,
       .range = Range::above(0),
       .doc = "tokens for the 'days to train' projection"},
      {.section = "run",
       .name = "log_jsonl",
       .slot = [](GptSettings& s) -> Slot { return &s.log_jsonl; },
       .def = true,
       .doc = "write metrics.jsonl"},
      {.section = "run",
       .name = "strict_outputs",
       .slot = [](GptSettings& s) -> Slot { return &s.strict_outputs; },
       .def = false,
       .doc = "a failed write to out_dir (log, metrics, config.yaml, sample) ends the run; false: a warning, "
              "training goes on"},
      {.section = "run",
       .name = "allow_model_change",
       .slot = [](GptSettings& s) -> Slot { return &s.allow_model_change; },
       .def = false,
       .doc = "resume (or sample) from a checkpoint saved with another model.n_head or model.vocab_size (the "
              "same shapes, another computation); false: such a checkpoint is refused naming both values"},
      {.section = "run",
       .name = "progress",
       .slot = [](GptSettings& s) -> Slot { return &s.progress; },
       .def = "auto",
       .choices = {"auto", "on", "off"},
       .doc = "live step/ETA line: auto (a single process on a terminal: mpirun gives every rank a terminal "
              "even when its own output is a file), on, off"},
      {.section = "run",
       .name = "peak_tflops",
       .slot = [](GptSettings& s) -> Slot { return &s.peak_tflops; },
       .def = 0.0,
       .range = at_least(0),
       .doc = "peak TFLOPs per device that MFU divides by; 0: measure OpenBLAS sgemm at start (the host's "
              "practical peak), or on a GPU its preset's bf16 peak (none: MFU n/a)"},
  });
  return table;
}

}  // namespace zero::gpt::keys
