#include "checkpoint/safetensors.hpp"

#include <set>

#include <fmt/format.h>

#include "checkpoint/json.hpp"
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

Writer::Writer(const std::string& path, std::vector<TensorSpec> tensors, const std::map<std::string, std::string>& metadata)
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

}  // namespace zero::safetensors
