// A streaming safetensors writer.
//
// The format: an 8-byte little-endian header length N, N bytes of JSON mapping each tensor
// name to {"dtype", "shape", "data_offsets": [begin, end]} (plus an optional "__metadata__" map
// of strings), padded with spaces to a multiple of 8, then the raw little-endian tensor bytes
// back to back in data_offsets order. Every size is known up front, so the header is written
// first and each tensor is appended as it is produced: memory stays at one tensor however large
// the file. The file appears under its name only when complete (temporary file, fsync, rename).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/format.hpp"  // ckpt::AtomicFile
#include "zero/dtype.hpp"

namespace zero::safetensors {

struct TensorSpec {
  std::string name;
  DType dtype = DType::f32;
  std::vector<std::int64_t> shape;
};

// "F32", "BF16" or "F16".
const char* dtype_tag(DType t);

// The header (length prefix excluded, padding included) for these tensors, in this order.
std::string header(const std::vector<TensorSpec>& tensors, const std::map<std::string, std::string>& metadata);

class Writer {
 public:
  Writer(const std::string& path, std::vector<TensorSpec> tensors, const std::map<std::string, std::string>& metadata);
  // An unfinished file is removed (ckpt::AtomicFile).
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  // The next tensor's bytes (its dtype, row-major); the size must match its shape.
  void write_next(const void* data, std::size_t bytes);
  // Checks every tensor was written, then fsync and rename into place.
  void finish();

 private:
  std::string path_;
  ckpt::AtomicFile file_;
  std::vector<TensorSpec> tensors_;
  std::size_t next_ = 0;
  std::uint64_t offset_ = 0;  // file offset of the next tensor
};

}  // namespace zero::safetensors
