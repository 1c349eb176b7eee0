// A scratch directory for one test process and all its ranks: made unique by rank 0 (mkdtemp,
// so parallel runs of the same test, from any checkout, never share one) and removed when the
// process exits. NVMe swap directories are locked by the job using them: a fixed path would
// make two runs refuse each other.
#pragma once

#include <catch2/catch.hpp>

#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "zero/comm.hpp"
#include "zero/context.hpp"

namespace zero::test {

inline std::string process_scratch_dir(const char* tag) {
  struct Dir {
    std::string path;
    bool owner = false;
    ~Dir() {
      std::error_code ec;
      if (owner) std::filesystem::remove_all(path, ec);
    }
  };
  static Dir dir;
  if (dir.path.empty()) {
    Context& ctx = *Context::current();
    char buf[512] = {};
    if (ctx.rank() == 0) {
      const std::string t =
          (std::filesystem::temp_directory_path() / (std::string("zero_") + tag + "_XXXXXX")).string();
      std::snprintf(buf, sizeof buf, "%s", t.c_str());
      REQUIRE(::mkdtemp(buf) != nullptr);
      dir.owner = true;
    }
    ctx.comm().broadcast(buf, sizeof buf, 0);
    dir.path = buf;
  }
  return dir.path;
}

}  // namespace zero::test
