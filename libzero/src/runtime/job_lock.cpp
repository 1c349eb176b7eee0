// JobLock: flock(2) on a lock file, shared within the process, holder written into the file.
#include "runtime/job_lock.hpp"

#include <fcntl.h>
#include <pwd.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>

#include "runtime/log.hpp"
#include "runtime/strings.hpp"
#include "zero/error.hpp"

namespace zero {
namespace {

// The holder line is padded to a fixed size and written in one pwrite, so a reader never sees a
// shorter line mixed with the tail of a longer one, and no truncation is needed.
constexpr std::size_t kHolderBytes = 256;

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
// The locks this process holds, by canonical lock file path. Weak: the last user releases.
std::map<std::string, std::weak_ptr<JobLock>>& registry() {
  static std::map<std::string, std::weak_ptr<JobLock>> r;
  return r;
}

bool same_file(int fd, const std::string& path) {
  struct stat a {
  }, b{};
  return ::fstat(fd, &a) == 0 && ::stat(path.c_str(), &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

std::string read_holder(int fd) {
  char buf[kHolderBytes];
  const ssize_t n = ::pread(fd, buf, sizeof buf, 0);
  std::string s(buf, n > 0 ? static_cast<std::size_t>(n) : 0);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\n' || s.back() == '\0')) s.pop_back();
  return s;
}

void write_holder(int fd, const std::string& file) {
  std::string s = JobLock::holder_text();
  s.resize(kHolderBytes - 1, ' ');
  s += '\n';
  // The lock is what protects; the line only helps the message of a job that is refused.
  if (::pwrite(fd, s.data(), s.size(), 0) != static_cast<ssize_t>(s.size()))
    log_warning("could not write this job's host and pid into the lock file {}: {}", file, std::strerror(errno));
}

[[noreturn]] void refuse(const std::string& what, const std::string& file, const std::string& holder,
                         const std::string& fix) {
  ZERO_THROW(fmt::format(
      "{} is in use by another job: its lock file {} is held by {}. Two jobs writing one "
      "directory destroy each other's files; {}",
      what, file,
      holder.empty() ? std::string("a process that has not yet written its host and pid") : escape_bytes(holder), fix));
}

// Why the lock file cannot be opened: the file itself when it exists (its owner and mode), its
// directory otherwise.
std::string cannot_open(const std::string& file, const std::string& what, int err) {
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0)
    return fmt::format("cannot create the lock file {} for {}: {}; check the permissions of its directory", file, what,
                       std::strerror(err));
  const struct passwd* pw = ::getpwuid(st.st_uid);
  return fmt::format(
      "cannot open the lock file {} for {}: {}; it belongs to {} (uid {}) with mode {:04o}, and this "
      "process runs as uid {}. A stale lock file needs no cleaning when it can be opened: remove this "
      "one (or ask its owner to), or make it readable",
      file, what, std::strerror(err), pw ? escape_bytes(pw->pw_name) : std::string("an unknown user"), st.st_uid,
      st.st_mode & 07777, ::geteuid());
}

bool locks_unsupported(int err) { return err == ENOLCK || err == EOPNOTSUPP || err == ENOSYS || err == EINVAL; }

}  // namespace

std::string JobLock::holder_text() {
  char host[HOST_NAME_MAX + 1] = {};
  if (::gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "unknown");
  return fmt::format("host {} pid {}", host, ::getpid());
}

JobLock::Taken JobLock::take(const std::string& file, LockMode mode, const std::string& what, const std::string& fix,
                             bool remove_file) {
  std::error_code ec;
  std::string key = std::filesystem::weakly_canonical(file, ec).string();
  if (ec || key.empty()) key = file;
  std::lock_guard guard(registry_mutex());
  std::weak_ptr<JobLock>& slot = registry()[key];
  if (std::shared_ptr<JobLock> held = slot.lock()) {
    // A directory deleted and created again has a new lock file: the old hold protects nothing.
    if (same_file(held->fd_, file)) {
      if (mode == LockMode::exclusive && held->mode_ == LockMode::shared) held->upgrade(what, fix);
      return {held, false, ""};
    }
  }
  const int op = (mode == LockMode::exclusive ? LOCK_EX : LOCK_SH) | LOCK_NB;
  // A releasing holder may delete the file between our open and our flock; the lock we got is
  // then on a file nobody else will open, so open the new one and try again.
  for (int attempt = 0;; ++attempt) {
    int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    // Another user's lock file (a stale one in a shared directory) may be readable only: flock
    // needs no write access, so it still serves as the lock; only the holder line is not written.
    bool read_only = false;
    if (fd < 0 && (errno == EACCES || errno == EPERM || errno == EROFS)) {
      fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
      read_only = fd >= 0;
      if (fd < 0) errno = EACCES;
    }
    if (fd < 0) {
      const int err = errno;
      // A reader of a directory it may not write (a published checkpoint) cannot collide with a
      // writer through it: it writes nothing there.
      if (mode == LockMode::shared && (err == EACCES || err == EROFS || err == EPERM)) return {};
      ZERO_THROW(cannot_open(file, what, err));
    }
    if (::flock(fd, op) != 0) {
      const int err = errno;
      if (err == EWOULDBLOCK) {
        const std::string holder = read_holder(fd);
        ::close(fd);
        refuse(what, file, holder, fix);
      }
      if (!locks_unsupported(err)) {
        ::close(fd);
        ZERO_THROW(fmt::format("cannot lock {} ({}): {}", file, what, std::strerror(err)));
      }
      log_warning(
          "the filesystem of {} does not support file locks ({}); a second job using {} will not be "
          "detected",
          file, std::strerror(err), what);
    } else if (!same_file(fd, file) && attempt < 100) {
      ::close(fd);
      continue;
    }
    Taken t;
    t.first = true;
    t.previous_holder = read_holder(fd);
    if (!read_only) write_holder(fd, file);
    t.lock = std::shared_ptr<JobLock>(new JobLock(file, fd, mode, remove_file, read_only));
    slot = t.lock;
    return t;
  }
}

void JobLock::upgrade(const std::string& what, const std::string& fix) {
  if (::flock(fd_, LOCK_EX | LOCK_NB) == 0) {
    mode_ = LockMode::exclusive;
    if (!read_only_) write_holder(fd_, file_);
    return;
  }
  const int err = errno;
  if (err != EWOULDBLOCK) return;  // no locks on this filesystem: warned when it was taken
  std::string holder = read_holder(fd_);
  // Shared holders each write their line; when ours is the last one, the holder is a reader
  // that came before us.
  if (holder == holder_text()) holder = "another job that reads it";
  // Converting a flock is not atomic: the shared lock may be gone; take it back if it can be.
  (void)::flock(fd_, LOCK_SH | LOCK_NB);
  refuse(what, file_, holder, fix);
}

JobLock::~JobLock() {
  // Deleted while still held, so no other job can be holding this very file.
  if (remove_file_) ::unlink(file_.c_str());
  ::close(fd_);
}

}  // namespace zero
