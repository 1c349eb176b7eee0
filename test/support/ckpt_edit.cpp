// Re-signs checkpoint files after a test edited them, so a test can hand the reader values that
// pass every checksum (what a buggy writer or a hand edit produces) and check what the code
// that uses them does.
//
//   ckpt_edit dump STEP_DIR              prints metadata.ckpt's JSON
//   ckpt_edit write STEP_DIR JSON_FILE   replaces it with JSON_FILE's bytes, header re-signed
//   ckpt_edit shard-step STEP_DIR STEP   sets every shard index's step, re-signs the shards and
//                                        the metadata's index checksums (the metadata's own
//                                        step is the caller's to edit)
// The bytes written are the caller's, unparsed: the reader under test decides what they mean.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "checkpoint/format.hpp"
#include "checkpoint/json.hpp"

using namespace zero;

namespace {

std::string read_payload(const std::string& path) {
  ckpt::Fd f = ckpt::Fd::open_read(path);
  ckpt::FileHeader h = ckpt::read_header(f, ckpt::FileKind::metadata);
  return ckpt::read_index(f, h);
}

void write_signed(const std::string& path, ckpt::FileKind kind, const std::string& index, const std::string& rest) {
  ckpt::FileHeader h;
  h.kind = kind;
  h.index_bytes = index.size();
  h.payload_bytes = index.size() + rest.size();
  h.index_checksum = ckpt::checksum(index.data(), index.size());
  unsigned char head[ckpt::kHeaderBytes];
  ckpt::encode_header(h, head);
  std::remove(path.c_str());
  ckpt::Fd f = ckpt::Fd::create(path);
  f.pwrite_all(head, sizeof head, 0);
  f.pwrite_all(index.data(), index.size(), ckpt::kHeaderBytes);
  f.pwrite_all(rest.data(), rest.size(), ckpt::kHeaderBytes + index.size());
  f.close();
}

int shard_step(const std::string& dir, std::int64_t step) {
  const std::string meta_path = dir + "/" + ckpt::kMetadataFile;
  json::Json meta = json::parse(read_payload(meta_path), meta_path);
  for (auto& s : meta["shards"]) {
    const std::string path = dir + "/" + s["file"].get<std::string>();
    ckpt::Fd f = ckpt::Fd::open_read(path);
    ckpt::FileHeader h = ckpt::read_header(f, ckpt::FileKind::shard);
    std::string index = ckpt::read_index(f, h);
    std::string rest(static_cast<std::size_t>(h.payload_bytes - h.index_bytes), '\0');
    f.pread_all(rest.data(), rest.size(), ckpt::kHeaderBytes + h.index_bytes);
    f.close();
    ckpt::detail::put64(reinterpret_cast<unsigned char*>(index.data()) + 24, static_cast<std::uint64_t>(step));
    write_signed(path, ckpt::FileKind::shard, index, rest);
    s["index_checksum"] = json::hex64(ckpt::checksum(index.data(), index.size()));
  }
  write_signed(meta_path, ckpt::FileKind::metadata, json::dump_pretty(meta, "metadata"), "");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::vector<std::string> a(argv + 1, argv + argc);
    if (a.size() == 2 && a[0] == "dump") {
      std::fputs(read_payload(a[1] + "/" + ckpt::kMetadataFile).c_str(), stdout);
      return 0;
    }
    if (a.size() == 3 && a[0] == "write") {
      ckpt::Fd in = ckpt::Fd::open_read(a[2]);
      std::string text(static_cast<std::size_t>(in.size()), '\0');
      in.pread_all(text.data(), text.size(), 0);
      write_signed(a[1] + "/" + ckpt::kMetadataFile, ckpt::FileKind::metadata, text, "");
      return 0;
    }
    if (a.size() == 3 && a[0] == "shard-step") return shard_step(a[1], std::stoll(a[2]));
    std::fprintf(stderr, "usage: ckpt_edit dump DIR | write DIR JSON_FILE | shard-step DIR STEP\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ckpt_edit: %s\n", e.what());
    return 1;
  }
}
