// Fuzz target: the checkpoint shard reader (zero::ckpt::Reader) on one hostile shard.
//
// The metadata is fixed (two units, one rank, AdamW moments); the input is the shard's payload:
// its index followed by the sections. The harness writes the header and records the payload's
// size and index checksum in the metadata, as a shard that belongs to the checkpoint would, so
// the fuzzer reaches the index checks and the section reads. Every input must end in data or
// a zero::Error, without reading outside the file or the caller's buffers.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/format.hpp"
#include "fuzz_files.hpp"
#include "zero/error.hpp"

namespace {
namespace ck = zero::ckpt;

constexpr std::uint64_t kIndexBytes = 32 + 32 * 2;  // index head + one entry per unit

ck::Metadata fixed_metadata() {
  ck::Metadata m;
  m.step = 3;
  m.applied = 3;
  m.optimizer = "AdamW";
  m.moments = 2;
  m.scheduler = "constant";
  m.scheduler_step = 3;
  m.units = {ck::UnitMeta{"embed", 6, 6, {ck::ParamMeta{"wte", {2, 3}, 6, 0}}},
             ck::UnitMeta{"head", 3, 3, {ck::ParamMeta{"bias", {3}, 3, 0}}}};
  m.shards = {ck::ShardMeta{ck::shard_file_name(0), 0, 0}};
  return m;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string dir = zero::fuzz::scratch_dir();
  ck::Metadata m = fixed_metadata();
  ck::FileHeader h;
  h.kind = ck::FileKind::shard;
  h.payload_bytes = size;
  h.index_bytes = std::min<std::uint64_t>(kIndexBytes, size);
  h.index_checksum = ck::checksum(data, static_cast<std::size_t>(h.index_bytes));
  m.shards[0].bytes = ck::kHeaderBytes + size;
  m.shards[0].index_checksum = h.index_checksum;
  const std::string meta_path = dir + "/" + ck::kMetadataFile;
  ::unlink(meta_path.c_str());
  ck::write_metadata_file(meta_path, m);
  zero::fuzz::write_with_header(dir + "/" + m.shards[0].file, h, data, size);
  try {
    ck::Reader r(dir);
    for (int u = 0; u < 2; ++u) {
      const auto n = m.units[static_cast<std::size_t>(u)].numel;
      std::vector<float> master(static_cast<std::size_t>(n)), m1(master.size()), m2(master.size());
      float* all[] = {master.data(), m1.data(), m2.data()};
      float* some[] = {master.data(), nullptr, m2.data()};
      r.read_range(u, 0, n, all);
      r.read_range(u, 1, 1, some);
    }
    r.verify_shard(0);
  } catch (const zero::Error&) {
  }
  return 0;
}
