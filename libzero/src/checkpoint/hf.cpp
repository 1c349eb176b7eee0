// Hugging Face export and import for gpt2, bloom and llama (see zero/formats/hf.hpp; what is
// converted: docs/architecture.md, note hf-interchange).
#include "zero/formats/hf.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "checkpoint/format.hpp"
#include "checkpoint/interop.hpp"
#include "checkpoint/json.hpp"
#include "checkpoint/safetensors.hpp"
#include "runtime/strings.hpp"
#include "zero/error.hpp"
#include "zero/formats/llmc_gpt2.hpp"
#include "zero/plan/plan.hpp"

namespace fs = std::filesystem;

namespace zero::hf {

using plan::Arch;
using Shape = std::vector<std::int64_t>;

namespace {

constexpr const char* kWte = "wte.weight";
constexpr const char* kLmHead = "lm_head.weight";
constexpr const char* kIndex = "model.safetensors.index.json";

std::int64_t count(const Shape& s) {
  std::int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

// ---------------------------------------------------------------- the correspondence
//
// How one trainer parameter is made of Hugging Face tensors. The trainer stores every matrix
// [in, out] (y = x W); nn.Linear stores [out, in].
enum class Kind {
  copy,       // the same elements in the same order (embeddings: the first vocab_size rows)
  transpose,  // one [out, in] matrix
  llama_qkv,  // q_proj, k_proj, v_proj [heads * hs, C] -> [C, (NH + 2 KV) hs], q heads reordered
  llama_o,    // o_proj [C, NH hs] -> [NH hs, C], input rows in the stored q head order
  gate_up,    // gate_proj, up_proj [F, C] -> [C, 2F]: gate, then up
  bloom_qkv,  // query_key_value [NH, 3, hs, C] -> [C, 3C]: q of every head, then k, then v
  bloom_qkv_bias,
};
struct HfTensor {
  std::string name;
  Shape shape;
};
struct Mapping {
  Kind kind = Kind::copy;
  std::vector<HfTensor> from;
};

// Calls fn(ours, source, theirs) for every element of the parameter that `m` makes: its flat
// index, the index of the Hugging Face tensor in m.from and the flat index there. Elements no
// tensor provides (padding rows) are not visited.
template <class Fn>
void place(const Mapping& m, const plan::GptShape& c, Fn&& fn) {
  const std::int64_t C = c.n_embd, NH = c.n_head, KV = c.kv_heads(), hs = c.head_size(), G = NH / KV;
  // The Hugging Face query head of stored q head j = r KV + g: g G + r.
  auto hf_head = [&](std::int64_t j) { return (j % KV) * G + j / KV; };
  switch (m.kind) {
    case Kind::copy: {
      const std::int64_t n = count(m.from[0].shape);
      for (std::int64_t i = 0; i < n; ++i) fn(i, 0, i);
      return;
    }
    case Kind::transpose: {
      const std::int64_t R = m.from[0].shape[0], K = m.from[0].shape[1];
      for (std::int64_t o = 0; o < R; ++o)
        for (std::int64_t i = 0; i < K; ++i) fn(i * R + o, 0, o * K + i);
      return;
    }
    case Kind::llama_qkv: {
      const std::int64_t W = c.qkv_width();
      for (std::int64_t col = 0; col < W; ++col) {
        const std::int64_t block = col / hs, d = col % hs;
        int s = 0;
        std::int64_t row = 0;
        if (block < NH) {
          row = hf_head(block) * hs + d;
        } else if (block < NH + KV) {
          s = 1;
          row = (block - NH) * hs + d;
        } else {
          s = 2;
          row = (block - NH - KV) * hs + d;
        }
        for (std::int64_t i = 0; i < C; ++i) fn(i * W + col, s, row * C + i);
      }
      return;
    }
    case Kind::llama_o:
      for (std::int64_t r = 0; r < C; ++r) {
        const std::int64_t in = hf_head(r / hs) * hs + r % hs;
        for (std::int64_t o = 0; o < C; ++o) fn(r * C + o, 0, o * C + in);
      }
      return;
    case Kind::gate_up: {
      const std::int64_t F = c.mlp_hidden();
      for (std::int64_t col = 0; col < 2 * F; ++col)
        for (std::int64_t i = 0; i < C; ++i) fn(i * 2 * F + col, col < F ? 0 : 1, (col % F) * C + i);
      return;
    }
    case Kind::bloom_qkv:
    case Kind::bloom_qkv_bias:
      for (std::int64_t col = 0; col < 3 * C; ++col) {
        const std::int64_t part = col / C, h = (col % C) / hs, row = (h * 3 + part) * hs + col % hs;
        if (m.kind == Kind::bloom_qkv_bias)
          fn(col, 0, row);
        else
          for (std::int64_t i = 0; i < C; ++i) fn(i * 3 * C + col, 0, row * C + i);
      }
      return;
  }
}

// Every parameter of gpt_layout(c) with the Hugging Face tensors it is made of. gpt2: the
// trainer's names are GPT-2's (Conv1D [in, out] weights), so each is its own tensor.
std::map<std::string, Mapping> mappings(const plan::GptShape& c) {
  const std::int64_t C = c.n_embd, V = c.vocab_size, F = c.mlp_hidden(), hs = c.head_size();
  std::map<std::string, Mapping> out;
  if (c.arch == Arch::gpt2) {
    const Layout layout = plan::gpt_layout(c);
    for (const auto& u : layout.units())
      for (const auto& p : u.params) {
        Shape s = p.shape;
        if (p.name == kWte) s[0] = V;
        out[p.name] = {Kind::copy, {{p.name, s}}};
      }
    return out;
  }
  const bool llama = c.arch == Arch::llama;
  const std::string base = llama ? "model." : "transformer.";
  auto one = [&](const std::string& ours, Kind k, const std::string& theirs, Shape s) {
    out[ours] = {k, {{base + theirs, std::move(s)}}};
  };
  // A norm: its weight, and a LayerNorm's bias.
  auto norm = [&](const std::string& ours, const std::string& theirs) {
    one(ours + ".weight", Kind::copy, theirs + ".weight", {C});
    if (!llama) one(ours + ".bias", Kind::copy, theirs + ".bias", {C});
  };
  one(kWte, Kind::copy, llama ? "embed_tokens.weight" : "word_embeddings.weight", {V, C});
  if (!llama) norm("ln_e", "word_embeddings_layernorm");
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string p = fmt::format("h.{}.", l), h = fmt::format("{}.{}.", llama ? "layers" : "h", l);
    norm(p + "ln_1", h + "input_layernorm");
    norm(p + "ln_2", h + "post_attention_layernorm");
    if (llama) {
      const std::string a = base + h + "self_attn.", m = base + h + "mlp.";
      out[p + "attn.c_attn.weight"] = {Kind::llama_qkv,
                                       {{a + "q_proj.weight", {c.n_head * hs, C}},
                                        {a + "k_proj.weight", {c.kv_heads() * hs, C}},
                                        {a + "v_proj.weight", {c.kv_heads() * hs, C}}}};
      out[p + "attn.c_proj.weight"] = {Kind::llama_o, {{a + "o_proj.weight", {C, c.n_head * hs}}}};
      out[p + "mlp.c_fc.weight"] = {Kind::gate_up, {{m + "gate_proj.weight", {F, C}}, {m + "up_proj.weight", {F, C}}}};
      out[p + "mlp.c_proj.weight"] = {Kind::transpose, {{m + "down_proj.weight", {C, F}}}};
    } else {
      const std::string a = h + "self_attention.", m = h + "mlp.";
      one(p + "attn.c_attn.weight", Kind::bloom_qkv, a + "query_key_value.weight", {3 * C, C});
      one(p + "attn.c_attn.bias", Kind::bloom_qkv_bias, a + "query_key_value.bias", {3 * C});
      one(p + "attn.c_proj.weight", Kind::transpose, a + "dense.weight", {C, C});
      one(p + "attn.c_proj.bias", Kind::copy, a + "dense.bias", {C});
      one(p + "mlp.c_fc.weight", Kind::transpose, m + "dense_h_to_4h.weight", {F, C});
      one(p + "mlp.c_fc.bias", Kind::copy, m + "dense_h_to_4h.bias", {F});
      one(p + "mlp.c_proj.weight", Kind::transpose, m + "dense_4h_to_h.weight", {C, F});
      one(p + "mlp.c_proj.bias", Kind::copy, m + "dense_4h_to_h.bias", {C});
    }
  }
  norm("ln_f", llama ? "norm" : "ln_f");
  if (!c.tied_head) out[kLmHead] = {Kind::copy, {{kLmHead, {V, C}}}};
  return out;
}

const char* torch_dtype(DType t) { return t == DType::f32 ? "float32" : (t == DType::bf16 ? "bfloat16" : "float16"); }

// ---------------------------------------------------------------- the checkpoint's shape

// The saved `model` section's value of `key`, as text, or nothing.
std::optional<std::string> saved(const std::string& config_yaml, const char* key, const std::string& where,
                                 std::string_view format) {
  YAML::Node model;
  try {
    model = YAML::Load(config_yaml)["model"];
  } catch (const YAML::Exception& e) {
    ZERO_THROW(fmt::format("export {}: the config saved in {} does not parse ({})", format, where, e.what()));
  }
  if (model && model.IsMap() && model[key] && model[key].IsScalar()) return model[key].as<std::string>();
  return std::nullopt;
}

// n_head / vocab_size / seq_len: the caller's (given > 0), else the checkpoint's saved section.
int saved_int(const std::string& yaml, const char* key, int given, const std::string& where, std::string_view format,
              const char* flag) {
  if (given > 0) return given;
  const std::string how = flag ? fmt::format("pass the model's value with --{}", flag) : "the checkpoint was damaged";
  const auto text = saved(yaml, key, where, format);
  ZERO_CHECK(text, fmt::format("export {}: {} is not in the config saved in {} (section model, key {}); {} "
                               "(zero-gpt checkpoints record it)",
                               format, key, where, key, how));
  long long v = 0;
  try {
    v = YAML::Load(*text).as<long long>();
  } catch (const YAML::Exception&) {
    ZERO_THROW(fmt::format("export {}: the config saved in {} has model.{} = '{}', not an integer; {}", format, where,
                           key, escape_bytes(*text), how));
  }
  ZERO_CHECK(v >= 1 && v <= (1 << 24),
             fmt::format("export {}: the config saved in {} has model.{} = {}, outside [1, 2^24]; the checkpoint "
                         "was damaged or edited{}",
                         format, where, key, v, flag ? fmt::format(": {}", how) : std::string()));
  return static_cast<int>(v);
}

double saved_double(const std::string& yaml, const char* key, const std::string& where, std::string_view format) {
  const auto text = saved(yaml, key, where, format);
  ZERO_CHECK(text, fmt::format("export {}: {} is not in the config saved in {} (section model); a llama model's "
                               "config.json needs it (zero-gpt checkpoints record it)",
                               format, key, where));
  try {
    return YAML::Load(*text).as<double>();
  } catch (const YAML::Exception&) {
    ZERO_THROW(fmt::format("export {}: the config saved in {} has model.{} = '{}', not a number", format, where, key,
                           escape_bytes(*text)));
  }
}

std::map<std::string, const ckpt::ParamMeta*> params_by_name(const ckpt::Metadata& m) {
  std::map<std::string, const ckpt::ParamMeta*> out;
  for (const auto& u : m.units)
    for (const auto& p : u.params) out[p.name] = &p;
  return out;
}

}  // namespace

plan::GptShape checkpoint_shape(const ckpt::ModelReader& r, const ExportOptions& o, std::string_view format) {
  const ckpt::Metadata& m = r.meta();
  const std::string& step_dir = r.dir();
  const auto by_name = params_by_name(m);
  auto has = [&](const std::string& n) { return by_name.count(n) > 0; };
  auto shape = [&](const std::string& n) { return has(n) ? by_name.at(n)->shape : Shape{}; };
  const std::string other = fmt::format(
      "--format {} is for the GPT trainer's models (gpt2, bloom, llama); use "
      "--format safetensors for any model",
      format);
  const Shape wte = shape(kWte);
  ZERO_CHECK(wte.size() == 2,
             fmt::format("export {}: {} holds no 2-D token embedding wte.weight; {}", format, step_dir, other));
  plan::GptShape c;
  c.n_layer = 0;  // counted from the blocks present
  while (has(fmt::format("h.{}.ln_1.weight", c.n_layer))) ++c.n_layer;
  ZERO_CHECK(c.n_layer > 0,
             fmt::format("export {}: {} holds no block (no tensor 'h.0.ln_1.weight'); {}", format, step_dir, other));
  // The architecture by what only it has.
  c.arch = has("wpe.weight") ? Arch::gpt2
                             : (has("ln_e.weight") ? Arch::bloom : (has("h.0.ln_1.bias") ? Arch::gpt2 : Arch::llama));
  // Shapes come from the file: bounded before they become ints and sizes.
  auto dim = [&](std::int64_t v, const char* what) {
    ZERO_CHECK(v >= 1 && v <= (1 << 24), fmt::format("export {}: {} in {} is {}, outside [1, 2^24]; {}", format, what,
                                                     step_dir, v, ckpt::detail::kDamaged));
    return static_cast<int>(v);
  };
  const std::string yaml = m.config_yaml;
  c.n_embd = dim(wte[1], "wte.weight's width");
  const Shape wpe = shape("wpe.weight");
  c.seq_len =
      wpe.size() == 2 ? dim(wpe[0], "wpe.weight's length") : saved_int(yaml, "seq_len", 0, step_dir, format, nullptr);
  c.n_head = saved_int(yaml, "n_head", o.n_head, step_dir, format, "n-head");
  c.vocab_size = saved_int(yaml, "vocab_size", o.vocab_size, step_dir, format, "vocab-size");
  const Shape fc_proj = shape("h.0.mlp.c_proj.weight"), qkv = shape("h.0.attn.c_attn.weight");
  if (fc_proj.size() == 2 && fc_proj[0] != 4 * std::int64_t{c.n_embd})
    c.ffn_hidden = dim(fc_proj[0], "the MLP's width (h.0.mlp.c_proj.weight's rows)");
  c.tied_head = !has(kLmHead);
  if (c.arch == Arch::llama) {
    const std::int64_t hs = c.n_head > 0 && c.n_embd % c.n_head == 0 ? c.n_embd / c.n_head : 0;
    if (hs > 0 && qkv.size() == 2 && qkv[1] % hs == 0 && (qkv[1] / hs - c.n_head) % 2 == 0 && qkv[1] / hs > c.n_head)
      c.n_kv_head = dim((qkv[1] / hs - c.n_head) / 2, "the key/value heads (h.0.attn.c_attn.weight's width)");
    c.norm_eps = saved_double(yaml, "norm_eps", step_dir, format);
    c.rope_theta = saved_double(yaml, "rope_theta", step_dir, format);
  }
  c.validate();
  ZERO_CHECK(c.padded_vocab() == wte[0],
             fmt::format("export {}: vocab_size {} pads to {} rows, but wte.weight has {}; give the vocabulary the "
                         "model was trained with (--vocab-size)",
                         format, c.vocab_size, c.padded_vocab(), wte[0]));

  // Every tensor must be the architecture's, name for name and shape for shape, and nothing else.
  const std::string_view arch = plan::arch_name(c.arch);
  std::set<std::string> expected;
  const Layout layout = plan::gpt_layout(c);
  for (const auto& u : layout.units())
    for (const auto& p : u.params) {
      expected.insert(p.name);
      ZERO_CHECK(has(p.name), fmt::format("export {}: {} has no tensor '{}' of a {} model (n_layer {}); {}", format,
                                          step_dir, p.name, arch, c.n_layer, other));
      ZERO_CHECK(
          shape(p.name) == p.shape,
          fmt::format("export {}: '{}' in {} is {}, a {} model with n_embd {} and n_head {} needs {}", format, p.name,
                      step_dir, shape_text(shape(p.name)), arch, c.n_embd, c.n_head, shape_text(p.shape)));
    }
  for (const auto& [name, p] : by_name)
    ZERO_CHECK(expected.count(name), fmt::format("export {}: {} holds '{}', which a {} model does not have; {}", format,
                                                 step_dir, name, arch, other));
  return c;
}

plan::GptShape gpt2_shape(const ckpt::ModelReader& r, const ExportOptions& o, std::string_view format) {
  const plan::GptShape c = checkpoint_shape(r, o, format);
  ZERO_CHECK(c.arch == Arch::gpt2,
             fmt::format("export {}: {} holds a {} model; this format is GPT-2's (use --format hf or safetensors)",
                         format, r.dir(), plan::arch_name(c.arch)));
  return c;
}

void for_each_param(ckpt::ModelReader& r, const std::function<void(const ckpt::ParamMeta&, const float*)>& fn) {
  const ckpt::Metadata& m = r.meta();
  std::vector<float> master;
  for (std::size_t i = 0; i < m.units.size(); ++i) {
    const auto& u = m.units[i];
    master.resize(static_cast<std::size_t>(u.numel));
    r.read_unit(static_cast<int>(i), master.data());
    for (const auto& p : u.params) fn(p, master.data() + p.offset);
  }
}

void transpose(const float* src, float* dst, std::int64_t rows, std::int64_t cols) {
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j) dst[j * rows + i] = src[i * cols + j];
}

std::string config_json(const plan::GptShape& c, DType dtype) {
  json::Json j;
  switch (c.arch) {
    case Arch::gpt2:
      // gelu_new: the tanh approximation the trainer computes. The trainer uses no dropout; a
      // fine-tuning run in transformers should not add any silently.
      j = {{"architectures", json::Json::array({"GPT2LMHeadModel"})},
           {"model_type", "gpt2"},
           {"activation_function", "gelu_new"},
           {"layer_norm_epsilon", 1e-5},
           {"n_layer", c.n_layer},
           {"n_head", c.n_head},
           {"n_embd", c.n_embd},
           {"n_positions", c.seq_len},
           {"n_ctx", c.seq_len},
           {"attn_pdrop", 0.0},
           {"embd_pdrop", 0.0},
           {"resid_pdrop", 0.0},
           {"scale_attn_weights", true}};
      if (c.mlp_hidden() != 4 * std::int64_t{c.n_embd}) j["n_inner"] = c.mlp_hidden();
      break;
    case Arch::bloom:
      // layer_norm_epsilon: the trainer's LayerNorms.
      j = {{"architectures", json::Json::array({"BloomForCausalLM"})},
           {"model_type", "bloom"},
           {"hidden_size", c.n_embd},
           {"n_layer", c.n_layer},
           {"n_head", c.n_head},
           {"layer_norm_epsilon", 1e-5},
           {"apply_residual_connection_post_layernorm", false},
           {"attention_dropout", 0.0},
           {"hidden_dropout", 0.0},
           {"pretraining_tp", 1},
           {"slow_but_exact", false}};
      break;
    case Arch::llama:
      // rope_theta and rope_scaling as transformers 4 reads them, rope_parameters as 5 does.
      j = {{"architectures", json::Json::array({"LlamaForCausalLM"})},
           {"model_type", "llama"},
           {"hidden_size", c.n_embd},
           {"intermediate_size", c.mlp_hidden()},
           {"num_hidden_layers", c.n_layer},
           {"num_attention_heads", c.n_head},
           {"num_key_value_heads", c.kv_heads()},
           {"head_dim", c.head_size()},
           {"hidden_act", "silu"},
           {"max_position_embeddings", c.seq_len},
           {"rms_norm_eps", c.norm_eps},
           {"rope_theta", c.rope_theta},
           {"rope_scaling", nullptr},
           {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", c.rope_theta}}},
           {"attention_bias", false},
           {"mlp_bias", false},
           {"attention_dropout", 0.0},
           {"pretraining_tp", 1}};
      break;
  }
  j["vocab_size"] = c.vocab_size;
  j["initializer_range"] = 0.02;
  j["tie_word_embeddings"] = c.tied_head;
  j["torch_dtype"] = torch_dtype(dtype);
  if (c.arch == Arch::gpt2 && c.vocab_size == 50257) {  // GPT-2's tokenizer: <|endoftext|> begins and ends
    j["bos_token_id"] = 50256;
    j["eos_token_id"] = 50256;
  }
  return json::dump_pretty(j, "config.json");
}

plan::GptShape export_hf(const std::string& checkpoint, const std::string& out_dir, const ExportOptions& o) {
  ckpt::ModelReader r(ckpt::resolve(checkpoint, o.tag));
  const plan::GptShape c = checkpoint_shape(r, o, "hf");
  ZERO_CHECK(c.arch != Arch::bloom || c.mlp_hidden() == 4 * std::int64_t{c.n_embd},
             fmt::format("export hf: {} holds a bloom model with an MLP {} wide; BloomConfig has no such field (its "
                         "MLP is 4 hidden_size = {} wide)",
                         r.dir(), c.mlp_hidden(), 4 * c.n_embd));
  const auto maps = mappings(c);
  // The Hugging Face tensors in the order the parameters come, then cut into shards as
  // save_pretrained cuts them: a tensor that would take a shard past the limit opens the next.
  std::vector<safetensors::TensorSpec> tensors;
  std::vector<int> shard_of;
  std::uint64_t total = 0, in_shard = 0;
  int shards = 0;
  const Layout layout = plan::gpt_layout(c);
  for (const auto& u : layout.units())
    for (const auto& p : u.params)
      for (const auto& t : maps.at(p.name).from) {
        const std::uint64_t bytes = static_cast<std::uint64_t>(count(t.shape)) * dtype_size(o.dtype);
        if (shards == 0 || (in_shard > 0 && in_shard + bytes > o.max_shard_bytes)) {
          ++shards;
          in_shard = 0;
        }
        in_shard += bytes;
        total += bytes;
        tensors.push_back({t.name, o.dtype, t.shape});
        shard_of.push_back(shards - 1);
      }
  auto file_name = [&](int s) {
    return shards == 1 ? std::string("model.safetensors")
                       : fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards);
  };

  std::error_code ec;
  fs::create_directories(out_dir, ec);
  ZERO_CHECK(!ec, fmt::format("export hf: cannot create '{}': {}", out_dir, ec.message()));
  const std::map<std::string, std::string> meta = {{"format", "pt"},
                                                   {"libzero.step", fmt::format("{}", r.meta().step)}};
  std::unique_ptr<safetensors::Writer> w;
  int open_shard = -1;
  std::size_t next = 0;
  std::vector<std::vector<float>> hf;
  std::vector<std::uint16_t> half;
  for_each_param(r, [&](const ckpt::ParamMeta& p, const float* src) {
    // The file lists tensors in layout order; the checkpoint's units are in the same order when
    // it was written by a gpt_layout, which the name check does not promise.
    const auto it = maps.find(p.name);
    ZERO_CHECK(
        it != maps.end() && next < tensors.size() && tensors[next].name == it->second.from[0].name,
        fmt::format("export hf: '{}' in {} is out of the {} layout's order", p.name, r.dir(), plan::arch_name(c.arch)));
    const Mapping& m = it->second;
    hf.resize(m.from.size());
    for (std::size_t s = 0; s < m.from.size(); ++s) hf[s].assign(static_cast<std::size_t>(count(m.from[s].shape)), 0);
    place(m, c, [&](std::int64_t ours, int s, std::int64_t theirs) {
      hf[static_cast<std::size_t>(s)][static_cast<std::size_t>(theirs)] = src[ours];
    });
    for (const auto& values : hf) {
      if (shard_of[next] != open_shard) {
        if (w) w->finish();
        open_shard = shard_of[next];
        std::vector<safetensors::TensorSpec> mine;
        for (std::size_t i = 0; i < tensors.size(); ++i)
          if (shard_of[i] == open_shard) mine.push_back(tensors[i]);
        w = std::make_unique<safetensors::Writer>((fs::path(out_dir) / file_name(open_shard)).string(), mine, meta);
      }
      if (o.dtype == DType::f32) {
        w->write_next(values.data(), values.size() * sizeof(float));
      } else {
        half.resize(values.size());
        convert(values.data(), DType::f32, half.data(), o.dtype, values.size());
        w->write_next(half.data(), half.size() * sizeof(std::uint16_t));
      }
      ++next;
    }
  });
  ZERO_CHECK(w && next == tensors.size(),
             fmt::format("export hf: {} holds {} of the model's {} tensors", r.dir(), next, tensors.size()));
  w->finish();
  // The index of a sharded export; the other form's file from an earlier export goes, since
  // transformers would read it first.
  const fs::path single = fs::path(out_dir) / "model.safetensors", index = fs::path(out_dir) / kIndex;
  if (shards > 1) {
    json::Json map = json::Json::object();
    std::vector<std::size_t> order(tensors.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](auto a, auto b) { return tensors[a].name < tensors[b].name; });
    for (auto i : order) map[tensors[i].name] = file_name(shard_of[i]);
    json::Json doc = json::Json::object();
    doc["metadata"] = {{"total_size", total}};
    doc["weight_map"] = map;
    ckpt::write_file_atomic(out_dir, kIndex, json::dump_pretty(doc, kIndex));
    fs::remove(single, ec);
  } else {
    fs::remove(index, ec);
  }
  ckpt::write_file_atomic(out_dir, "config.json", config_json(c, o.dtype));
  return c;
}

// ---------------------------------------------------------------- import

struct PretrainedWeights::Source {
  struct File {
    ckpt::Fd fd;
    std::uint64_t data_start = 0;
  };
  struct Tensor {
    int file = 0;
    DType dtype = DType::f32;
    Shape shape;
    std::uint64_t begin = 0, end = 0;
    bool transposed = false;  // an llm.c matrix, stored [shape[1], shape[0]]
  };
  std::vector<File> files;
  std::map<std::string, Tensor> tensors;  // by the name the mapping uses
  std::set<std::string> ignored;          // buffers, a tied lm_head
  // config.json's shape (seq_len unset for bloom and llama), or llm.c's header; and what to
  // call it in messages.
  std::optional<plan::GptShape> config;
  std::string config_name;
  bool llmc = false;
  // bloom and llama: every parameter from its Hugging Face tensors (from config.json's shape);
  // otherwise the files hold the trainer's names.
  std::optional<std::map<std::string, Mapping>> maps;

  void open_llmc(const std::string& path);
  void add_file(const std::string& file, Arch naming, std::map<std::string, std::string>* found);
};

namespace {

bool ends_with(const std::string& s, const char* t) {
  const std::string x(t);
  return s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
}

bool is_buffer(const std::string& name) {
  return ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias") ||
         ends_with(name, "rotary_emb.inv_freq");
}

int config_int(const json::Field& f, const char* key, const char* alt = nullptr) {
  if (f.has(key)) return static_cast<int>(f.at(key).i64(1, 1 << 24));
  if (alt && f.has(alt)) return static_cast<int>(f.at(alt).i64(1, 1 << 24));
  f.at(key);  // throws: names the missing field
  return 0;
}

// A field that is absent or null.
bool unset(const json::Field& f, const char* key) { return !f.has(key) || f.at(key).value().is_null(); }

void check_finite(const std::string& path, const std::string& name, const float* v, std::size_t n, const char* order) {
  // A NaN or an infinity would train on NaN from step 1; the engine would see it only as one
  // unit's values, without the file and its tensor.
  for (std::size_t i = 0; i < n; ++i)
    if (!std::isfinite(v[i]))
      ZERO_THROW(
          fmt::format("model.init_from: tensor '{}' in '{}' holds {} at index {}{}, which is not finite; the "
                      "file is damaged or the weights diverged: export them again from a checkpoint whose "
                      "loss was finite",
                      name, path, v[i], i, order));
}

std::string read_small(const std::string& path) {
  const ckpt::Fd in = ckpt::Fd::open_read(path);  // a regular file only: a FIFO would block
  const std::uint64_t bytes = in.size();
  ZERO_CHECK(bytes <= (64u << 20), fmt::format("model.init_from: '{}' is {} bytes; a JSON file of a model's "
                                               "configuration or index is a few thousand",
                                               path, bytes));
  std::string text(static_cast<std::size_t>(bytes), '\0');
  in.pread_all(text.data(), text.size(), 0);
  return text;
}

// config.json: the architecture and its shape, refusing what the trainer does not compute.
plan::GptShape read_config(const std::string& cj) {
  const json::Json doc = json::parse(read_small(cj), cj);
  const json::Field f(doc, cj, "", "give the config.json of a GPT-2, BLOOM or Llama model");
  std::string type;
  if (f.has("model_type")) {
    type = f.at("model_type").str();
  } else if (f.has("architectures") && f.at("architectures").size() > 0) {
    const std::string a = f.at("architectures")[0].str();
    type =
        a == "LlamaForCausalLM" ? "llama" : (a == "BloomForCausalLM" ? "bloom" : (a == "GPT2LMHeadModel" ? "gpt2" : a));
  } else {
    type = "gpt2";  // GPT-2's configs from before model_type
  }
  plan::GptShape c;
  c.seq_len = 0;
  auto refuse = [&](bool bad, const std::string& what) {
    ZERO_CHECK(!bad, fmt::format("model.init_from: {} says {}, which the trainer does not compute; start from a model "
                                 "without it",
                                 cj, what));
  };
  auto layer_norm_eps = [&](const char* key) {
    // The trainer's LayerNorms use 1e-5 (model.norm_eps is llama's RMSNorm's).
    if (f.has(key)) {
      const double eps = f.at(key).f64();
      refuse(std::abs(eps - 1e-5) > 1e-12, fmt::format("{} = {} (the trainer's LayerNorms use 1e-5)", key, eps));
    }
  };
  if (type == "gpt2") {
    c.arch = Arch::gpt2;
    c.n_layer = config_int(f, "n_layer");
    c.n_head = config_int(f, "n_head");
    c.n_embd = config_int(f, "n_embd");
    c.seq_len = config_int(f, "n_positions", "n_ctx");
    c.vocab_size = config_int(f, "vocab_size");
    if (!unset(f, "n_inner")) c.ffn_hidden = static_cast<int>(f.at("n_inner").i64(1, 1 << 24));
    layer_norm_eps("layer_norm_epsilon");
  } else if (type == "bloom") {
    c.arch = Arch::bloom;
    c.n_layer = config_int(f, "n_layer", "num_hidden_layers");
    c.n_head = config_int(f, "n_head", "num_attention_heads");
    c.n_embd = config_int(f, "hidden_size", "n_embed");
    c.vocab_size = config_int(f, "vocab_size");
    layer_norm_eps("layer_norm_epsilon");
    refuse(
        f.has("apply_residual_connection_post_layernorm") && f.at("apply_residual_connection_post_layernorm").boolean(),
        "apply_residual_connection_post_layernorm = true (the residual taken after the LayerNorm)");
    refuse(f.has("tie_word_embeddings") && !f.at("tie_word_embeddings").boolean(),
           "tie_word_embeddings = false (the trainer's BLOOM ties its head to the embedding)");
    // pretraining_tp with slow_but_exact only sums the same products in slices.
  } else if (type == "llama") {
    c.arch = Arch::llama;
    c.n_layer = config_int(f, "num_hidden_layers");
    c.n_head = config_int(f, "num_attention_heads");
    c.n_embd = config_int(f, "hidden_size");
    c.n_kv_head = unset(f, "num_key_value_heads") ? c.n_head : config_int(f, "num_key_value_heads");
    c.ffn_hidden = config_int(f, "intermediate_size");
    c.vocab_size = config_int(f, "vocab_size");
    c.norm_eps = f.has("rms_norm_eps") ? f.at("rms_norm_eps").f64() : 1e-6;
    c.tied_head = f.has("tie_word_embeddings") && f.at("tie_word_embeddings").boolean();
    if (f.has("hidden_act"))
      refuse(f.at("hidden_act").str() != "silu", fmt::format("hidden_act = \"{}\" (the trainer's SwiGLU uses silu)",
                                                             escape_bytes(f.at("hidden_act").str())));
    for (const char* bias : {"attention_bias", "mlp_bias"})
      refuse(f.has(bias) && f.at(bias).boolean(), fmt::format("{} = true (llama's projections have no biases)", bias));
    if (!unset(f, "head_dim"))
      refuse(f.at("head_dim").i64() * c.n_head != c.n_embd,
             fmt::format("head_dim = {} with {} heads of a {} wide model (the trainer's heads are hidden_size / "
                         "num_attention_heads wide)",
                         f.at("head_dim").i64(), c.n_head, c.n_embd));
    // Rotary positions: transformers 4 spells them rope_theta and rope_scaling, 5 rope_parameters.
    // Only the plain rotation is computed: any scaling (linear, dynamic, yarn, llama3) is refused.
    // pretraining_tp only slices the same products (transformers 5 ignores it), so it is ignored.
    if (!unset(f, "rope_scaling")) refuse(true, fmt::format("rope_scaling = {}", f.at("rope_scaling").value().dump()));
    c.rope_theta = f.has("rope_theta") ? f.at("rope_theta").f64() : 1e4;
    if (!unset(f, "rope_parameters")) {
      const json::Field rp = f.at("rope_parameters");
      for (const auto& k : rp.keys()) {
        if (k == "rope_theta")
          c.rope_theta = rp.at(k).f64();
        else if (k == "rope_type")
          refuse(rp.at(k).str() != "default",
                 fmt::format("rope_parameters.rope_type = \"{}\" (rotary scaling)", escape_bytes(rp.at(k).str())));
        else
          refuse(!rp.at(k).value().is_null(),
                 fmt::format("rope_parameters.{} = {} (rotary scaling)", escape_bytes(k), rp.at(k).value().dump()));
      }
    }
  } else {
    ZERO_THROW(
        fmt::format("model.init_from: {} says model_type '{}'; the trainer computes gpt2, bloom and llama "
                    "(GPT2LMHeadModel, BloomForCausalLM, LlamaForCausalLM)",
                    cj, escape_bytes(type)));
  }
  return c;
}

}  // namespace

void PretrainedWeights::Source::add_file(const std::string& file, Arch naming,
                                         std::map<std::string, std::string>* found) {
  File F;
  F.fd = ckpt::Fd::open_read(file);
  // The format's own checks (header, every entry's fields, offsets that neither overlap nor
  // leave gaps), then the trainer's: a dtype it reads, each name once.
  safetensors::Contents contents = safetensors::read_header(F.fd);  // its errors name the file
  F.data_start = contents.data_start;
  const int index = static_cast<int>(files.size());
  files.push_back(std::move(F));
  for (auto& t : contents.tensors) {
    if (found) (*found)[t.name] = file;
    // The names the mapping uses: GPT-2's without transformer. (the trainer's), BLOOM's and
    // Llama's with it or model. (a base model saved alone has none).
    std::string name = t.name;
    if (naming == Arch::gpt2 && name.rfind("transformer.", 0) == 0) name = name.substr(12);
    const char* base = naming == Arch::llama ? "model." : "transformer.";
    if (naming != Arch::gpt2 && name != kLmHead && name.rfind(base, 0) != 0) name = base + name;
    if (is_buffer(name)) {
      ignored.insert(name);
      continue;
    }
    Tensor x;
    if (t.dtype == "F32")
      x.dtype = DType::f32;
    else if (t.dtype == "BF16")
      x.dtype = DType::bf16;
    else if (t.dtype == "F16")
      x.dtype = DType::f16;
    else
      ZERO_THROW(
          fmt::format("model.init_from: tensor '{}' in '{}' has dtype \"{}\", not F32, BF16 or F16 (the types "
                      "the trainer reads)",
                      escape_bytes(t.name), file, escape_bytes(t.dtype)));
    x.file = index;
    x.shape = std::move(t.shape);
    x.begin = t.begin;
    x.end = t.end;
    ZERO_CHECK(tensors.emplace(name, std::move(x)).second,
               fmt::format("model.init_from: '{}' holds '{}' twice (in two shards, or with and without the "
                           "model's prefix)",
                           file, escape_bytes(name)));
  }
}

PretrainedWeights::PretrainedWeights(const std::string& path) : path_(path), src_(std::make_unique<Source>()) {
  Source& S = *src_;
  std::error_code ec;
  ZERO_CHECK(fs::exists(path, ec),
             fmt::format("model.init_from: '{}' does not exist; give a Hugging Face model directory (config.json "
                         "and model.safetensors or its shards; GPT-2, BLOOM or Llama), a .safetensors file or an "
                         "llm.c checkpoint such as gpt2_124M.bin",
                         path));
  // llm.c's format is told by its magic number; a .bin file without it gets llm.c's error.
  if (!fs::is_directory(path) && (llmc::has_magic(path) || path.ends_with(".bin"))) {
    S.open_llmc(path);
    return;
  }
  if (!fs::is_directory(path)) {
    S.add_file(path, Arch::gpt2, nullptr);
    return;
  }
  const fs::path dir(path);
  const std::string cj = (dir / "config.json").string();
  Arch naming = Arch::gpt2;
  if (fs::exists(cj)) {
    S.config = read_config(cj);
    S.config_name = "config.json";
    naming = S.config->arch;
  }
  const std::string single = (dir / "model.safetensors").string(), index = (dir / kIndex).string();
  if (fs::exists(single)) {
    S.add_file(single, naming, nullptr);
  } else {
    ZERO_CHECK(fs::exists(index),
               fmt::format("model.init_from: '{}' is a directory without model.safetensors or {}; give a Hugging "
                           "Face model directory (zero-ckpt export --format hf writes one) or a .safetensors file",
                           path, kIndex));
    // Shards: every file the index names, each tensor in the file the index says.
    const json::Json doc = json::parse(read_small(index), index);
    const json::Field wm = json::Field(doc, index, "", "give the index save_pretrained wrote").at("weight_map");
    std::map<std::string, std::string> listed;
    std::set<std::string> shard_files;
    for (const auto& name : wm.keys()) {
      const std::string& f = wm.at(name).str();
      // A shard lies beside the index: no path may lead elsewhere.
      ZERO_CHECK(!f.empty() && f.find('/') == std::string::npos && f != "." && f != "..",
                 fmt::format("model.init_from: {} puts '{}' in '{}', not a file name beside it", index,
                             escape_bytes(name), escape_bytes(f)));
      listed[name] = (dir / f).string();
      shard_files.insert((dir / f).string());
    }
    std::map<std::string, std::string> found;
    for (const auto& f : shard_files) S.add_file(f, naming, &found);
    for (const auto& [name, f] : listed) {
      auto it = found.find(name);
      ZERO_CHECK(it != found.end() && it->second == f,
                 fmt::format("model.init_from: {} puts '{}' in '{}', {}", index, escape_bytes(name), f,
                             it == found.end() ? std::string("which does not hold it")
                                               : fmt::format("but it is in '{}'", it->second)));
    }
    for (const auto& [name, f] : found)
      ZERO_CHECK(listed.count(name),
                 fmt::format("model.init_from: '{}' holds '{}', which {} does not list", f, escape_bytes(name), index));
  }
  if (naming != Arch::gpt2) {
    S.maps = mappings(*S.config);
    if (S.config->tied_head && S.tensors.count(kLmHead)) {  // a tied head saved anyway
      S.tensors.erase(kLmHead);
      S.ignored.insert(kLmHead);
    }
  }
}

void PretrainedWeights::Source::open_llmc(const std::string& path) {
  const llmc::Header h = llmc::read_header(path);
  config = h.shape;
  config_name = "the llm.c header's";
  llmc = true;
  File F;
  F.fd = ckpt::Fd::open_read(path);
  F.data_start = llmc::kHeaderBytes;
  files.push_back(std::move(F));
  const std::size_t es = dtype_size(h.dtype());
  for (auto& [name, at] : llmc::placements(h)) {
    Tensor t;
    t.dtype = h.dtype();
    t.shape = at.shape;
    // Only the true vocabulary's rows: the file's padding rows are not read, the trainer's are
    // zeros (see read()), however many each side has.
    if (name == kWte) t.shape[0] = h.shape.vocab_size;
    std::uint64_t n = 1;
    for (auto d : t.shape) n *= static_cast<std::uint64_t>(d);
    t.begin = at.offset * es;
    t.end = t.begin + n * es;
    t.transposed = at.transposed;
    tensors.emplace(name, std::move(t));
  }
}

PretrainedWeights::~PretrainedWeights() = default;
PretrainedWeights::PretrainedWeights(PretrainedWeights&&) noexcept = default;
PretrainedWeights& PretrainedWeights::operator=(PretrainedWeights&&) noexcept = default;

void PretrainedWeights::check(const plan::GptShape& model) const {
  const Source& S = *src_;
  std::vector<std::string> problems;
  if (S.config) {
    const plan::GptShape& c = *S.config;
    const char* source = S.config_name.c_str();
    // Each field under the name the file gives it, with the model key that sets it.
    auto field = [&](const char* name, auto file, auto mine, const char* key) {
      if (file != mine)
        problems.push_back(fmt::format("{} {} = {}, the model has {} = {} (set model.{}: {})", source, name, file, key,
                                       mine, key, file));
    };
    auto yes_no = [](bool b) { return b ? "true" : "false"; };
    if (c.arch != model.arch)
      problems.push_back(fmt::format("{} model_type = {}, the model has arch = {} (set model.arch: {})", source,
                                     plan::arch_name(c.arch), plan::arch_name(model.arch), plan::arch_name(c.arch)));
    switch (c.arch) {
      case Arch::gpt2:
        field(S.llmc ? "num_layers" : "n_layer", c.n_layer, model.n_layer, "n_layer");
        field(S.llmc ? "num_heads" : "n_head", c.n_head, model.n_head, "n_head");
        field(S.llmc ? "channels" : "n_embd", c.n_embd, model.n_embd, "n_embd");
        field(S.llmc ? "max_seq_len" : "n_positions", c.seq_len, model.seq_len, "seq_len");
        if (c.mlp_hidden() != model.mlp_hidden())
          problems.push_back(fmt::format("{} n_inner = {}, the model's MLP is {} wide (set model.ffn_hidden: {})",
                                         source, c.mlp_hidden(), model.mlp_hidden(), c.ffn_hidden));
        break;
      case Arch::bloom:
        field("n_layer", c.n_layer, model.n_layer, "n_layer");
        field("n_head", c.n_head, model.n_head, "n_head");
        field("hidden_size", c.n_embd, model.n_embd, "n_embd");
        if (model.mlp_hidden() != 4 * std::int64_t{model.n_embd})
          problems.push_back(fmt::format("BLOOM's MLP is 4 hidden_size wide, the model's {} (set model.ffn_hidden: 0)",
                                         model.mlp_hidden()));
        break;
      case Arch::llama:
        field("num_hidden_layers", c.n_layer, model.n_layer, "n_layer");
        field("num_attention_heads", c.n_head, model.n_head, "n_head");
        field("hidden_size", c.n_embd, model.n_embd, "n_embd");
        field("num_key_value_heads", c.kv_heads(), model.kv_heads(), "n_kv_head");
        field("intermediate_size", c.mlp_hidden(), model.mlp_hidden(), "ffn_hidden");
        field("rms_norm_eps", c.norm_eps, model.norm_eps, "norm_eps");
        field("rope_theta", c.rope_theta, model.rope_theta, "rope_theta");
        if (c.tied_head != model.tied_head)
          problems.push_back(
              fmt::format("{} tie_word_embeddings = {}, the model has tie_word_embeddings = {} (set "
                          "model.tie_word_embeddings: {})",
                          source, yes_no(c.tied_head), yes_no(model.tied_head), yes_no(c.tied_head)));
        break;
    }
    field("vocab_size", c.vocab_size, model.vocab_size, "vocab_size");
  }
  std::set<std::string> needed;
  if (S.maps) {
    // Hugging Face names: the tensors config.json's model has (its differences from the model
    // to be trained are listed above).
    for (const auto& [param, m] : *S.maps)
      for (const auto& t : m.from) {
        needed.insert(t.name);
        auto it = S.tensors.find(t.name);
        if (it == S.tensors.end())
          problems.push_back(fmt::format("tensor '{}' is missing", t.name));
        else if (it->second.shape != t.shape)
          problems.push_back(fmt::format("tensor '{}' is {}, {} says {}", t.name, shape_text(it->second.shape),
                                         S.config_name, shape_text(t.shape)));
      }
  } else {
    const Layout layout = plan::gpt_layout(model);
    for (const auto& u : layout.units())
      for (const auto& p : u.params) {
        needed.insert(p.name);
        auto it = S.tensors.find(p.name);
        if (it == S.tensors.end()) {
          problems.push_back(fmt::format("tensor '{}' is missing", p.name));
          continue;
        }
        const auto& s = it->second.shape;
        // The embedding and the head: the true vocabulary, or the padded rows of a raw export.
        const bool rows = p.name == kWte || p.name == kLmHead;
        const bool vocab_ok =
            rows && s.size() == 2 && s[1] == p.shape[1] && (s[0] == model.vocab_size || s[0] == p.shape[0]);
        if (s != p.shape && !vocab_ok)
          problems.push_back(
              fmt::format("tensor '{}' is {}, the model needs {}{}", p.name, shape_text(s), shape_text(p.shape),
                          rows ? fmt::format(" (or [{}, {}])", model.vocab_size, p.shape[1]) : std::string()));
      }
  }
  for (const auto& [name, t] : S.tensors)
    if (!needed.count(name) && !(name == kLmHead && model.tied_head && !S.maps))  // a tied head saved anyway
      problems.push_back(fmt::format("tensor '{}' is not part of the model", name));
  if (problems.empty()) return;
  ZERO_THROW(
      fmt::format("model.init_from: '{}' does not fit the model ({} n_layer {}, n_head {}, n_embd {}, seq_len "
                  "{}, vocab_size {}):\n  {}\nset the model section to the weights' shape",
                  path_, plan::arch_name(model.arch), model.n_layer, model.n_head, model.n_embd, model.seq_len,
                  model.vocab_size, fmt::join(problems, "\n  ")));
}

void PretrainedWeights::read(const std::string& name, const Shape& shape, std::span<float> out) const {
  const Source& S = *src_;
  const std::int64_t want = count(shape);
  ZERO_CHECK(static_cast<std::int64_t>(out.size()) == want,
             fmt::format("PretrainedWeights::read: '{}' needs {} values, got room for {}", name, want, out.size()));
  Mapping m;
  plan::GptShape c;
  if (S.maps) {
    auto it = S.maps->find(name);
    ZERO_CHECK(it != S.maps->end(),
               fmt::format("model.init_from: a {} model has no parameter '{}'", plan::arch_name(S.config->arch), name));
    m = it->second;
    c = *S.config;
  } else {
    auto it = S.tensors.find(name);
    ZERO_CHECK(it != S.tensors.end(), fmt::format("model.init_from: '{}' has no tensor '{}'", path_, name));
    const Shape& s = it->second.shape;
    m = it->second.transposed ? Mapping{Kind::transpose, {{name, {s[1], s[0]}}}} : Mapping{Kind::copy, {{name, s}}};
  }
  // The whole parameter from these tensors: the same count, or fewer for the vocabulary's rows
  // (the padding that follows).
  std::int64_t have = 0;
  for (const auto& t : m.from) have += count(t.shape);
  const bool rows = name == kWte || name == kLmHead;
  ZERO_CHECK(have == want || (rows && have < want),
             fmt::format("model.init_from: '{}' is made of {} values of {}, the model needs {} ({})", name, have,
                         m.from[0].name, want, shape_text(shape)));
  std::vector<std::vector<float>> values(m.from.size());
  std::vector<unsigned char> raw;
  for (std::size_t s = 0; s < m.from.size(); ++s) {
    const auto it = S.tensors.find(m.from[s].name);
    ZERO_CHECK(it != S.tensors.end(), fmt::format("model.init_from: '{}' has no tensor '{}'", path_, m.from[s].name));
    const Source::Tensor& t = it->second;
    const Source::File& f = S.files[static_cast<std::size_t>(t.file)];
    const std::size_t n = static_cast<std::size_t>(count(t.shape));
    raw.resize(t.end - t.begin);
    f.fd.pread_all(raw.data(), raw.size(), f.data_start + t.begin);
    values[s].resize(n);
    convert(raw.data(), t.dtype, values[s].data(), DType::f32, n);
    check_finite(f.fd.path(), m.from[s].name, values[s].data(), n,
                 t.transposed ? " (as stored, before llm.c's transpose)" : "");
  }
  std::fill(out.begin(), out.end(), 0.0f);
  place(m, c, [&](std::int64_t ours, int s, std::int64_t theirs) {
    out[static_cast<std::size_t>(ours)] = values[static_cast<std::size_t>(s)][static_cast<std::size_t>(theirs)];
  });
}

}  // namespace zero::hf
