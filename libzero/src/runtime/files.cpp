#include "zero/util/files.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

namespace zero {

namespace {

const char* type_of(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  return "a device";
}

}  // namespace

OpenedFile open_regular_file(const std::string& path) {
  OpenedFile r;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    r.error = errno;
    return r;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    r.error = errno;
    ::close(fd);
    return r;
  }
  r.exists = true;
  r.type = type_of(st.st_mode);
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return r;
  }
  // Regular files ignore O_NONBLOCK, but a reader should not carry a flag it did not mean.
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) (void)::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  r.fd = fd;
  r.size = static_cast<std::uint64_t>(st.st_size);
  return r;
}

}  // namespace zero
