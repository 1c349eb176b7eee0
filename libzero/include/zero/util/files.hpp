// Opening a file that a program reads but does not trust: a regular file only, and never an open
// that blocks.
//
// open() of a FIFO waits for a writer, so a FIFO in place of a checkpoint file, a config or a
// data shard would hang every rank that reads it, forever and without a message. A device or a
// directory reads without end or fails with a puzzling error. open_regular_file opens with
// O_NONBLOCK (a FIFO then opens at once), asks fstat what the path is, and hands back a
// descriptor only for a regular file, in blocking mode again. Each caller words its own error.
#pragma once

#include <cstdint>
#include <string>

namespace zero {

struct OpenedFile {
  int fd = -1;         // >= 0: a regular file, open read-only; the caller closes it
  int error = 0;       // errno of a failed open or fstat (fd < 0, is_regular false)
  bool exists = false; // open and fstat worked: `type` says what the path is
  std::string type;    // "a regular file", "a directory", "a FIFO", "a device", "a socket"
  std::uint64_t size = 0;
};
OpenedFile open_regular_file(const std::string& path);

}  // namespace zero
