// The trainer's settings: the table of settings_keys.cpp read strictly, then the rules that need
// several keys at once.
#include "gpt/settings.hpp"

#include <fmt/format.h>

#include "gpt/settings_keys.hpp"
#include "gpt/tensor_parallel.hpp"
#include "zero/error.hpp"

namespace zero::gpt {

namespace {

// With backend: cuda the model runs on CudaOps (cuda/cuda_ops.hpp, loaded from libzero_gpt_cuda
// by cuda_library.hpp), which compute in bf16 on the engine's device storage: the engine's
// compute dtype must be the same.
void check_backend(const zero::Config& cfg) {
  if (cfg.backend != zero::BackendKind::cuda) return;
#if !ZERO_GPT_CUDA
  ZERO_THROW(
      "zero-gpt: backend: cuda, but this build has no CUDA support (configure with "
      "-DZERO_CUDA=ON on a machine with the CUDA toolkit), or set backend: host");
#endif
  ZERO_CHECK(cfg.compute_dtype() == zero::DType::bf16,
             fmt::format("zero-gpt: backend: cuda trains in bf16 (the GPT CUDA kernels take bf16 parameters, "
                         "gradients and activations), but the config computes in {}; set bf16.enabled: true{}",
                         zero::dtype_name(cfg.compute_dtype()), cfg.fp16.enabled ? " and fp16.enabled: false" : ""));
}

// The model section's rules over several keys, each failing on the key to change.
void check_model(zero::StrictSection& m, const GptSettings& s, const zero::Config& cfg) {
  const GptConfig& c = s.model;
  if (c.n_embd % c.n_head != 0)
    m.fail(m.has("n_head") ? "n_head" : "n_embd",
           fmt::format("n_embd = {} is not divisible by n_head = {}; pick n_head among the divisors of n_embd",
                       c.n_embd, c.n_head));
  try {
    c.validate();
  } catch (const zero::Error& e) {
    // The shape's own rules (grouped-query heads, an untied head outside llama, ...): the key
    // most likely given by hand.
    const char* key = m.has("n_kv_head")             ? "n_kv_head"
                      : m.has("tie_word_embeddings") ? "tie_word_embeddings"
                      : m.has("arch")                ? "arch"
                                                     : "preset";
    m.fail(key, std::string("describes a model that cannot be built: ") + e.what());
  }
  try {
    check_tensor_parallel(c, s.tensor_parallel);
  } catch (const zero::Error& e) {
    m.fail("tensor_parallel", e.what());
  }
  // backend: cuda multiplies bf16 rows through cuBLASLt, which needs every row 16-byte
  // aligned: a tensor rank's widths (n_embd / T, its q, k and v columns, its MLP width) and its part of the
  // padded vocabulary must be multiples of 8 elements. Said here, naming the keys, rather than
  // by the first product with a width the user never set.
  const int T = s.tensor_parallel;
  if (cfg.backend == zero::BackendKind::cuda && c.n_embd % c.n_head == 0 && c.n_head % T == 0) {
    if ((c.n_embd / T) % 8 != 0)
      m.fail(m.has("n_embd") || T == 1 ? "n_embd" : "tensor_parallel",
             fmt::format("backend: cuda needs n_embd / tensor_parallel ({} / {}) to be a multiple of 8: its bf16 "
                         "matrix rows must be 16-byte aligned; choose n_embd a multiple of 8 x tensor_parallel "
                         "({}){}",
                         c.n_embd, T, 8 * T, T > 1 ? " or a smaller tensor_parallel" : ""));
    else if (c.padded_vocab_size() % T == 0 && (c.padded_vocab_size() / T) % 8 != 0)
      m.fail("tensor_parallel",
             fmt::format("backend: cuda needs each tensor rank's part of the padded vocabulary ({} / {} ids) to "
                         "be a multiple of 8: its logits rows must be 16-byte aligned; choose tensor_parallel "
                         "dividing {}",
                         c.padded_vocab_size(), T, c.padded_vocab_size() / 8));
    else if (T > 1 && c.kv_replicated(T))
      m.fail("tensor_parallel",
             fmt::format("= {} is a multiple of n_kv_head = {}, which replicates each key/value head over {} ranks; "
                         "the CUDA model does not do that yet (the host backend does): choose tensor_parallel among "
                         "the divisors of n_kv_head",
                         T, c.kv_heads(), T / c.kv_heads()));
    else if ((c.qkv_width() / T) % 8 != 0)
      m.fail(m.has("n_kv_head") ? "n_kv_head" : "n_head",
             fmt::format("backend: cuda needs each tensor rank's q, k and v columns ({} / {}) to be a multiple of 8 "
                         "(16-byte bf16 rows); choose heads whose size is a multiple of 8",
                         c.qkv_width(), T));
    else if ((c.mlp_hidden() / T) % 8 != 0)
      m.fail("ffn_hidden", fmt::format("backend: cuda needs each tensor rank's MLP width ({} / {}) to be a multiple "
                                       "of 8 (16-byte bf16 rows); choose ffn_hidden a multiple of 8 x tensor_parallel",
                                       c.mlp_hidden(), T));
  }
  if (s.pipeline_parallel > c.n_layer)
    m.fail("pipeline_parallel", fmt::format("{} parts for {} blocks (n_layer): every part needs at least one "
                                            "block; use at most {}",
                                            s.pipeline_parallel, c.n_layer, c.n_layer));
}

}  // namespace

GptSettings::GptSettings() { keys::gpt_keys().set_defaults(*this); }

const std::vector<std::string>& gpt_sections() { return keys::gpt_keys().sections(); }

GptSettings read_gpt_settings(const zero::Config& cfg) {
  check_backend(cfg);
  GptSettings s;
  for (const std::string& name : gpt_sections()) {
    zero::StrictSection section = zero::extra_section(cfg, name);
    keys::gpt_keys().read(section, s);
    if (name == "model") check_model(section, s, cfg);
    section.finish();
  }
  return s;
}

std::map<std::string, std::string> GptSettings::sections() const { return keys::gpt_keys().resolved(*this); }

std::string gpt_settings_help() {
  return "Trainer sections of the config file (next to the engine's DeepSpeed-style keys):\n" + keys::gpt_keys().help();
}

std::string gpt_settings_reference_markdown() { return keys::gpt_keys().markdown(); }

int gpt_data_parallel_size(const GptSettings& settings, int world_size) {
  const int T = settings.tensor_parallel, P = settings.pipeline_parallel;
  ZERO_CHECK(T >= 1 && P >= 1 && world_size % (T * P) == 0,
             fmt::format("zero-gpt: {} ranks cannot form groups of model.tensor_parallel = {} x pipeline_parallel = {} "
                         "ranks; run a multiple of {} ranks (tensor x pipeline x data-parallel), or change the sizes",
                         world_size, T, P, T * P));
  return world_size / (T * P);
}

}  // namespace zero::gpt
