// Job locks: one job per directory (a checkpoint root, an NVMe swap directory).
//
// Two jobs pointed at the same directory destroy each other's files (one deletes the other's
// save in progress; swap files are overwritten under a running optimizer). Each such directory
// therefore has a lock file that a job holds with flock(2) while it uses the directory. The
// kernel drops the lock when the holder dies, however it dies, so a lock is never stale: a
// lock file whose lock nobody holds is what a job that was killed leaves, and the next job
// simply takes it. After taking a lock the holder writes its host and pid into the file, and a
// job that is refused reads them back, so its message says which job to look for.
//
// Locks are per process: several objects of one process (two swappers on one rank directory,
// repeated saves into one root) share one lock, which is how ranks of one job never refuse each
// other as long as each directory is locked by the one process that owns it (rank 0 for a
// shared checkpoint root, rank r for its own swap directory).
#pragma once

#include <memory>
#include <string>

namespace zero {

enum class LockMode { shared, exclusive };

class JobLock {
 public:
  struct Taken {
    std::shared_ptr<JobLock> lock;
    bool first = false;           // this process did not hold the lock before this call
    std::string previous_holder;  // what the lock file said before (a job that is gone), or ""
  };

  // Takes the lock `file` (created if missing) in `mode`, or joins this process's hold of it
  // (upgrading shared to exclusive when asked). `what` names the directory in messages ("the
  // checkpoint root 'ckpt'"), `fix` ends the refusal message with what to do. When another
  // process holds the lock, throws zero::Error naming the lock file and the holder's host and
  // pid. A filesystem without locks (some network mounts) is warned about once and not locked.
  // remove_file: the last holder in this process deletes the lock file on release.
  static Taken take(const std::string& file, LockMode mode, const std::string& what, const std::string& fix,
                    bool remove_file = false);

  ~JobLock();
  JobLock(const JobLock&) = delete;
  JobLock& operator=(const JobLock&) = delete;

  const std::string& file() const { return file_; }

  // "host node7 pid 4242": what this process writes into its lock files.
  static std::string holder_text();

 private:
  JobLock(std::string file, int fd, LockMode mode, bool remove_file, bool read_only)
      : file_(std::move(file)), fd_(fd), mode_(mode), remove_file_(remove_file), read_only_(read_only) {}
  void upgrade(const std::string& what, const std::string& fix);

  std::string file_;
  int fd_ = -1;
  LockMode mode_;
  bool remove_file_ = false;
  bool read_only_ = false;  // another user's file: locked, but the holder line is not ours to write
};

}  // namespace zero
