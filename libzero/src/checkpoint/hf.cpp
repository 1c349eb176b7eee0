// Hugging Face GPT-2 export and import (see zero/formats/hf_gpt2.hpp).
#include "zero/formats/hf_gpt2.hpp"

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
#include "checkpoint/gpt2_interop.hpp"
#include "checkpoint/json.hpp"
#include "checkpoint/safetensors.hpp"
#include "zero/formats/llmc_gpt2.hpp"
#include "runtime/strings.hpp"
#include "zero/error.hpp"
#include "zero/plan/plan.hpp"

namespace fs = std::filesystem;

namespace zero::hf {

namespace {

constexpr const char* kWte = "wte.weight";

// n_head / vocab_size: the caller's, else the checkpoint's saved `model` section.
int model_key(const std::string& config_yaml, const char* key, int given, const std::string& where,
              std::string_view format) {
  if (given > 0) return given;
  YAML::Node model;
  try {
    model = YAML::Load(config_yaml)["model"];
  } catch (const YAML::Exception& e) {
    ZERO_THROW(fmt::format("export {}: the config saved in {} does not parse ({})", format, where, e.what()));
  }
  if (model && model.IsMap() && model[key] && model[key].IsScalar()) {
    try {
      const long long v = model[key].as<long long>();
      ZERO_CHECK(v >= 1 && v <= (1 << 24),
                 fmt::format("export {}: the config saved in {} has model.{} = {}, outside [1, 2^24]; the checkpoint "
                             "was damaged or edited: pass the model's value with --{}",
                             format, where, key, v, key == std::string("n_head") ? "n-head" : "vocab-size"));
      return static_cast<int>(v);
    } catch (const YAML::Exception&) {
    }
  }
  ZERO_THROW(
      fmt::format("export {}: {} is not in the config saved in {} (section model, key {}); pass it with "
                  "--{} (zero-gpt checkpoints record it)",
                  format, key, where, key, key == std::string("n_head") ? "n-head" : "vocab-size"));
}

std::map<std::string, const ckpt::ParamMeta*> params_by_name(const ckpt::Metadata& m) {
  std::map<std::string, const ckpt::ParamMeta*> out;
  for (const auto& u : m.units)
    for (const auto& p : u.params) out[p.name] = &p;
  return out;
}

}  // namespace

plan::GptShape gpt2_shape(const ckpt::ModelReader& r, const ExportOptions& o, std::string_view format) {
  const ckpt::Metadata& m = r.meta();
  const std::string& step_dir = r.dir();
  const auto by_name = params_by_name(m);
  const auto wte = by_name.find(kWte), wpe = by_name.find("wpe.weight");
  ZERO_CHECK(
      wte != by_name.end() && wpe != by_name.end() && wte->second->shape.size() == 2 && wpe->second->shape.size() == 2,
      fmt::format("export {}: {} holds no GPT-2 embeddings (2-D wte.weight and wpe.weight); --format {} is for "
                  "GPT-2-shaped models, use --format safetensors for any model",
                  format, step_dir, format));
  plan::GptShape c;
  c.n_layer = 0;  // counted from the blocks present
  while (by_name.count(fmt::format("h.{}.ln_1.weight", c.n_layer))) ++c.n_layer;
  ZERO_CHECK(c.n_layer > 0, fmt::format("export {}: {} holds no GPT-2 block (no tensor 'h.0.ln_1.weight'); --format {} "
                                        "is for GPT-2-shaped models, use --format safetensors for any model",
                                        format, step_dir, format));
  // Shapes come from the file: bounded before they become ints and sizes.
  auto dim = [&](std::int64_t v, const char* what) {
    ZERO_CHECK(v <= (1 << 24), fmt::format("export {}: {} in {} is {}, more than 2^24; {}", format, what, step_dir, v,
                                           ckpt::detail::kDamaged));
    return static_cast<int>(v);
  };
  c.n_embd = dim(wte->second->shape[1], "wte.weight's width");
  c.seq_len = dim(wpe->second->shape[0], "wpe.weight's length");
  c.n_head = model_key(m.config_yaml, "n_head", o.n_head, step_dir, format);
  c.vocab_size = model_key(m.config_yaml, "vocab_size", o.vocab_size, step_dir, format);
  c.validate();
  ZERO_CHECK(c.padded_vocab() == wte->second->shape[0],
             fmt::format("export {}: vocab_size {} pads to {} rows, but wte.weight has {}; give the vocabulary the "
                         "model was trained with (--vocab-size)",
                         format, c.vocab_size, c.padded_vocab(), wte->second->shape[0]));

  // Every tensor must be GPT-2's, name for name and shape for shape, and nothing else.
  std::set<std::string> expected;
  const Layout layout = plan::gpt_layout(c);
  for (const auto& u : layout.units())
    for (const auto& p : u.params) {
      expected.insert(p.name);
      auto it = by_name.find(p.name);
      ZERO_CHECK(it != by_name.end(),
                 fmt::format("export {}: {} has no tensor '{}' of GPT-2 (n_layer {}); use --format "
                             "safetensors for other models",
                             format, step_dir, p.name, c.n_layer));
      ZERO_CHECK(it->second->shape == p.shape,
                 fmt::format("export {}: '{}' in {} is {}, GPT-2 with n_embd {} needs {}", format, p.name, step_dir,
                             shape_text(it->second->shape), c.n_embd, shape_text(p.shape)));
    }
  for (const auto& [name, p] : by_name)
    ZERO_CHECK(expected.count(name), fmt::format("export {}: {} holds '{}', which GPT-2 does not have; use --format "
                                                 "safetensors for other models",
                                                 format, step_dir, name));
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
  json::Json j = json::Json::object();
  j["architectures"] = {"GPT2LMHeadModel"};
  j["model_type"] = "gpt2";
  j["activation_function"] = "gelu_new";  // the tanh approximation the trainer computes
  j["layer_norm_epsilon"] = 1e-5;
  j["n_layer"] = c.n_layer;
  j["n_head"] = c.n_head;
  j["n_embd"] = c.n_embd;
  j["n_positions"] = c.seq_len;
  j["n_ctx"] = c.seq_len;
  j["vocab_size"] = c.vocab_size;
  j["initializer_range"] = 0.02;
  // The trainer uses no dropout; a fine-tuning run in transformers should not add any silently.
  j["attn_pdrop"] = 0.0;
  j["embd_pdrop"] = 0.0;
  j["resid_pdrop"] = 0.0;
  j["tie_word_embeddings"] = true;
  j["scale_attn_weights"] = true;
  j["torch_dtype"] = dtype == DType::f32 ? "float32" : (dtype == DType::bf16 ? "bfloat16" : "float16");
  if (c.vocab_size == 50257) {  // GPT-2's tokenizer: <|endoftext|> begins and ends
    j["bos_token_id"] = 50256;
    j["eos_token_id"] = 50256;
  }
  return json::dump_pretty(j, "config.json");
}

plan::GptShape export_gpt2(const std::string& checkpoint, const std::string& out_dir, const ExportOptions& o) {
  ckpt::ModelReader r(ckpt::resolve(checkpoint, o.tag));
  const plan::GptShape c = gpt2_shape(r, o, "hf");
  std::vector<safetensors::TensorSpec> tensors;
  const Layout layout = plan::gpt_layout(c);
  for (const auto& u : layout.units())
    for (const auto& p : u.params) {
      std::vector<std::int64_t> s = p.shape;
      if (p.name == kWte) s[0] = c.vocab_size;  // the padding rows stay behind
      tensors.push_back({p.name, o.dtype, s});
    }

  std::error_code ec;
  fs::create_directories(out_dir, ec);
  ZERO_CHECK(!ec, fmt::format("export hf: cannot create '{}': {}", out_dir, ec.message()));
  const std::map<std::string, std::string> meta = {{"format", "pt"},
                                                   {"libzero.step", fmt::format("{}", r.meta().step)}};
  safetensors::Writer w((fs::path(out_dir) / "model.safetensors").string(), tensors, meta);
  std::vector<std::uint16_t> half;
  std::size_t next = 0;
  for_each_param(r, [&](const ckpt::ParamMeta& p, const float* src) {
    // The file lists tensors in layout order; the checkpoint's units are in the same order
    // when it was written by a gpt_layout, which the name check does not promise.
    ZERO_CHECK(next < tensors.size() && tensors[next].name == p.name,
               fmt::format("export hf: '{}' in {} is out of GPT-2's order", p.name, r.dir()));
    std::size_t n = 1;
    for (auto d : tensors[next].shape) n *= static_cast<std::size_t>(d);
    if (o.dtype == DType::f32) {
      w.write_next(src, n * sizeof(float));
    } else {
      half.resize(n);
      convert(src, DType::f32, half.data(), o.dtype, n);
      w.write_next(half.data(), n * sizeof(std::uint16_t));
    }
    ++next;
  });
  w.finish();
  ckpt::write_file_atomic(out_dir, "config.json", config_json(c, o.dtype));
  return c;
}

// ---------------------------------------------------------------- import

struct Gpt2Weights::File {
  ckpt::Fd fd;
  std::uint64_t data_start = 0;
  struct Tensor {
    DType dtype = DType::f32;
    std::vector<std::int64_t> shape;
    std::uint64_t begin = 0, end = 0;
    bool transposed = false;  // an llm.c matrix, stored [shape[1], shape[0]]
  };
  std::map<std::string, Tensor> tensors;  // by layout name (prefix removed)
  std::vector<std::string> skipped;       // tied lm_head, attention-mask buffers
};

namespace {

bool is_buffer(const std::string& name) {
  auto ends = [&](const char* s) {
    const std::string t(s);
    return name.size() >= t.size() && name.compare(name.size() - t.size(), t.size(), t) == 0;
  };
  return ends(".attn.bias") || ends(".attn.masked_bias");
}

int config_int(const json::Field& f, const char* key, const char* alt = nullptr) {
  if (f.has(key)) return static_cast<int>(f.at(key).i64(1, 1 << 30));
  if (alt && f.has(alt)) return static_cast<int>(f.at(alt).i64(1, 1 << 30));
  f.at(key);  // throws: names the missing field
  return 0;
}

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

}  // namespace

Gpt2Weights::Gpt2Weights(const std::string& path) : path_(path), file_(std::make_unique<File>()) {
  std::error_code ec;
  ZERO_CHECK(
      fs::exists(path, ec),
      fmt::format("model.init_from: '{}' does not exist; give a Hugging Face GPT-2 directory (model.safetensors, "
                  "config.json), a .safetensors file or an llm.c checkpoint such as gpt2_124M.bin",
                  path));
  // llm.c's format is told by its magic number; a .bin file without it gets llm.c's error.
  if (!fs::is_directory(path) && (llmc::has_magic(path) || path.ends_with(".bin"))) {
    open_llmc();
    return;
  }
  std::string file = path;
  if (fs::is_directory(path)) {
    file = (fs::path(path) / "model.safetensors").string();
    ZERO_CHECK(fs::exists(file),
               fmt::format("model.init_from: '{}' is a directory without model.safetensors; give a Hugging Face GPT-2 "
                           "model directory (zero-ckpt export --format hf writes one) or a .safetensors file",
                           path));
    const std::string cj = (fs::path(path) / "config.json").string();
    if (fs::exists(cj)) {
      const ckpt::Fd in = ckpt::Fd::open_read(cj);  // a regular file only: a FIFO would block
      const std::uint64_t bytes = in.size();
      ZERO_CHECK(bytes <= (1u << 20),
                 fmt::format("model.init_from: '{}' is {} bytes; a config.json is a few", cj, bytes));
      std::string text(static_cast<std::size_t>(bytes), '\0');
      in.pread_all(text.data(), text.size(), 0);
      const json::Json doc = json::parse(text, cj);
      const json::Field f(doc, cj, "", "give the config.json of a GPT-2 model");
      if (f.has("model_type"))
        ZERO_CHECK(f.at("model_type").str() == "gpt2",
                   fmt::format("model.init_from: {} says model_type '{}'; only GPT-2 weights (model_type gpt2) load "
                               "into this model",
                               cj, escape_bytes(f.at("model_type").str())));
      plan::GptShape c;
      c.n_layer = config_int(f, "n_layer");
      c.n_head = config_int(f, "n_head");
      c.n_embd = config_int(f, "n_embd");
      c.seq_len = config_int(f, "n_positions", "n_ctx");
      c.vocab_size = config_int(f, "vocab_size");
      config_ = c;
    }
  }
  File& F = *file_;
  F.fd = ckpt::Fd::open_read(file);
  // The format's own checks (header, every entry's fields, offsets that neither overlap nor
  // leave gaps), then the trainer's: a dtype it reads, each name once.
  safetensors::Contents contents = safetensors::read_header(F.fd);  // its errors name the file
  F.data_start = contents.data_start;
  for (auto& t : contents.tensors) {
    std::string name = t.name;
    if (name.rfind("transformer.", 0) == 0) name = name.substr(12);
    if (name == "lm_head.weight" || is_buffer(name)) {
      F.skipped.push_back(t.name);
      continue;
    }
    File::Tensor x;
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
    x.shape = std::move(t.shape);
    x.begin = t.begin;
    x.end = t.end;
    ZERO_CHECK(
        F.tensors.emplace(name, std::move(x)).second,
        fmt::format("model.init_from: '{}' holds '{}' twice (with and without the transformer. prefix)", file, name));
  }
}

void Gpt2Weights::open_llmc() {
  const llmc::Header h = llmc::read_header(path_);
  config_ = h.shape;
  llmc_ = true;
  File& F = *file_;
  F.fd = ckpt::Fd::open_read(path_);
  F.data_start = llmc::kHeaderBytes;
  const std::size_t es = dtype_size(h.dtype());
  for (auto& [name, at] : llmc::placements(h)) {
    File::Tensor t;
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
    F.tensors.emplace(name, std::move(t));
  }
}

Gpt2Weights::~Gpt2Weights() = default;
Gpt2Weights::Gpt2Weights(Gpt2Weights&&) noexcept = default;
Gpt2Weights& Gpt2Weights::operator=(Gpt2Weights&&) noexcept = default;

void Gpt2Weights::check(const plan::GptShape& model) const {
  std::vector<std::string> problems;
  if (config_) {
    const plan::GptShape& c = *config_;
    // Each field under the name the file gives it.
    const char* source = llmc_ ? "the llm.c header's" : "config.json";
    auto field = [&](const char* hf_name, const char* llmc_name, int file, int mine, const char* key) {
      if (file != mine)
        problems.push_back(fmt::format("{} {} = {}, the model has {} = {} (set model.{}: {})", source,
                                       llmc_ ? llmc_name : hf_name, file, key, mine, key, file));
    };
    field("n_layer", "num_layers", c.n_layer, model.n_layer, "n_layer");
    field("n_head", "num_heads", c.n_head, model.n_head, "n_head");
    field("n_embd", "channels", c.n_embd, model.n_embd, "n_embd");
    field("n_positions", "max_seq_len", c.seq_len, model.seq_len, "seq_len");
    field("vocab_size", "vocab_size", c.vocab_size, model.vocab_size, "vocab_size");
  }
  const Layout want = plan::gpt_layout(model);
  std::set<std::string> needed;
  for (const auto& u : want.units())
    for (const auto& p : u.params) {
      needed.insert(p.name);
      auto it = file_->tensors.find(p.name);
      if (it == file_->tensors.end()) {
        problems.push_back(fmt::format("tensor '{}' is missing", p.name));
        continue;
      }
      const auto& s = it->second.shape;
      // wte: the true vocabulary, or the padded rows of a raw export.
      const bool wte_ok =
          p.name == kWte && s.size() == 2 && s[1] == p.shape[1] && (s[0] == model.vocab_size || s[0] == p.shape[0]);
      if (s != p.shape && !wte_ok)
        problems.push_back(
            fmt::format("tensor '{}' is {}, the model needs {}{}", p.name, shape_text(s), shape_text(p.shape),
                        p.name == kWte ? fmt::format(" (or [{}, {}])", model.vocab_size, p.shape[1]) : std::string()));
    }
  for (const auto& [name, t] : file_->tensors)
    if (!needed.count(name)) problems.push_back(fmt::format("tensor '{}' is not part of the model", name));
  if (problems.empty()) return;
  ZERO_THROW(fmt::format(
      "model.init_from: '{}' does not fit the model (n_layer {}, n_head {}, n_embd {}, seq_len {}, "
      "vocab_size {}):\n  {}\nset the model section to the weights' shape",
      path_, model.n_layer, model.n_head, model.n_embd, model.seq_len, model.vocab_size, fmt::join(problems, "\n  ")));
}

void Gpt2Weights::read(const std::string& name, const std::vector<std::int64_t>& shape, std::span<float> out) const {
  auto it = file_->tensors.find(name);
  ZERO_CHECK(it != file_->tensors.end(), fmt::format("model.init_from: '{}' has no tensor '{}'", path_, name));
  const File::Tensor& t = it->second;
  std::size_t want = 1;
  for (auto d : shape) want *= static_cast<std::size_t>(d);
  ZERO_CHECK(out.size() == want,
             fmt::format("Gpt2Weights::read: '{}' needs {} values, got room for {}", name, want, out.size()));
  std::size_t have = 1;
  for (auto d : t.shape) have *= static_cast<std::size_t>(d);
  // Fewer elements only for wte with the true vocabulary: the rows that follow are padding.
  ZERO_CHECK(have <= want && (have == want || name == kWte),
             fmt::format("model.init_from: tensor '{}' is {}, the model needs {}", name, shape_text(t.shape),
                         shape_text(shape)));
  std::vector<unsigned char> raw(t.end - t.begin);
  file_->fd.pread_all(raw.data(), raw.size(), file_->data_start + t.begin);
  if (t.transposed) {
    std::vector<float> stored(have);
    convert(raw.data(), t.dtype, stored.data(), DType::f32, have);
    check_finite(path_, name, stored.data(), have, " (as stored, before llm.c's transpose)");
    transpose(stored.data(), out.data(), t.shape[1], t.shape[0]);
    return;
  }
  convert(raw.data(), t.dtype, out.data(), DType::f32, have);
  check_finite(path_, name, out.data(), have, "");
  std::fill(out.begin() + static_cast<std::ptrdiff_t>(have), out.end(), 0.0f);
}

}  // namespace zero::hf
