// llm.c GPT-2 interchange: read karpathy/llm.c's checkpoints (gpt2_124M.bin) to start a run
// (zero-gpt's model.init_from) and write a libzero checkpoint in that format (zero-ckpt export
// --format llmc). The file and what is converted: docs/architecture.md, note llmc-gpt2.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "zero/dtype.hpp"
#include "zero/formats/hf.hpp"
#include "zero/plan/plan.hpp"

namespace zero::llmc {

inline constexpr std::int32_t kMagic = 20240326;
inline constexpr std::int32_t kVersionF32 = 3;   // fp32 parameters
inline constexpr std::int32_t kVersionBf16 = 5;  // bf16 parameters
inline constexpr int kHeaderInts = 256;
inline constexpr std::uint64_t kHeaderBytes = kHeaderInts * sizeof(std::int32_t);

struct Header {
  std::int32_t version = kVersionF32;
  plan::GptShape shape;  // max_seq_len is seq_len; no name
  std::int64_t padded_vocab = 0;

  DType dtype() const { return version == kVersionBf16 ? DType::bf16 : DType::f32; }
  std::uint64_t num_elements() const;  // every parameter, wte with its padded_vocab rows
  std::uint64_t file_bytes() const { return kHeaderBytes + num_elements() * dtype_size(dtype()); }
};

// What the export writes for `shape`: the trainer's padding (a multiple of 128, as llm.c's),
// version 3 for fp32 and 5 for bf16 (fp16 has no llm.c version: throws).
Header header_for(const plan::GptShape& shape, DType dtype);
std::array<std::int32_t, kHeaderInts> encode(const Header& h);
// Checks the magic, the version and the sizes; errors name `path`.
Header decode(const std::array<std::int32_t, kHeaderInts>& ints, const std::string& path);
// The header of the file at `path`, its size checked against it (a truncated file, or one with
// bytes past the last parameter, is refused).
Header read_header(const std::string& path);
// Whether the file at `path` opens with llm.c's model magic (false for a directory, a shorter
// file or any other content).
bool has_magic(const std::string& path);

// Where one parameter of gpt_layout(h.shape) lies in the file.
struct Placement {
  std::vector<std::int64_t> shape;  // the trainer's orientation; wte: [h.padded_vocab, C]
  std::uint64_t offset = 0;         // in elements, after the header
  bool transposed = false;          // stored [shape[1], shape[0]]
};
// Every parameter of gpt_layout(h.shape), by its name there.
std::map<std::string, Placement> placements(const Header& h);

// Writes out_file from a checkpoint of a GPT-2-shaped layout (the checks and options of
// zero::hf::export_hf, GPT-2 only; dtype fp32 or bf16). Returns the exported shape.
plan::GptShape export_gpt2(const std::string& checkpoint, const std::string& out_file,
                           const hf::ExportOptions& opts = {});

}  // namespace zero::llmc
