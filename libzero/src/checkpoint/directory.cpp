// Checkpoint roots: the `latest` pointer, tags, preparing a save, and the atomic commit.
#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string_view>
#include <system_error>

#include "checkpoint/format.hpp"
#include "runtime/job_lock.hpp"
#include "runtime/log.hpp"
#include "runtime/strings.hpp"
#include "zero/error.hpp"

namespace zero::ckpt {

using namespace detail;
namespace fs = std::filesystem;

namespace {

bool is_dir(const std::string& p) {
  std::error_code ec;
  return fs::is_directory(p, ec);
}

// The step directories under root, oldest first.
std::vector<std::int64_t> steps_in(const std::string& root) {
  std::vector<std::int64_t> steps;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    std::int64_t s = parse_step_dir_name(e.path().filename().string());
    if (s >= 0 && e.is_directory()) steps.push_back(s);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

void move_to_trash_and_remove(const std::string& root, const std::string& name, bool strict) {
  std::string from = root + "/" + name, trash = root + "/.trash_" + name;
  std::error_code ec;
  fs::remove_all(trash, ec);
  if (::rename(from.c_str(), trash.c_str()) != 0) {
    if (strict) sys_fail("move aside", from, errno);
    log_warning("could not delete old checkpoint '{}': {}; delete it by hand", from, std::strerror(errno));
    return;
  }
  fs::remove_all(trash, ec);
  if (ec) log_warning("could not delete '{}': {}; delete it by hand", trash, ec.message());
}

}  // namespace

void lock_root(const std::string& root, bool exclusive, const char* kind) {
  // Held until the process exits: a job keeps its root for its whole run, and a library
  // without a "run" object has no earlier moment at which the job is known to be done with it.
  static std::mutex mutex;
  static std::vector<std::shared_ptr<JobLock>> held;
  std::string dir = root;
  if (fs::exists(fs::path(root) / kMetadataFile)) {
    fs::path p = fs::path(root).lexically_normal();
    if (p.filename().empty()) p = p.parent_path();  // "ckpt/step_00000010/"
    dir = p.has_parent_path() ? p.parent_path().string() : ".";
  }
  JobLock::Taken t = JobLock::take(
      dir + "/" + kLockFile, exclusive ? LockMode::exclusive : LockMode::shared, fmt::format("the {} '{}'", kind, dir),
      fmt::format("wait for it to end or stop it, or give this job another {} (a resumed run must not run twice)",
                  kind));
  std::lock_guard guard(mutex);
  if (t.first) held.push_back(std::move(t.lock));
}

std::string read_latest(const std::string& root) {
  std::string path = root + "/" + kLatestFile;
  if (::access(path.c_str(), F_OK) != 0 && errno == ENOENT)
    ZERO_THROW(
        fmt::format("checkpoint root '{}' has no 'latest' file: no checkpoint was completed there; "
                    "check the path, or pass a step number as the tag",
                    root));
  Fd f = Fd::open_read(path);
  std::uint64_t size = f.size();
  if (size > 64) file_fail(path, "content", fmt::format("is {} bytes; it should hold one directory name", size));
  std::string s(static_cast<std::size_t>(size), '\0');
  f.pread_all(s.data(), s.size(), 0);
  if (!s.empty() && s.back() == '\n') s.pop_back();
  if (parse_step_dir_name(s) < 0)
    file_fail(path, "content",
              fmt::format("= \"{}\" is not a checkpoint directory name like step_00000010", escape_bytes(s)));
  return s;
}

std::string resolve(const std::string& root, const std::string& tag) {
  const bool latest = tag == "latest" || tag.empty();
  if (fs::exists(fs::path(root) / kMetadataFile)) {
    ZERO_CHECK(latest, fmt::format("checkpoint: '{}' is a step directory; tag '{}' applies to a checkpoint root", root,
                                   escape_bytes(tag)));
    return root;
  }
  if (!is_dir(root))
    ZERO_THROW(fmt::format("checkpoint root '{}' does not exist or is not a directory; check the path", root));
  std::string name;
  if (latest) {
    name = read_latest(root);
  } else if (parse_step_dir_name(tag) >= 0) {
    name = tag;
  } else {
    bool digits = tag.size() <= 18 && std::all_of(tag.begin(), tag.end(), [](char c) { return c >= '0' && c <= '9'; });
    ZERO_CHECK(digits, fmt::format("checkpoint tag '{}' is neither \"latest\" nor a step number", escape_bytes(tag)));
    name = step_dir_name(std::stoll(tag));
  }
  std::string dir = root + "/" + name;
  if (!is_dir(dir)) {
    std::vector<std::string> have;
    for (auto s : steps_in(root)) have.push_back(step_dir_name(s));
    ZERO_THROW(fmt::format("checkpoint '{}' does not exist ({}); available: {}", dir,
                           latest ? std::string("named by 'latest'") : "tag " + tag,
                           have.empty() ? std::string("none") : fmt::format("{}", fmt::join(have, " "))));
  }
  return dir;
}

std::string prepare(const std::string& root, std::int64_t step, const char* who, bool refuse_older) {
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) sys_fail("create the checkpoint root", root, ec.value());
  lock_root(root, true);
  std::string name = step_dir_name(step);
  if (refuse_older) {
    auto steps = steps_in(root);
    if (!steps.empty() && steps.back() > step)
      ZERO_THROW(
          fmt::format("{}: '{}' already holds step {}, newer than step {}: writing an older step there would "
                      "move 'latest' back, and the run that saves there would then replace its newer "
                      "checkpoints. Write to another directory",
                      who, root, steps.back(), step));
  }
  if (is_dir(root + "/" + name) && fs::exists(fs::path(root) / kLatestFile)) {
    std::string latest;
    try {
      latest = read_latest(root);
    } catch (const Error&) {
      // A malformed latest points nowhere; the existing directory is not in use then.
    }
    bool save = std::string_view(who) == "save_checkpoint";
    ZERO_CHECK(latest != name,
               fmt::format("{}: '{}/{}' already exists and is the latest checkpoint{}", who, root, name,
                           save ? ": the engine is at the step it was saved (or resumed) at. Skip this save, or train "
                                  "at least one step first"
                                : "; write to another directory or delete it first"));
  }
  // Leftovers of saves that were interrupted (killed) part way.
  for (const auto& e : fs::directory_iterator(root, ec)) {
    std::string n = e.path().filename().string();
    if (n.rfind(".tmp_step_", 0) == 0 || n.rfind(".trash_step_", 0) == 0) {
      std::error_code rm;
      fs::remove_all(e.path(), rm);
      if (rm) sys_fail("remove the leftover", e.path().string(), rm.value());
    }
  }
  if (ec) sys_fail("list", root, ec.value());
  std::string tmp = root + "/.tmp_" + name;
  fs::create_directory(tmp, ec);
  if (ec) sys_fail("create", tmp, ec.value());
  fsync_dir(root);
  return tmp;
}

void commit(const std::string& root, const std::string& tmp_dir, std::int64_t step, int keep_last,
            void (*fail_point)(const char*)) {
  const std::string name = step_dir_name(step);
  const std::string final_dir = root + "/" + name;
  fsync_dir(tmp_dir);
  fail_point("before_rename");
  // A directory of this step that latest does not name (prepare checked) is a leftover of an
  // abandoned run or of a save killed after its rename: replace it. Moving it aside first keeps
  // the rename below atomic; the latest checkpoint is untouched throughout.
  if (is_dir(final_dir)) move_to_trash_and_remove(root, name, true);
  if (::rename(tmp_dir.c_str(), final_dir.c_str()) != 0) sys_fail("rename " + tmp_dir + " to", final_dir, errno);
  fsync_dir(root);
  fail_point("after_rename");
  try {
    write_file_atomic(root, kLatestFile, name + "\n");
  } catch (const Error& e) {
    // The step is complete and verified on disk; only the pointer is stale. Say exactly that:
    // this is no failed save, and the step need not be written again.
    std::string before;
    try {
      before = "still names step " + std::to_string(parse_step_dir_name(read_latest(root)));
    } catch (const Error&) {
      before = "names no step";
    }
    ZERO_THROW(
        fmt::format("checkpoint: step {} is complete on disk; `latest` {} (it could not be updated: {}). "
                    "The step is in '{}'. Free space in '{}': the next save updates `latest` (or write \"{}\" "
                    "into '{}/{}' to resume from step {}; zero-ckpt inspect lists it)",
                    step, before, e.what(), final_dir, root, name, root, kLatestFile, step));
  }
  fail_point("after_latest");
  if (keep_last <= 0) return;
  // Keep the newest keep_last checkpoints up to this step. Later steps are a future this run
  // abandoned by resuming from an earlier one; they are replaced as the run reaches them.
  std::vector<std::int64_t> older;
  for (auto s : steps_in(root))
    if (s <= step) older.push_back(s);
  std::sort(older.rbegin(), older.rend());
  for (std::size_t i = static_cast<std::size_t>(keep_last); i < older.size(); ++i)
    move_to_trash_and_remove(root, step_dir_name(older[i]), false);
  fsync_dir(root);
}

}  // namespace zero::ckpt
