// A streaming safetensors writer, and the checks a reader of the format makes.
//
// The format: an 8-byte little-endian header length N, N bytes of JSON mapping each tensor
// name to {"dtype", "shape", "data_offsets": [begin, end]} (plus an optional "__metadata__" map
// of strings), padded with spaces to a multiple of 8, then the raw little-endian tensor bytes
// back to back in data_offsets order. Every size is known up front, so the header is written
// first and each tensor is appended as it is produced: memory stays at one tensor however large
// the file. The file appears under its name only when complete (temporary file, fsync, rename).
//
// A file read back is held to what the format's own reader (the safetensors library) accepts:
// sorted by data_offsets, the tensors lie back to back from byte 0 of the data to its end, each
// as many bytes as its shape and dtype make. Anything else (two tensors sharing bytes, an end
// before its begin, a gap, bytes after the last tensor) is an error naming the tensors: a
// reader that accepted overlapping tensors would hand out one tensor's bytes as another's.
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

// One tensor as a file's header describes it.
struct TensorEntry {
  std::string name;
  std::string dtype;  // as the file spells it: "F32", "BF16", "I64", ...
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;  // data_offsets: bytes from the start of the data
};
struct Contents {
  std::uint64_t data_start = 0;                 // 8 + the header's length: where tensor data begins
  std::uint64_t data_bytes = 0;                 // the bytes after the header
  std::vector<TensorEntry> tensors;             // sorted by data_offsets
  std::map<std::string, std::string> metadata;  // "__metadata__"
};

// The element size in bits of a safetensors dtype ("F32": 32, "F4": 4), or 0 when unknown.
int dtype_bits(const std::string& dtype);

// Sorts `tensors` by data_offsets and refuses what the format's reader refuses: an end before
// its begin, two tensors sharing bytes, a gap before or between tensors, bytes after the last,
// a byte count other than the shape and dtype make, an unknown dtype. `data_bytes`: the data
// after the header. Errors name `file` and the tensors concerned.
void check_offsets(std::vector<TensorEntry>& tensors, std::uint64_t data_bytes, const std::string& file);

// Reads and checks the header of the safetensors file open as `f` (header length, JSON, every
// entry's fields, check_offsets); the tensors' data is left in the file.
Contents read_header(const ckpt::Fd& f);

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
