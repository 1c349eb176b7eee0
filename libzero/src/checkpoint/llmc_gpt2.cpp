// llm.c GPT-2 checkpoints (see zero/formats/llmc_gpt2.hpp).
#include "zero/formats/llmc_gpt2.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "checkpoint/format.hpp"
#include "checkpoint/interop.hpp"
#include "zero/error.hpp"

namespace fs = std::filesystem;

namespace zero::llmc {

namespace {

// llm.c's tensor order (gpt2_build_from_checkpoint's param_sizes): which trainer parameter each
// tensor is, whether it has one copy per layer (all layers' copies stored back to back), and
// whether it is a matrix stored [out, in].
struct Tensor {
  const char* llmc;   // llm.c's name, for messages
  const char* param;  // gpt_layout's name (after "h.<l>." for a per-layer tensor)
  bool per_layer;
  bool transposed;
};
constexpr Tensor kTensors[] = {
    {"wte", "wte.weight", false, false},
    {"wpe", "wpe.weight", false, false},
    {"ln1w", "ln_1.weight", true, false},
    {"ln1b", "ln_1.bias", true, false},
    {"qkvw", "attn.c_attn.weight", true, true},
    {"qkvb", "attn.c_attn.bias", true, false},
    {"attprojw", "attn.c_proj.weight", true, true},
    {"attprojb", "attn.c_proj.bias", true, false},
    {"ln2w", "ln_2.weight", true, false},
    {"ln2b", "ln_2.bias", true, false},
    {"fcw", "mlp.c_fc.weight", true, true},
    {"fcb", "mlp.c_fc.bias", true, false},
    {"fcprojw", "mlp.c_proj.weight", true, true},
    {"fcprojb", "mlp.c_proj.bias", true, false},
    {"lnfw", "ln_f.weight", false, false},
    {"lnfb", "ln_f.bias", false, false},
};

constexpr std::int32_t kShardMagic = 20240520;  // llm.c's token shards, a common mix-up
constexpr const char* kWte = "wte.weight";

std::int64_t numel(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

}  // namespace

std::uint64_t Header::num_elements() const {
  const std::int64_t C = shape.n_embd;
  return static_cast<std::uint64_t>(shape.num_params() + (padded_vocab - shape.padded_vocab()) * C);
}

Header header_for(const plan::GptShape& shape, DType dtype) {
  ZERO_CHECK(dtype != DType::f16,
             "export llmc: llm.c checkpoints hold fp32 (version 3) or bf16 (version 5) "
             "parameters, not fp16; use --dtype fp32 or --dtype bf16");
  shape.validate();
  Header h;
  h.version = dtype == DType::bf16 ? kVersionBf16 : kVersionF32;
  h.shape = shape;
  h.shape.name.clear();
  h.padded_vocab = shape.padded_vocab();
  return h;
}

std::array<std::int32_t, kHeaderInts> encode(const Header& h) {
  std::array<std::int32_t, kHeaderInts> ints{};
  ints[0] = kMagic;
  ints[1] = h.version;
  ints[2] = h.shape.seq_len;
  ints[3] = h.shape.vocab_size;
  ints[4] = h.shape.n_layer;
  ints[5] = h.shape.n_head;
  ints[6] = h.shape.n_embd;
  ints[7] = static_cast<std::int32_t>(h.padded_vocab);
  return ints;
}

Header decode(const std::array<std::int32_t, kHeaderInts>& ints, const std::string& path) {
  ZERO_CHECK(ints[0] != kShardMagic,
             fmt::format("'{}' is an llm.c token shard (magic {}), not a model; give a model checkpoint such as "
                         "gpt2_124M.bin (magic {}), or use the shard as data.train",
                         path, kShardMagic, kMagic));
  ZERO_CHECK(ints[0] == kMagic, fmt::format("'{}' is not an llm.c GPT-2 checkpoint: it starts with {}, not the magic "
                                            "number {}; give a file written by llm.c or zero-ckpt export --format "
                                            "llmc",
                                            path, ints[0], kMagic));
  ZERO_CHECK(ints[1] == kVersionF32 || ints[1] == kVersionBf16,
             fmt::format("'{}' is an llm.c checkpoint of version {}; this build reads versions {} (fp32) and {} "
                         "(bf16), the ones with a padded vocabulary that llm.c writes today: convert the file with a "
                         "current llm.c",
                         path, ints[1], kVersionF32, kVersionBf16));
  Header h;
  h.version = ints[1];
  auto field = [&](int i, const char* name, std::int32_t most) {
    ZERO_CHECK(ints[i] >= 1 && ints[i] <= most,
               fmt::format("'{}': the llm.c header's {} is {}, outside [1, {}]; the file is damaged", path, name,
                           ints[i], most));
    return ints[i];
  };
  h.shape.seq_len = field(2, "max_seq_len", 1 << 20);
  h.shape.vocab_size = field(3, "vocab_size", 1 << 30);
  h.shape.n_layer = field(4, "num_layers", 1 << 16);
  h.shape.n_head = field(5, "num_heads", 1 << 16);
  h.shape.n_embd = field(6, "channels", 1 << 20);
  h.padded_vocab = field(7, "padded_vocab_size", 1 << 30);
  ZERO_CHECK(h.padded_vocab >= h.shape.vocab_size,
             fmt::format("'{}': the llm.c header's padded_vocab_size {} is below its vocab_size {}; the file is "
                         "damaged",
                         path, h.padded_vocab, h.shape.vocab_size));
  ZERO_CHECK(h.shape.n_embd % h.shape.n_head == 0,
             fmt::format("'{}': the llm.c header's channels {} is not a multiple of num_heads {}; the file is damaged",
                         path, h.shape.n_embd, h.shape.n_head));
  return h;
}

Header read_header(const std::string& path) {
  const ckpt::Fd f = ckpt::Fd::open_read(path);
  const std::uint64_t size = f.size();
  std::array<std::int32_t, kHeaderInts> ints{};
  f.pread_all(ints.data(), static_cast<std::size_t>(std::min<std::uint64_t>(size, kHeaderBytes)), 0);
  if (size < kHeaderBytes) {
    decode(ints, path);  // a wrong magic says more than the size
    ZERO_THROW(fmt::format("'{}' is truncated: {} bytes, less than llm.c's {}-byte header", path, size, kHeaderBytes));
  }
  const Header h = decode(ints, path);
  const std::uint64_t want = h.file_bytes();
  ZERO_CHECK(size >= want,
             fmt::format("'{}' is truncated: {} bytes, but its header (version {}, max_seq_len {}, vocab_size {}, "
                         "num_layers {}, num_heads {}, channels {}, padded_vocab_size {}) needs {}; copy or download "
                         "the file again",
                         path, size, h.version, h.shape.seq_len, h.shape.vocab_size, h.shape.n_layer, h.shape.n_head,
                         h.shape.n_embd, h.padded_vocab, want));
  ZERO_CHECK(size == want, fmt::format("'{}' has {} bytes after the parameters its header describes ({} bytes in "
                                       "all); it is not an llm.c GPT-2 checkpoint of that shape",
                                       path, size - want, want));
  return h;
}

bool has_magic(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return false;
  std::ifstream in(path, std::ios::binary);
  std::int32_t magic = 0;
  return in.read(reinterpret_cast<char*>(&magic), sizeof magic) && magic == kMagic;
}

std::map<std::string, Placement> placements(const Header& h) {
  std::map<std::string, std::vector<std::int64_t>> shapes;
  const Layout layout = plan::gpt_layout(h.shape);
  for (const auto& u : layout.units())
    for (const auto& p : u.params) shapes[p.name] = p.shape;
  shapes.at(kWte)[0] = h.padded_vocab;
  std::map<std::string, Placement> out;
  std::uint64_t offset = 0;
  for (const Tensor& t : kTensors)
    for (int l = 0; l < (t.per_layer ? h.shape.n_layer : 1); ++l) {
      const std::string name = t.per_layer ? fmt::format("h.{}.{}", l, t.param) : std::string(t.param);
      const auto it = shapes.find(name);
      ZERO_CHECK(it != shapes.end(),
                 fmt::format("llm.c's tensor {} has no parameter '{}' in the trainer's layout; "
                             "libzero's llm.c tensor table and plan::gpt_layout disagree (a bug in libzero)",
                             t.llmc, name));
      out[name] = Placement{it->second, offset, t.transposed};
      offset += static_cast<std::uint64_t>(numel(it->second));
    }
  ZERO_CHECK(out.size() == shapes.size() && offset == h.num_elements(),
             "libzero's llm.c tensor table does not cover plan::gpt_layout (a bug in libzero: the table needs its new "
             "tensors)");
  return out;
}

plan::GptShape export_gpt2(const std::string& checkpoint, const std::string& out_file, const hf::ExportOptions& o) {
  ckpt::ModelReader r(ckpt::resolve(checkpoint, o.tag));
  const plan::GptShape c = hf::gpt2_shape(r, o, "llmc");
  const Header h = header_for(c, o.dtype);
  const std::map<std::string, Placement> where = placements(h);
  const std::size_t es = dtype_size(h.dtype());

  ckpt::AtomicFile file(out_file);
  const auto ints = encode(h);
  file.fd().pwrite_all(ints.data(), kHeaderBytes, 0);
  std::vector<float> values;
  std::vector<std::uint16_t> half;
  std::size_t written = 0;
  hf::for_each_param(r, [&](const ckpt::ParamMeta& p, const float* src) {
    const Placement& at = where.at(p.name);  // gpt2_shape checked every name and shape
    values.resize(static_cast<std::size_t>(p.numel));
    if (at.transposed)
      hf::transpose(src, values.data(), at.shape[0], at.shape[1]);
    else
      std::copy(src, src + p.numel, values.begin());
    // llm.c's padding rows are zeros that nothing reads; whatever the checkpoint holds there
    // (zeros too, unless a loop wrote them) stays behind.
    if (p.name == kWte)
      std::fill(values.begin() + static_cast<std::ptrdiff_t>(c.vocab_size) * c.n_embd, values.end(), 0.0f);
    const void* bytes = values.data();
    if (h.dtype() != DType::f32) {
      half.resize(values.size());
      convert(values.data(), DType::f32, half.data(), h.dtype(), values.size());
      bytes = half.data();
    }
    file.fd().pwrite_all(bytes, values.size() * es, kHeaderBytes + at.offset * es);
    ++written;
  });
  ZERO_CHECK(written == where.size(),
             fmt::format("export llmc: {} holds {} of GPT-2's {} tensors", r.dir(), written, where.size()));
  file.commit();
  return c;
}

}  // namespace zero::llmc
