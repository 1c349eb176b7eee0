// Hugging Face import: PretrainedWeights (zero/formats/hf.hpp) reads a GPT-2, BLOOM or Llama
// directory, a .safetensors file or an llm.c checkpoint for model.init_from.
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
#include "checkpoint/hf_source.hpp"
#include "checkpoint/interop.hpp"
#include "checkpoint/json.hpp"
#include "checkpoint/safetensors.hpp"
#include "runtime/strings.hpp"
#include "zero/error.hpp"
#include "zero/formats/hf.hpp"
#include "zero/formats/llmc_gpt2.hpp"
#include "zero/plan/plan.hpp"

namespace fs = std::filesystem;

namespace zero::hf {

using plan::Arch;

// ---------------------------------------------------------------- import

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

}  // namespace zero::hf
