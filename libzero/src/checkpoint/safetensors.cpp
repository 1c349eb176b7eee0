#include "checkpoint/safetensors.hpp"

#include <algorithm>
#include <set>

#include <fmt/format.h>

#include "checkpoint/json.hpp"
#include "runtime/strings.hpp"
#include "zero/error.hpp"

namespace zero::safetensors {

const char* dtype_tag(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
  }
  return "?";
}

static std::uint64_t tensor_bytes(const TensorSpec& t) {
  std::uint64_t n = dtype_size(t.dtype);
  for (auto d : t.shape) {
    ZERO_CHECK(d >= 0, fmt::format("safetensors: tensor '{}' has a negative dimension", t.name));
    n *= static_cast<std::uint64_t>(d);
  }
  return n;
}

std::string header(const std::vector<TensorSpec>& tensors, const std::map<std::string, std::string>& metadata) {
  json::Json h = json::Json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  std::set<std::string> seen;
  std::uint64_t at = 0;
  for (const auto& t : tensors) {
    ZERO_CHECK(!t.name.empty() && t.name != "__metadata__",
               fmt::format("safetensors: tensor name '{}' is empty or reserved", t.name));
    ZERO_CHECK(seen.insert(t.name).second,
               fmt::format("safetensors: two tensors are named '{}'; names must be unique across the model (give "
                           "parameters globally unique names)",
                           t.name));
    std::uint64_t end = at + tensor_bytes(t);
    h[t.name] = {{"dtype", dtype_tag(t.dtype)}, {"shape", t.shape}, {"data_offsets", {at, end}}};
    at = end;
  }
  std::string text = json::dump_compact(h, "safetensors header");
  // The data that follows starts 8-byte aligned (8 + header length).
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

Writer::Writer(const std::string& path, std::vector<TensorSpec> tensors,
               const std::map<std::string, std::string>& metadata)
    : path_(path), file_(path), tensors_(std::move(tensors)) {
  std::string h = header(tensors_, metadata);
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(static_cast<std::uint64_t>(h.size()) >> (8 * i));
  file_.fd().pwrite_all(len, 8, 0);
  file_.fd().pwrite_all(h.data(), h.size(), 8);
  offset_ = 8 + h.size();
}

void Writer::write_next(const void* data, std::size_t bytes) {
  ZERO_CHECK(next_ < tensors_.size(), fmt::format("safetensors: more tensors written than declared for '{}'", path_));
  const TensorSpec& t = tensors_[next_];
  ZERO_CHECK(bytes == tensor_bytes(t),
             fmt::format("safetensors: tensor '{}' needs {} bytes, got {}", t.name, tensor_bytes(t), bytes));
  file_.fd().pwrite_all(data, bytes, offset_);
  offset_ += bytes;
  ++next_;
}

void Writer::finish() {
  ZERO_CHECK(next_ == tensors_.size(),
             fmt::format("safetensors: '{}' finished after {} of {} tensors", path_, next_, tensors_.size()));
  file_.commit();
}

// ---------------------------------------------------------------- reading

namespace {

constexpr std::uint64_t kMaxHeaderBytes = std::uint64_t{100} << 20;  // the safetensors library's limit
const char* kNotSafetensors = "the file is damaged or not a safetensors file (the format's own reader refuses it too)";

[[noreturn]] void refuse(const std::string& file, const std::string& problem) {
  ZERO_THROW(fmt::format("safetensors file '{}': {}; {}", file, problem, kNotSafetensors));
}

std::string span_text(const TensorEntry& t) {
  return fmt::format("'{}' [{}, {})", escape_bytes(t.name), t.begin, t.end);
}

}  // namespace

int dtype_bits(const std::string& dtype) {
  static const std::pair<const char*, int> kBits[] = {
      {"BOOL", 8}, {"U8", 8},   {"I8", 8},    {"F8_E5M2", 8}, {"F8_E4M3", 8}, {"F8_E8M0", 8}, {"I16", 16},
      {"U16", 16}, {"F16", 16}, {"BF16", 16}, {"I32", 32},    {"U32", 32},    {"F32", 32},    {"F64", 64},
      {"I64", 64}, {"U64", 64}, {"F4", 4},    {"F6_E2M3", 6}, {"F6_E3M2", 6}};
  for (const auto& [name, bits] : kBits)
    if (dtype == name) return bits;
  return 0;
}

void check_offsets(std::vector<TensorEntry>& tensors, std::uint64_t data_bytes, const std::string& file) {
  for (const auto& t : tensors)
    if (t.end < t.begin)
      refuse(file, fmt::format("tensor '{}': data_offsets [{}, {}] are out of order (the end lies before the begin)",
                               escape_bytes(t.name), t.begin, t.end));
  std::sort(tensors.begin(), tensors.end(), [](const TensorEntry& a, const TensorEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::uint64_t at = 0;
  const TensorEntry* prev = nullptr;
  for (const auto& t : tensors) {
    if (t.begin < at)
      refuse(file, fmt::format("tensors {} and {} overlap: bytes [{}, {}) belong to both", span_text(*prev),
                               span_text(t), t.begin, std::min(at, t.end)));
    if (t.begin > at)
      refuse(file, prev ? fmt::format("bytes [{}, {}) between tensors {} and {} belong to no tensor", at, t.begin,
                                      span_text(*prev), span_text(t))
                        : fmt::format("the first tensor {} starts at byte {}, not 0", span_text(t), t.begin));
    const int bits = dtype_bits(t.dtype);
    if (bits == 0)
      refuse(file, fmt::format("tensor '{}': dtype \"{}\" is not a safetensors dtype", escape_bytes(t.name),
                               escape_bytes(t.dtype)));
    // In bits, with every product checked: a shape of 2^62 elements overflows nothing.
    std::uint64_t n = static_cast<std::uint64_t>(bits);
    bool fits = true;
    for (auto d : t.shape) {
      const auto ud = static_cast<std::uint64_t>(d);
      if (ud != 0 && n > UINT64_MAX / ud) fits = false;
      n = fits ? n * ud : 0;
    }
    if (!fits || n % 8 != 0 || n / 8 != t.end - t.begin)
      refuse(file, fmt::format("tensor {} holds {} bytes, but its shape {} of {} makes {}", span_text(t),
                               t.end - t.begin, shape_text(t.shape), escape_bytes(t.dtype),
                               fits ? fmt::format("{} bits", n) : std::string("more than 2^64 bits")));
    at = t.end;
    prev = &t;
  }
  if (at != data_bytes)
    refuse(file, at < data_bytes
                     ? fmt::format("{} bytes after the last tensor{} belong to no tensor (the data is {} "
                                   "bytes, the tensors end at {})",
                                   data_bytes - at, prev ? fmt::format(" {}", span_text(*prev)) : std::string(),
                                   data_bytes, at)
                     : fmt::format("tensor {} ends at byte {}, past the end of the data ({} bytes)", span_text(*prev),
                                   at, data_bytes));
}

Contents read_header(const ckpt::Fd& f) {
  const std::string& file = f.path();
  const std::uint64_t size = f.size();
  if (size < 8) refuse(file, fmt::format("it has {} bytes, too few for the 8-byte header length", size));
  unsigned char len[8];
  f.pread_all(len, 8, 0);
  const std::uint64_t n = ckpt::detail::get64(len);
  if (n > size - 8 || n > kMaxHeaderBytes)
    refuse(file, fmt::format("the header length {} does not fit the file ({} bytes) or the format's limit of 100 MiB",
                             n, size));
  std::string text(static_cast<std::size_t>(n), '\0');
  f.pread_all(text.data(), text.size(), 8);
  Contents c;
  c.data_start = 8 + n;
  c.data_bytes = size - c.data_start;
  const json::Json doc = json::parse(text, file + " (safetensors header)");
  const json::Field root(doc, file, "", kNotSafetensors);
  for (const auto& key : root.keys()) {
    const json::Field t = root.at(key);
    if (key == "__metadata__") {
      for (const auto& k : t.keys()) c.metadata[k] = t.at(k).str();
      continue;
    }
    t.expect_keys({"dtype", "shape", "data_offsets"});
    TensorEntry e;
    e.name = key;
    e.dtype = t.at("dtype").str();
    const json::Field sh = t.at("shape");
    for (std::size_t i = 0; i < sh.size(); ++i) e.shape.push_back(sh[i].i64(0));
    const json::Field off = t.at("data_offsets");
    if (off.size() != 2) off.fail("must be [begin, end]");
    e.begin = static_cast<std::uint64_t>(off[0].i64(0));
    e.end = static_cast<std::uint64_t>(off[1].i64(0));
    c.tensors.push_back(std::move(e));
  }
  check_offsets(c.tensors, c.data_bytes, file);
  return c;
}

}  // namespace zero::safetensors
