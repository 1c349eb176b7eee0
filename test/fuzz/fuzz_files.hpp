// Files for the checkpoint fuzz targets: a private scratch directory per process (libFuzzer
// -jobs and the replay driver may run side by side) and a writer that puts a header before the
// fuzzer's bytes.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "checkpoint/format.hpp"

namespace zero::fuzz {

inline std::string scratch_dir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string t = (tmp && *tmp ? std::string(tmp) : std::string("/tmp")) + "/zero_fuzz_XXXXXX";
  if (!::mkdtemp(t.data())) std::abort();
  return t;
}

inline void write_with_header(const std::string& path, const ckpt::FileHeader& h, const void* data, std::size_t size) {
  ::unlink(path.c_str());
  unsigned char head[ckpt::kHeaderBytes];
  ckpt::encode_header(h, head);
  ckpt::Fd f = ckpt::Fd::create(path);
  f.pwrite_all(head, sizeof head, 0);
  if (size) f.pwrite_all(data, size, sizeof head);
  f.close();
}

}  // namespace zero::fuzz
