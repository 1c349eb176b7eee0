// Checkpoints across world sizes and stages. A process cannot change its world size, so the
// work is split over ctest entries sharing ZERO_CKPT_TEST_DIR:
//   [save]     at N ranks: 5 steps at every stage, saved to n<N>_s<S>/, with the exact master
//              (n<N>_s<S>.master) and the values the safetensors export must hold (.expected.json)
//   [load]     at M ranks: every n<N>_s<S> into every stage S' (so N != M really happens): the
//              loaded master equals the saved one bit for bit, and 5 more steps match the
//              single-process reference of 10 steps within the engine's parity tolerance
//   [offline]  at M ranks: a checkpoint rewritten by `zero-ckpt reshard --world M` loads to the
//              same state as the original (ZERO_CKPT_OFFLINE=<resharded>:<original>)
// The tags are hidden: running the executable without one runs nothing.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint_common.hpp"

using namespace zero;
using namespace zero::test;
using namespace zero::test::cktest;
namespace fs = std::filesystem;

namespace {

std::string test_dir() { return dir_from_env("ZERO_CKPT_TEST_DIR"); }

std::string name_of(int world, int stage) { return "n" + std::to_string(world) + "_s" + std::to_string(stage); }

std::vector<float> flat(const std::vector<std::vector<float>>& units) {
  std::vector<float> f;
  for (const auto& u : units) f.insert(f.end(), u.begin(), u.end());
  return f;
}

std::vector<float> read_floats(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  INFO("reading " << path << " (written by the test_checkpoint_save_np* entries)");
  REQUIRE(in.good());
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
}

void require_same_bits(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::bit_cast<std::uint32_t>(a[i]) != std::bit_cast<std::uint32_t>(b[i])) {
      INFO(what << ": element " << i << ": " << a[i] << " vs " << b[i]);
      REQUIRE(false);
    }
}

// Loads `root` at this world size and stage, checks the state against the saved master, trains
// 5 more steps and compares with the reference.
void load_and_continue(const std::string& root, const std::string& master_file, Case c,
                       const std::vector<std::vector<double>>& ref10) {
  Engine e(ctx(), make_config(c, ctx().world_size()), make_ckpt_layout());
  ClientState cs = load_checkpoint(e, root);
  CHECK(cs.count("saved_by") == 1);
  REQUIRE(e.global_step() == 5);
  require_same_bits(flat(snapshot(e).master), read_floats(master_file), "loaded master");
  for (int s = 0; s < 5; ++s) train_step(e, c);
  require_near_reference(snapshot(e).params, ref10);
}

}  // namespace

TEST_CASE("save at N ranks for every stage", "[.][save]") {
  const std::string dir = test_dir();
  const int world = ctx().world_size();
  const std::string prefix = "n" + std::to_string(world) + "_";
  if (ctx().rank() == 0) {
    fs::create_directories(dir);
    for (const auto& ent : fs::directory_iterator(dir))  // this world size's outputs of earlier runs
      if (ent.path().filename().string().rfind(prefix, 0) == 0) fs::remove_all(ent.path());
  }
  ctx().comm().barrier();
  auto ref5 = reference(5);
  for (int stage = 0; stage <= 3; ++stage) {
    Case c;
    c.stage = stage;
    c.offload = stage >= 2 ? "cpu" : "none";
    Engine e(ctx(), make_config(c, world), make_ckpt_layout());
    e.init_params(init_value);
    for (int s = 0; s < 5; ++s) train_step(e, c);
    Snapshot snap = snapshot(e);
    require_near_reference(snap.params, ref5);
    const std::string base = dir + "/" + name_of(world, stage);
    save_checkpoint(e, base, {{"saved_by", std::to_string(world) + " ranks at stage " + std::to_string(stage)}});
    if (ctx().rank() != 0) continue;
    std::vector<float> m = flat(snap.master);
    std::ofstream(base + ".master", std::ios::binary)
        .write(reinterpret_cast<const char*>(m.data()), static_cast<std::streamsize>(m.size() * sizeof(float)));
    // For test/e2e/read_safetensors.py: every parameter's shape and fp32 bit patterns.
    std::ostringstream j;
    j << "{";
    const Layout l = make_ckpt_layout();
    bool first = true;
    for (int u = 0; u < l.num_units(); ++u)
      for (const auto& p : l.unit(u).params) {
        j << (first ? "" : ",") << "\n  \"" << p.name << "\": {\"shape\": [";
        for (std::size_t k = 0; k < p.shape.size(); ++k) j << (k ? ", " : "") << p.shape[k];
        j << "], \"bits\": [";
        for (std::int64_t i = 0; i < p.numel; ++i)
          j << (i ? ", " : "")
            << std::bit_cast<std::uint32_t>(
                   snap.master[static_cast<std::size_t>(u)][static_cast<std::size_t>(p.offset + i)]);
        j << "]}";
        first = false;
      }
    j << "\n}\n";
    std::ofstream(base + ".expected.json") << j.str();
  }
  ctx().comm().barrier();
}

TEST_CASE("load at M ranks what N ranks saved, at every stage", "[.][load]") {
  const std::string dir = test_dir();
  const int world = ctx().world_size();
  auto ref10 = reference(10);
  for (int n = 1; n <= 4; ++n)
    for (int saved_stage = 0; saved_stage <= 3; ++saved_stage)
      for (int stage = 0; stage <= 3; ++stage) {
        Case c;
        c.stage = stage;
        // Vary where the loaded state lives: offload needs stage >= 1.
        c.offload = stage >= 1 && (n + saved_stage + stage) % 2 == 1 ? "cpu" : "none";
        INFO("saved by " << n << " ranks at stage " << saved_stage << ", loaded by " << world << " at stage " << stage
                         << " offload " << c.offload);
        const std::string base = dir + "/" + name_of(n, saved_stage);
        load_and_continue(base, base + ".master", c, ref10);
      }
}

TEST_CASE("a checkpoint resharded offline loads to the same state", "[.][offline]") {
  const char* spec = std::getenv("ZERO_CKPT_OFFLINE");
  REQUIRE(spec != nullptr);  // <resharded root>:<original name>
  std::string s = spec;
  auto colon = s.find(':');
  REQUIRE(colon != std::string::npos);
  const std::string dir = test_dir();
  const std::string resharded = dir + "/" + s.substr(0, colon), original = dir + "/" + s.substr(colon + 1);
  auto ref10 = reference(10);
  for (int stage = 0; stage <= 3; ++stage) {
    Case c;
    c.stage = stage;
    INFO("stage " << stage);
    load_and_continue(resharded, original + ".master", c, ref10);
  }
  // The rewritten shards are for this world size: one per rank.
  ctx().comm().barrier();
  const std::string step_dir = resolve_checkpoint(resharded);
  int shards = 0;
  for (const auto& ent : fs::directory_iterator(step_dir))
    if (ent.path().filename().string().rfind("shard_", 0) == 0) ++shards;
  CHECK(shards == ctx().world_size());
}
