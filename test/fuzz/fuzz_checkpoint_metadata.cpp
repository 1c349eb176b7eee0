// Fuzz target: a checkpoint's metadata file (zero::ckpt::read_metadata_file).
//
// The input is the metadata payload (JSON). The harness wraps it in a header with correct
// checksums, as a damaged-but-consistent or hostile file would be, so the fuzzer spends its time
// in the strict metadata parser instead of failing the checksum. Every input must end in
// Metadata or a zero::Error.

#include <cstddef>
#include <cstdint>
#include <string>

#include "checkpoint/format.hpp"
#include "fuzz_files.hpp"
#include "zero/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace ck = zero::ckpt;
  static const std::string dir = zero::fuzz::scratch_dir();
  const std::string path = dir + "/" + ck::kMetadataFile;
  ck::FileHeader h;
  h.kind = ck::FileKind::metadata;
  h.payload_bytes = h.index_bytes = size;
  h.index_checksum = ck::checksum(data, size);
  zero::fuzz::write_with_header(path, h, data, size);
  try {
    ck::Metadata m = ck::read_metadata_file(path);
    ck::Metadata::parse(m.to_json(), "fuzz (round trip)");  // what loads must re-serialize loadably
  } catch (const zero::Error&) {
  }
  return 0;
}
