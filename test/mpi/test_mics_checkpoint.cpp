// Checkpoints of MiCS runs (mics_shard_size) stay portable. A process cannot change its world
// size, so the round trip is split over ctest entries sharing ZERO_MICS_CKPT_DIR, in order:
//   [save]  4 ranks (two simulated nodes), N = 2, stages 1 and 3: 5 steps, saved to mics_s<S>/
//           by the first group alone (2 shards, world 2 in the metadata), with the exact master
//           (.master); a resume at the same setting continues bit for bit (5 more steps, whose
//           master goes to mics_s<S>.master10); plain ZeRO at 4 ranks loads it too.
//   [plain] 2 ranks, plain ZeRO: loads mics_s<S> (the master bit for bit), saves it again as
//           plain2_s<S>/, then trains on against the double-precision reference.
//   [back]  4 ranks, N = 2: loads plain2_s<S>; 5 steps reach mics_s<S>.master10 bit for bit.
// Every run trains on the same world-independent global batch (test_checkpoint_common.hpp).
// The tags are hidden: running the executable without one runs nothing.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "checkpoint_common.hpp"

using namespace zero;
using namespace zero::test;
using namespace zero::test::cktest;

namespace {

std::string test_dir() { return dir_from_env("ZERO_MICS_CKPT_DIR"); }

std::vector<std::vector<float>> masters(Engine& e) { return snapshot(e).master; }

void write_master(const std::string& path, const std::vector<std::vector<float>>& m) {
  if (ctx().rank() != 0) return;
  std::ofstream out(path, std::ios::binary);
  for (const auto& u : m)
    out.write(reinterpret_cast<const char*>(u.data()), static_cast<std::streamsize>(u.size() * sizeof(float)));
  REQUIRE(out.good());
}

std::vector<std::vector<float>> read_master(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  INFO("reading " << path << " (written by the earlier test_mics_checkpoint entries)");
  REQUIRE(in.good());
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const Layout l = make_ckpt_layout();
  std::vector<std::vector<float>> m;
  std::size_t at = 0;
  for (int u = 0; u < l.num_units(); ++u) {
    std::vector<float> v(static_cast<std::size_t>(l.unit(u).numel));
    REQUIRE(at + v.size() * sizeof(float) <= bytes.size());
    std::memcpy(v.data(), bytes.data() + at, v.size() * sizeof(float));
    at += v.size() * sizeof(float);
    m.push_back(std::move(v));
  }
  REQUIRE(at == bytes.size());
  return m;
}

Case mics_case(int stage, int mics) {
  Case c;
  c.stage = stage;
  c.mics = mics;
  return c;
}

std::string base(const char* kind, int stage) { return test_dir() + "/" + kind + "_s" + std::to_string(stage); }

}  // namespace

TEST_CASE("save at mics_shard_size 2 on 4 ranks; resume there bit for bit", "[.][save]") {
  REQUIRE(ctx().world_size() == 4);
  if (ctx().rank() == 0) {
    std::filesystem::remove_all(test_dir());
    std::filesystem::create_directories(test_dir());
  }
  ctx().comm().barrier();
  for (int stage : {1, 3}) {
    const Case c = mics_case(stage, 2);
    INFO(c.name());
    Engine e(ctx(), make_config(c, 4), make_ckpt_layout());
    e.init_params(init_value);
    for (int s = 0; s < 5; ++s) train_step(e, c);
    const auto saved = masters(e);
    save_checkpoint(e, base("mics", stage));
    write_master(base("mics", stage) + ".master", saved);
    // The first group wrote the checkpoint: one shard per rank of a group, for a world of 2.
    ctx().comm().barrier();
    const std::string step_dir = resolve_checkpoint(base("mics", stage));
    std::vector<std::string> shards;
    for (const auto& ent : std::filesystem::directory_iterator(step_dir))
      if (ent.path().filename().string().rfind("shard_", 0) == 0) shards.push_back(ent.path().filename().string());
    std::sort(shards.begin(), shards.end());
    REQUIRE(shards == std::vector<std::string>{"shard_00000.ckpt", "shard_00001.ckpt"});
    for (int s = 0; s < 5; ++s) train_step(e, c);
    const auto ten = masters(e);
    write_master(base("mics", stage) + ".master10", ten);

    // The same setting resumes bit for bit: master, moments and counters came back.
    Engine again(ctx(), make_config(c, 4), make_ckpt_layout());
    load_checkpoint(again, base("mics", stage));
    REQUIRE(again.global_step() == 5);
    require_bitwise(masters(again), saved, "loaded master");
    for (int s = 0; s < 5; ++s) train_step(again, c);
    require_bitwise(masters(again), ten, "master 5 steps after the resume");

    // Plain ZeRO over all 4 ranks re-slices it.
    Engine plain(ctx(), make_config(mics_case(stage, -1), 4), make_ckpt_layout());
    load_checkpoint(plain, base("mics", stage));
    require_bitwise(masters(plain), saved, "master loaded by plain ZeRO at 4 ranks");
  }
  ctx().comm().barrier();
}

TEST_CASE("resume plain ZeRO on 2 ranks from the MiCS checkpoint", "[.][plain]") {
  REQUIRE(ctx().world_size() == 2);
  const auto ref10 = reference(10);
  for (int stage : {1, 3}) {
    const Case c = mics_case(stage, -1);
    INFO(c.name() << " loading " << base("mics", stage));
    Engine e(ctx(), make_config(c, 2), make_ckpt_layout());
    load_checkpoint(e, base("mics", stage));
    REQUIRE(e.global_step() == 5);
    require_bitwise(masters(e), read_master(base("mics", stage) + ".master"), "loaded master");
    save_checkpoint(e, base("plain2", stage));
    for (int s = 0; s < 5; ++s) train_step(e, c);
    require_near_reference(snapshot(e).params, ref10);
  }
}

TEST_CASE("back to mics_shard_size 2 on 4 ranks from the plain 2-rank checkpoint", "[.][back]") {
  REQUIRE(ctx().world_size() == 4);
  for (int stage : {1, 3}) {
    const Case c = mics_case(stage, 2);
    INFO(c.name() << " loading " << base("plain2", stage));
    Engine e(ctx(), make_config(c, 4), make_ckpt_layout());
    load_checkpoint(e, base("plain2", stage));
    REQUIRE(e.global_step() == 5);
    require_bitwise(masters(e), read_master(base("mics", stage) + ".master"), "loaded master");
    for (int s = 0; s < 5; ++s) train_step(e, c);
    require_bitwise(masters(e), read_master(base("mics", stage) + ".master10"),
                    "master 5 steps after the round trip, against the uninterrupted MiCS run");
  }
}
