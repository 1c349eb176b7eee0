// Stage 3's start-up report: which units it shards and which stay whole (persistent) under
// stage3_param_persistence_threshold, and a warning when it shards none (rank 0 prints both).
#include <catch2/catch.hpp>

#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "engine_model.hpp"
#include "zero/context.hpp"
#include "zero/engine.hpp"

using namespace zero;
using Catch::Matchers::Contains;

namespace {

Context& ctx() { return *Context::current(); }

// What this process writes to stderr (fd 2, where the log goes) while fn runs.
template <class F>
std::string stderr_of(F&& fn) {
  char path[] = "/tmp/zero_stderr_XXXXXX";
  const int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  std::fflush(stderr);
  const int saved = ::dup(2);
  ::dup2(fd, 2);
  struct Restore {
    int saved, fd;
    ~Restore() {
      std::fflush(stderr);
      ::dup2(saved, 2);
      ::close(saved);
      ::close(fd);
    }
  };
  {
    Restore r{saved, fd};
    fn();
  }
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  ::unlink(path);
  return text.str();
}

std::string engine_start(int stage, const char* threshold) {
  ::unsetenv("ZERO_LOG_LEVEL");
  std::string y = "train_micro_batch_size_per_gpu: 1\ngradient_accumulation_steps: 1\n";
  y += "zero_optimization:\n  stage: " + std::to_string(stage) + "\n";
  if (threshold) y += std::string("  stage3_param_persistence_threshold: ") + threshold + "\n";
  Config cfg = parse_config(y, "test_stage3_report");
  cfg.resolve(ctx().world_size());
  return stderr_of([&] { Engine e(ctx(), cfg, test::make_layout()); });
}

}  // namespace

TEST_CASE("stage 3 warns at start when the persistence threshold leaves nothing to shard") {
  // The test model's largest unit has 201 elements; DeepSpeed's default threshold is 1e5.
  const std::string out = engine_start(3, nullptr);
  if (ctx().rank() == 0) {
    CHECK_THAT(out, Contains("warning: stage 3 shards no unit's parameters") &&
                        Contains("stage3_param_persistence_threshold = 100000 (the largest, 'big', has 201)") &&
                        Contains("lower the threshold"));
    CHECK_THAT(out, Contains("0 of 5 units sharded: none; 5 persistent"));
  } else {
    CHECK(out.find("stage 3") == std::string::npos);  // said once, by rank 0
  }
}

TEST_CASE("stage 3 lists its sharded and persistent units with the threshold") {
  const std::string out = engine_start(3, "20");
  if (ctx().rank() == 0) {
    CHECK_THAT(out, Contains("stage 3, stage3_param_persistence_threshold 20: 3 of 5 units sharded: embed (38), "
                             "layer0 (38), big (201); 2 persistent (whole on every rank, fewer elements than the "
                             "threshold): layer1 (13), head (16)"));
    CHECK(out.find("warning") == std::string::npos);
  }
  // Other stages shard no parameters by design: nothing to report.
  CHECK(engine_start(2, nullptr).find("stage 3") == std::string::npos);
}
