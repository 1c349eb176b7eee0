// qgZ's error-feedback files (see checkpoint/format.hpp).
#include <fmt/format.h>

#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/format.hpp"
#include "checkpoint/json.hpp"
#include "zero/error.hpp"

namespace zero::ckpt {

namespace {

std::string lengths_text(const std::vector<std::size_t>& n) {
  std::string s;
  for (std::size_t v : n) {
    if (!s.empty()) s += ' ';
    s += std::to_string(v);
  }
  return s;
}

}  // namespace

void write_feedback_file(const std::string& path, const std::string& layout,
                         const std::vector<const std::vector<float>*>& arrays) {
  std::vector<std::size_t> lengths;
  std::string data;
  for (const auto* a : arrays) {
    lengths.push_back(a->size());
    data.append(reinterpret_cast<const char*>(a->data()), a->size() * sizeof(float));
  }
  const std::string index = fmt::format("layout: {}\narrays: {}\ndata_checksum: {}\n", layout, lengths_text(lengths),
                                        json::hex64(checksum(data.data(), data.size())));
  write_small_file(path, FileKind::feedback, index, data);
}

std::string read_feedback_file(const std::string& path, const std::string& layout,
                               const std::vector<std::vector<float>*>& arrays) {
  Fd f = Fd::open_read(path);
  const FileHeader h = read_header(f, FileKind::feedback);
  if (h.index_bytes > 65536) detail::file_fail(path, "header.index_bytes", "is larger than an error-feedback index");
  const std::string index = read_index(f, h);
  std::istringstream in(index);
  std::string line_layout, line_arrays, line_sum;
  std::getline(in, line_layout);
  std::getline(in, line_arrays);
  std::getline(in, line_sum);
  auto field = [&](const std::string& line, const char* name) {
    const std::string prefix = std::string(name) + ": ";
    if (line.rfind(prefix, 0) != 0) detail::file_fail(path, name, "is missing from the index");
    return line.substr(prefix.size());
  };
  const std::string saved_layout = field(line_layout, "layout");
  const std::string saved_lengths = field(line_arrays, "arrays");
  const std::string sum = field(line_sum, "data_checksum");
  if (saved_layout != layout) return fmt::format("saved for {}, this run is {}", saved_layout, layout);
  std::vector<std::size_t> lengths;
  std::uint64_t bytes = 0;
  for (const auto* a : arrays) {
    lengths.push_back(a->size());
    bytes += a->size() * sizeof(float);
  }
  if (saved_lengths != lengths_text(lengths))
    return "its buffers have other lengths than this model's (another layout of units)";
  if (h.payload_bytes - h.index_bytes != bytes)
    detail::file_fail(path, "header.payload_bytes", fmt::format("does not hold the {} bytes the index lists", bytes));
  std::string data(static_cast<std::size_t>(bytes), '\0');
  f.pread_all(data.data(), data.size(), kHeaderBytes + h.index_bytes);
  if (json::hex64(checksum(data.data(), data.size())) != sum)
    detail::file_fail(path, "data_checksum", "does not match the data");
  std::size_t at = 0;
  for (auto* a : arrays) {
    std::memcpy(a->data(), data.data() + at, a->size() * sizeof(float));
    at += a->size() * sizeof(float);
  }
  return {};
}

}  // namespace zero::ckpt
