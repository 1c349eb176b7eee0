// Opening a file that a program reads but does not trust: a regular file only, and never an open
// that blocks (a FIFO in place of a config or checkpoint would hang every rank that reads it).
// See docs/architecture.md, note untrusted-files.
#pragma once

#include <cstdint>
#include <string>

namespace zero {

struct OpenedFile {
  int fd = -1;          // >= 0: a regular file, open read-only; the caller closes it
  int error = 0;        // errno of a failed open or fstat (fd < 0, is_regular false)
  bool exists = false;  // open and fstat worked: `type` says what the path is
  std::string type;     // "a regular file", "a directory", "a FIFO", "a device", "a socket"
  std::uint64_t size = 0;
};
OpenedFile open_regular_file(const std::string& path);

}  // namespace zero
