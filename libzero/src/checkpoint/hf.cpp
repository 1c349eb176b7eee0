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
#include "checkpoint/hf_mapping.hpp"
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

namespace {

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

}  // namespace zero::hf
