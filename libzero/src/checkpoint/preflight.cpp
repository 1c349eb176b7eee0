// Before a run writes: the checkpoint root's free space against one save (checkpoint_bytes), and
// the directory locks that keep a second job out of a run's checkpoint root or run directory.
#include <fmt/format.h>
#include <sys/statvfs.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>

#include "checkpoint/agree.hpp"
#include "checkpoint/format.hpp"
#include "runtime/log.hpp"
#include "zero/checkpoint.hpp"
#include "zero/comm.hpp"
#include "zero/engine.hpp"
#include "zero/engine_state.hpp"
#include "zero/error.hpp"

namespace zero {

namespace {

// Collective: rank 0 creates `dir` and holds its lock exclusively until the process exits.
void lock_job_directory(Engine& engine, const std::string& dir, const char* kind) {
  EngineState e(engine);
  Communicator& comm = e.world_comm();
  same_on_all_ranks(comm, dir, fmt::format("the {}", kind));
  agree(comm, [&] {
    ZERO_CHECK(!dir.empty(), fmt::format("lock: the {} is empty; pass a directory", kind));
    if (comm.rank() != 0) return;
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    ZERO_CHECK(
        !ec, fmt::format("lock: cannot create the {} '{}': {}; choose a writable directory", kind, dir, ec.message()));
    ckpt::lock_root(dir, true, kind);
  });
}

}  // namespace

void check_checkpoint_space(Engine& engine, const std::string& root) {
  EngineState e(engine);
  // Every rank computes the size (a collective may be inside); rank 0 compares it.
  Communicator& comm = e.world_comm();
  struct statvfs fs {};
  const bool stated = comm.rank() != 0 || ::statvfs(root.c_str(), &fs) == 0;
  const int stat_errno = errno;
  // Every rank of a position passes rank 0's block size: the sum over the grid is collective.
  double block = stated && fs.f_frsize > 0 ? static_cast<double>(fs.f_frsize) : 4096.0;
  block = comm.all_reduce_scalar(comm.rank() == 0 ? block : 0.0, ReduceOp::max);
  const std::uint64_t need = checkpoint_bytes(engine, static_cast<std::uint64_t>(block));
  agree(comm, [&] {
    if (comm.rank() != 0) return;
    ZERO_CHECK(stated, fmt::format("checkpoint root '{}': cannot read its free space: {}; check the path", root,
                                   std::strerror(stat_errno)));
    if (fs.f_blocks == 0) {
      log_warning(
          "checkpoint root '{}' is on a filesystem that reports no capacity (ramfs?): its free space is not "
          "checked; one save takes {}",
          root, format_bytes(need));
      return;
    }
    const std::uint64_t free = static_cast<std::uint64_t>(fs.f_bavail) * fs.f_frsize;
    ZERO_CHECK(free >= need, fmt::format("checkpoint root '{}' has {} free, less than one save of this model ({}): "
                                         "the first save would fail. Free space there or give another root "
                                         "(--checkpoint)",
                                         root, format_bytes(free), format_bytes(need)));
    if (free < 2 * need)
      log_warning(
          "checkpoint root '{}' has {} free, room for one save ({}) but not two: a save is written in full "
          "before the older one is pruned, so the second save may fail. Free space there",
          root, format_bytes(free), format_bytes(need));
  });
}

void lock_checkpoint_root(Engine& engine, const std::string& root) {
  lock_job_directory(engine, root, "checkpoint root");
}

void lock_run_directory(Engine& engine, const std::string& dir) { lock_job_directory(engine, dir, "run directory"); }

}  // namespace zero
