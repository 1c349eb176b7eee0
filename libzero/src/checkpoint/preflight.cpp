// Before a run writes: the checkpoint root's free space against one save (checkpoint_bytes), the
// directory locks that keep a second job out of a run's checkpoint root or run directory, and that
// every host sees the checkpoint root as the same directory.
#include <fmt/format.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

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

// Collective: every rank must see the directory rank 0 locked as the same directory, since each
// writes its own shard there. A node-local path (/tmp, a scratch disk) on a multi-host job is a
// different directory on each host, which a save would otherwise find only at its end (and the
// work since the start would be lost). Rank 0 writes a marker with a random token; every rank
// reads it back (retrying for a while: another host's view of a shared filesystem may lag).
void check_same_directory_everywhere(Communicator& comm, const std::string& dir, const char* kind) {
  if (comm.size() == 1) return;
  const std::string marker = dir + "/.zero-shared-check";
  std::uint64_t token = 0;
  agree(comm, [&] {
    if (comm.rank() != 0) return;
    token = std::random_device{}() * 0x9E3779B97F4A7C15ull ^ static_cast<std::uint64_t>(::getpid());
    std::ofstream f(marker, std::ios::trunc);
    f << token << "\n";
    f.close();
    ZERO_CHECK(f.good(), fmt::format("lock: cannot write '{}' in the {}: {}", marker, kind, std::strerror(errno)));
  });
  comm.broadcast(&token, sizeof token, 0);
  bool sees = false;
  for (int attempt = 0; attempt < 20 && !sees; ++attempt) {
    if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::ifstream f(marker);
    std::uint64_t got = 0;
    sees = f >> got && got == token;
  }
  // Every rank's host and whether it saw the marker, in 64 bytes.
  struct Seen {
    char host[60];
    std::uint32_t sees;
  };
  static_assert(sizeof(Seen) == 64);
  Seen mine{};
  if (::gethostname(mine.host, sizeof mine.host - 1) != 0) std::strcpy(mine.host, "?");
  mine.sees = sees ? 1 : 0;
  std::vector<Seen> all(static_cast<std::size_t>(comm.size()));
  comm.all_gather(&mine, all.data(), sizeof(Seen) / 4, DType::f32);  // raw bytes through a float gather
  comm.barrier();
  if (comm.rank() == 0) std::filesystem::remove(marker);
  std::string blind;
  for (int r = 0; r < comm.size(); ++r)
    if (!all[static_cast<std::size_t>(r)].sees)
      blind += fmt::format("{}rank {} (host {})", blind.empty() ? "" : ", ", r, all[static_cast<std::size_t>(r)].host);
  ZERO_CHECK(blind.empty(),
             fmt::format("the {} '{}' is not the same directory on every host: {} cannot see the file rank 0 (host {}) "
                         "wrote there. Every rank writes its shard into it, so it must be on storage all hosts share "
                         "(a node-local /tmp or scratch disk is not); give a shared path",
                         kind, dir, blind, all[0].host));
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
  check_same_directory_everywhere(EngineState(engine).world_comm(), root, "checkpoint root");
}

void lock_run_directory(Engine& engine, const std::string& dir) { lock_job_directory(engine, dir, "run directory"); }

}  // namespace zero
