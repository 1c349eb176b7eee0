// Hostile or broken config input (issue 15): text yaml-cpp cannot end on, alias bombs, integers
// too large for the member that stores them, files that are not regular, oversized files,
// sections with no value, and control bytes echoed in messages. Each case must fail fast with
// a clear message; the timing checks use generous bounds (the defects took forever).
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include "zero/config.hpp"
#include "zero/config_schema.hpp"
#include "zero/error.hpp"

using Catch::Matchers::Contains;
using zero::Config;
using zero::LoadOptions;

namespace {

Config parse(const std::string& text, const LoadOptions& opts = {}) {
  return zero::parse_config(text, "in.yaml", opts);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "zero-inputs-XXXXXX").string();
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

// `levels` nested lists of ten aliases each: expands to 10^levels scalars.
std::string alias_bomb(int levels) {
  std::string y = "  a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n";
  for (int i = 1; i < levels; ++i) {
    const std::string prev = "*a" + std::to_string(i - 1);
    y += "  a" + std::to_string(i) + ": &a" + std::to_string(i) + " [";
    for (int k = 0; k < 10; ++k) y += (k ? ", " : "") + prev;
    y += "]\n";
  }
  return y;
}

}  // namespace

TEST_CASE("D1: text starting with ',' is an error, not an endless loop", "[config]") {
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE_THROWS_WITH(parse(","), Contains("in.yaml") && Contains("not valid YAML or JSON"));
  REQUIRE_THROWS_WITH(parse(",\ntrain_batch_size: 8\n"), Contains("not valid YAML or JSON"));
  REQUIRE_THROWS_WITH(parse("{train_batch_size: 8},\n"), Contains("not valid YAML or JSON"));
  LoadOptions o;
  o.overrides = {"train_batch_size=,"};
  REQUIRE_THROWS_WITH(parse("{}", o), Contains("--set train_batch_size=,"));
  CHECK(seconds_since(t0) < 0.5);
}

TEST_CASE("D2: an alias bomb in an application section fails fast with a clear error", "[config]") {
  LoadOptions o;
  o.extra_sections = {"model", "run"};
  const std::string bomb = "model:\n" + alias_bomb(9);  // 10^9 values in about 400 bytes
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE_THROWS_WITH(parse(bomb, o),
                      Contains("in.yaml:1") && Contains("model expands to") && Contains("YAML aliases"));
  CHECK(seconds_since(t0) < 0.5);

  // A few aliases are fine, and their keys point at a line of the file.
  Config c = parse("run:\n  base: &b {lr: 1, steps: 2}\n  copy: *b\n", o);
  zero::StrictSection run = zero::extra_section(c, "run");
  CHECK(run.where("copy") == "in.yaml:3");
  REQUIRE(run.sub("copy"));
  CHECK(run.sub("copy")->get_int("steps", 0) == 2);
}

TEST_CASE("An alias inside the anchor it names is an error, not endless recursion", "[config]") {
  LoadOptions o;
  o.extra_sections = {"model", "run"};
  const auto t0 = std::chrono::steady_clock::now();
  // Found by the config fuzzer: the map contains itself through *m.
  REQUIRE_THROWS_WITH(parse("model: &m {x: 1, self: *m}\n", o),
                      Contains("in.yaml:1") && Contains("model.self") && Contains("anchor that contains it"));
  REQUIRE_THROWS_WITH(parse("run:\n  a: &l [1, [2, *l]]\n", o), Contains("anchor that contains it"));
  CHECK(seconds_since(t0) < 0.5);
}

TEST_CASE("D3: integers are range-checked against the member that stores them", "[config]") {
  // 2^32 + 16 would wrap to 16 in an int.
  REQUIRE_THROWS_WITH(parse("train_micro_batch_size_per_gpu: 4294967312\n"),
                      Contains("train_micro_batch_size_per_gpu = 4294967312") && Contains("1..2147483647"));
  REQUIRE_THROWS_WITH(parse("gradient_accumulation_steps: 4294967297\n"), Contains("1..2147483647"));
  REQUIRE_THROWS_WITH(parse("zero_optimization:\n  offload_optimizer:\n    buffer_count: 4294967300\n"),
                      Contains("buffer_count") && Contains("1..1048576"));
  REQUIRE_THROWS_WITH(parse("fp16:\n  loss_scale_window: 4294967296\n"), Contains("1..1073741824"));
  // A derived micro batch too large for an int is refused at resolve().
  Config big = parse("train_batch_size: 8589934592\ngradient_accumulation_steps: 1\n");
  REQUIRE_THROWS_WITH(big.resolve(1), Contains("train_micro_batch_size_per_gpu would be 8589934592"));
  // In range: loaded exactly.
  CHECK(parse("train_micro_batch_size_per_gpu: 2147483647\n").train_micro_batch_size_per_gpu == 2147483647);
}

TEST_CASE("a FIFO, a directory or an oversized file is refused without reading it", "[config]") {
  TempDir dir;
  const std::string fifo = (dir.path / "cfg.fifo").string();
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE_THROWS_WITH(zero::load_config(fifo),
                      Contains("cfg.fifo") && Contains("not a regular file") && Contains("a FIFO"));
  CHECK(seconds_since(t0) < 0.5);
  REQUIRE_THROWS_WITH(zero::load_config(dir.path.string()), Contains("a directory"));
  if (std::filesystem::exists("/dev/zero")) {
    REQUIRE_THROWS_WITH(zero::load_config("/dev/zero"), Contains("not a regular file"));
  }
  const auto big = dir.path / "big.yaml";
  {
    std::ofstream out(big);
    out << "# padding\n";
  }
  std::filesystem::resize_file(big, (16u << 20) + 1);  // sparse: nothing is written
  REQUIRE_THROWS_WITH(zero::load_config(big.string()), Contains("16 MiB"));
}

TEST_CASE("a section with no value is an error, as the README says", "[config]") {
  REQUIRE_THROWS_WITH(parse("zero_optimization:\n"),
                      Contains("in.yaml:1") && Contains("zero_optimization has no value"));
  REQUIRE_THROWS_WITH(parse("train_batch_size: 8\noptimizer:\n"), Contains("optimizer has no value"));
  CHECK(parse("zero_optimization: {}\n").zero_optimization.stage == 0);
}

TEST_CASE("control bytes in echoed values are escaped", "[config]") {
  try {
    parse("zero_optimization:\n  stage: \"\\e[31mred\\x07\"\n");
    FAIL("expected an error");
  } catch (const zero::Error& e) {
    const std::string m = e.what();
    CHECK(m.find('\x1b') == std::string::npos);
    CHECK(m.find('\x07') == std::string::npos);
    CHECK(m.find("\\x1b[31mred\\x07") != std::string::npos);
  }
  try {
    parse("\"bad\\tkey\\u0001\": 1\n");
    FAIL("expected an error");
  } catch (const zero::Error& e) {
    CHECK(std::string(e.what()).find("bad\\tkey\\x01") != std::string::npos);
  }
}
