// Checkpoints at one world size: bit-exact resume at every stage and offload mode, retention,
// saves stopped part way (the previous checkpoint must stay loadable), and damaged or
// mismatched checkpoints reported with the file and the field, on every rank, without a hang.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint_common.hpp"

using namespace zero;
using namespace zero::test;
using namespace zero::test::cktest;
namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {

// An engine for the case, or null when the build cannot offload to NVMe yet.
std::unique_ptr<Engine> make_engine(const Case& c, Layout layout = make_ckpt_layout()) {
  try {
    return std::make_unique<Engine>(ctx(), make_config(c, ctx().world_size()), std::move(layout));
  } catch (const Error& e) {
    if (c.offload == "nvme" && std::string(e.what()).find("not available") != std::string::npos) return nullptr;
    throw;
  }
}

// The case's layout: make_ckpt_layout(), with the GPT-2 decay rule when the case asks for it.
Layout case_layout(const Case& c) {
  Layout l = make_ckpt_layout();
  if (c.mixed_decay) l.decay_matrices_only();
  return l;
}

std::unique_ptr<Engine> fresh_engine(const Case& c) {
  auto e = make_engine(c, case_layout(c));
  if (e) e->init_params(init_value);
  return e;
}

// Flips one byte of a file in place.
void flip_byte(const std::string& path, std::uint64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  REQUIRE(f.good());
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x5a);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

void check_resume(const Case& c, const std::string& root) {
  // Straight run: 10 steps.
  std::vector<double> losses_a;
  Snapshot a;
  {
    auto e = fresh_engine(c);
    if (!e) {
      WARN("skipped " << c.name() << ": offload_optimizer.device nvme is not available in this build");
      return;
    }
    for (int s = 0; s < 10; ++s) losses_a.push_back(train_step(*e, c));
    a = snapshot(*e);
  }
  // 5 steps, save, a new engine, load, 5 steps.
  std::vector<double> losses_b;
  Snapshot at_save;
  const ClientState client = {
      {"data.position", "5"}, {"rng", std::string("\x00\xff\x01 \"\\\n", 7)}, {"", "empty key"}};
  {
    auto e = fresh_engine(c);
    for (int s = 0; s < 5; ++s) losses_b.push_back(train_step(*e, c));
    at_save = snapshot(*e);
    save_checkpoint(*e, root, client);
  }
  auto e = make_engine(c, case_layout(c));
  ClientState got = load_checkpoint(*e, root);
  CHECK(got == client);
  CHECK(e->global_step() == 5);
  Snapshot loaded = snapshot(*e);
  require_bitwise(loaded.master, at_save.master, "master right after load");
  require_bitwise(loaded.params, at_save.params, "params right after load");
  for (int s = 0; s < 5; ++s) losses_b.push_back(train_step(*e, c));
  Snapshot b = snapshot(*e);
  CHECK(b.step == a.step);
  require_bitwise(b.master, a.master, "master after 10 steps");
  require_bitwise(b.params, a.params, "params after 10 steps");
  for (std::size_t s = 0; s < losses_a.size(); ++s) {
    INFO("loss of step " << s);
    CHECK(std::bit_cast<std::uint64_t>(losses_a[s]) == std::bit_cast<std::uint64_t>(losses_b[s]));
  }
}

}  // namespace

TEST_CASE("resume is bit-exact: 10 steps == 5 + save + new engine + load + 5") {
  std::string dir = shared_temp_dir("ckpt_resume");
  std::vector<Case> cases;
  for (int stage = 0; stage <= 3; ++stage)
    for (const char* off : {"none", "cpu", "nvme"}) {
      if (stage == 0 && std::string(off) != "none") continue;  // offload needs stage >= 1
      Case c;
      c.stage = stage;
      c.offload = off;
      cases.push_back(c);
    }
  {
    Case c;  // bf16 compute: params are the rounded master
    c.stage = 2;
    c.dtype = DType::bf16;
    cases.push_back(c);
  }
  for (int stage : {1, 3}) {
    Case c;  // fp16 with a loss scale that grows until it overflows: skipped steps, scaler state
    c.stage = stage;
    c.dtype = DType::f16;
    c.dynamic_fp16 = true;
    cases.push_back(c);
  }
  {
    Case c;  // SGD with momentum: one moment
    c.stage = 2;
    c.optimizer = "SGD";
    c.offload = "cpu";
    cases.push_back(c);
  }
  for (const char* off : {"none", "cpu"}) {
    Case c;  // weight decay on some parameters only: the resumed steps decay the same ones
    c.stage = 2;
    c.offload = off;
    c.mixed_decay = true;
    cases.push_back(c);
  }
  {
    Case c;  // accumulation and a scheduler mid-warmup
    c.stage = 3;
    c.gas = 2;
    c.scheduler = true;
    cases.push_back(c);
  }
  int k = 0;
  for (auto c : cases) {
    std::string sub = dir + "/case" + std::to_string(k++);
    c.nvme_dir = sub + "/nvme";
    if (ctx().rank() == 0) fs::create_directories(c.nvme_dir);
    ctx().comm().barrier();
    SECTION(c.name()) { check_resume(c, sub + "/ckpt"); }
  }
  remove_dir(dir);
}

TEST_CASE("fp16 resume crosses skipped steps with the scaler state intact") {
  // The dynamic-fp16 cases above only prove something if steps were skipped before the save.
  std::string dir = shared_temp_dir("ckpt_fp16");
  Case c;
  c.stage = 1;
  c.dtype = DType::f16;
  c.dynamic_fp16 = true;
  auto e = fresh_engine(c);
  int skipped = 0;
  for (int s = 0; s < 5; ++s) train_step(*e, c, &skipped);
  CHECK(skipped > 0);
  save_checkpoint(*e, dir);
  auto e2 = make_engine(c);
  load_checkpoint(*e2, dir);
  CHECK(e2->loss_scale() == e->loss_scale());
  remove_dir(dir);
}

// A fresh engine at `stage` saving into its own directory, keeping the last `keep_last` saves.
struct SavingRun {
  std::string dir;
  Case c;
  std::unique_ptr<Engine> e;
  CheckpointOptions o;

  SavingRun(const char* name, int stage, int keep_last) : dir(shared_temp_dir(name)) {
    c.stage = stage;
    e = fresh_engine(c);
    o.keep_last = keep_last;
  }
  // `steps` training steps, each followed by a save.
  void train_and_save(int steps) {
    for (int s = 0; s < steps; ++s) {
      train_step(*e, c);
      save_checkpoint(*e, dir, {}, o);
    }
  }
};

TEST_CASE("keep_last keeps the newest checkpoints; re-saving the latest step is refused") {
  SavingRun run("ckpt_keep", 1, 2);
  run.train_and_save(4);
  ctx().comm().barrier();
  CHECK(list_checkpoints(run.dir) == std::vector<std::int64_t>{3, 4});
  CHECK(resolve_checkpoint(run.dir) == run.dir + "/step_00000004");
  CHECK_THROWS_WITH(save_checkpoint(*run.e, run.dir), Contains("already exists and is the latest"));
  // keep_last 0 keeps everything.
  run.o.keep_last = 0;
  run.train_and_save(3);
  ctx().comm().barrier();
  CHECK(list_checkpoints(run.dir) == std::vector<std::int64_t>{3, 4, 5, 6, 7});
  // Tag by number, and a missing one named with what exists.
  auto e2 = make_engine(run.c);
  load_checkpoint(*e2, run.dir, "4");
  CHECK(e2->global_step() == 4);
  CHECK_THROWS_WITH(load_checkpoint(*e2, run.dir, "9"), Contains("step_00000009") && Contains("available"));
  CHECK_THROWS_WITH(load_checkpoint(*e2, run.dir, "newest"), Contains("neither"));
  remove_dir(run.dir);
}

TEST_CASE("a model that diverged is not saved, and no finite checkpoint is pruned for it") {
  SavingRun run("ckpt_diverged", 2, 2);
  run.train_and_save(2);
  // A rate past fp32's range: the next update leaves weights that are not finite, as a
  // diverged run does (the loss follows).
  run.e->set_lr(1e300);
  train_step(*run.e, run.c);
  bool finite = true;
  for (int u = 0; u < run.e->layout().num_units(); ++u)
    for (float v : run.e->full_master(u)) finite = finite && std::isfinite(v);
  REQUIRE_FALSE(finite);
  for (int s = 0; s < 3; ++s) {
    CHECK_THROWS_WITH(save_checkpoint(*run.e, run.dir, {}, run.o),
                      Contains("save_checkpoint: step " + std::to_string(3 + s) + " was not saved") &&
                          Contains("which is not finite (the training diverged)") && Contains("none is pruned"));
    train_step(*run.e, run.c);
  }
  ctx().comm().barrier();
  CHECK(list_checkpoints(run.dir) == std::vector<std::int64_t>{1, 2});
  CHECK(resolve_checkpoint(run.dir) == run.dir + "/step_00000002");
  for (const auto& entry : fs::directory_iterator(run.dir))
    CHECK(entry.path().filename().string().rfind(".tmp", 0) != 0);
  auto e2 = make_engine(run.c);
  load_checkpoint(*e2, run.dir);
  CHECK(e2->global_step() == 2);
  ctx().comm().barrier();
  remove_dir(run.dir);
}

TEST_CASE("a save stopped at any point leaves a loadable latest checkpoint") {
  for (const char* point : {"mid_shard", "after_shard", "before_rename", "after_rename", "after_latest"}) {
    SECTION(point) {
      std::string dir = shared_temp_dir("ckpt_fail");
      Case c;
      c.stage = 2;
      auto e = fresh_engine(c);
      for (int s = 0; s < 3; ++s) train_step(*e, c);
      save_checkpoint(*e, dir, {{"at", "3"}});
      Snapshot s3 = snapshot(*e);
      for (int s = 0; s < 2; ++s) train_step(*e, c);
      Snapshot s5 = snapshot(*e);
      ::setenv("ZERO_CKPT_FAIL_AT", point, 1);
      CHECK_THROWS_WITH(save_checkpoint(*e, dir, {{"at", "5"}}), Contains("ZERO_CKPT_FAIL_AT"));
      ::unsetenv("ZERO_CKPT_FAIL_AT");
      ctx().comm().barrier();
      for (const auto& ent : fs::directory_iterator(dir))
        CHECK(ent.path().filename().string().rfind(".tmp_", 0) != 0);  // an error cleans up

      bool committed = std::string(point) == "after_latest";
      auto e2 = make_engine(c);
      ClientState cs = load_checkpoint(*e2, dir);
      CHECK(cs.at("at") == (committed ? "5" : "3"));
      require_bitwise(snapshot(*e2).master, committed ? s5.master : s3.master, "loaded master");
      if (std::string(point) == "after_rename") {
        // Complete but not yet named by latest: loadable by number, replaced by the next save.
        auto e3 = make_engine(c);
        load_checkpoint(*e3, dir, "5");
        require_bitwise(snapshot(*e3).master, s5.master, "step 5 by number");
      }
      if (!committed) {
        // The resumed run reaches step 5 again and saves over the leftover.
        for (int s = 0; s < 2; ++s) train_step(*e2, c);
        save_checkpoint(*e2, dir, {{"at", "5 again"}});
        auto e4 = make_engine(c);
        CHECK(load_checkpoint(*e4, dir).at("at") == "5 again");
        require_bitwise(snapshot(*e4).master, s5.master, "resumed run at step 5");
      }
      remove_dir(dir);
    }
  }
}

TEST_CASE("damaged and mismatched checkpoints are errors naming the file and the field") {
  const int world = ctx().world_size(), rank = ctx().rank();
  std::string dir = shared_temp_dir("ckpt_bad");
  Case c;
  c.stage = 1;
  {
    auto e = fresh_engine(c);
    for (int s = 0; s < 2; ++s) train_step(*e, c);
    save_checkpoint(*e, dir + "/good");
  }
  const std::string step = "/step_00000002";
  // A copy of the good checkpoint with one change made by rank 0.
  auto variant = [&](const std::string& name, auto&& change) {
    std::string root = dir + "/" + name;
    if (rank == 0) {
      fs::create_directories(root);
      fs::copy(dir + "/good" + step, root + step, fs::copy_options::recursive);
      fs::copy_file(dir + "/good/latest", root + "/latest");
      change(root + step);
    }
    ctx().comm().barrier();
    return root;
  };
  auto expect_error = [&](const std::string& root, const std::vector<std::string>& parts,
                          Layout layout = make_ckpt_layout()) {
    auto e = make_engine(c, std::move(layout));
    try {
      load_checkpoint(*e, root);
      FAIL("load_checkpoint accepted " << root);
    } catch (const Error& err) {
      std::string msg = err.what();
      INFO(msg);
      for (const auto& p : parts) CHECK(msg.find(p) != std::string::npos);
    }
  };
  auto shard = [](int r) { return "shard_0000" + std::to_string(r) + ".ckpt"; };
  const std::string last = shard(world - 1);
  // Shard 1 ends with a slice of "big" at every world size (at world 3 shard 2 holds nothing:
  // every unit fits in the first two 128-element slices).
  const std::string data_shard = shard(world > 1 ? 1 : 0);

  SECTION("a flipped byte in one shard's data (read by one rank only)") {
    std::string root = variant("flip", [&](const std::string& d) {
      flip_byte(d + "/" + data_shard, fs::file_size(d + "/" + data_shard) - 3);
    });
    expect_error(root, {data_shard, "checksum", "big"});
    // The half-loaded engine refuses to train.
    auto e = make_engine(c);
    CHECK_THROWS(load_checkpoint(*e, root));
    CHECK_THROWS_WITH(e->gather(0), Contains("not initialised"));
  }
  SECTION("a truncated shard") {
    std::string root = variant("trunc", [&](const std::string& d) {
      fs::resize_file(d + "/shard_00000.ckpt", fs::file_size(d + "/shard_00000.ckpt") - 10);
    });
    expect_error(root, {"shard_00000.ckpt", "payload_bytes", "truncated"});
  }
  SECTION("a shard shorter than its header") {
    std::string root =
        variant("trunc_header", [&](const std::string& d) { fs::resize_file(d + "/shard_00000.ckpt", 20); });
    expect_error(root, {"shard_00000.ckpt", "header", "truncated"});
  }
  SECTION("a missing shard") {
    std::string root = variant("missing", [&](const std::string& d) { fs::remove(d + "/" + last); });
    expect_error(root, {last, "cannot open"});
  }
  SECTION("truncated metadata") {
    std::string root = variant("meta_trunc", [&](const std::string& d) {
      fs::resize_file(d + "/metadata.ckpt", fs::file_size(d + "/metadata.ckpt") / 2);
    });
    expect_error(root, {"metadata.ckpt", "payload_bytes"});
  }
  SECTION("a flipped byte in the metadata") {
    std::string root = variant("meta_flip", [&](const std::string& d) { flip_byte(d + "/metadata.ckpt", 200); });
    expect_error(root, {"metadata.ckpt", "index_checksum"});
  }
  SECTION("a flipped byte in a shard header") {
    std::string root = variant("head_flip", [&](const std::string& d) { flip_byte(d + "/shard_00000.ckpt", 20); });
    expect_error(root, {"shard_00000.ckpt", "header.checksum"});
  }
  SECTION("a shard from another checkpoint") {
    std::string other = dir + "/other";
    {
      auto e = fresh_engine(c);
      for (int s = 0; s < 2; ++s) train_step(*e, c);
      train_step(*e, c);  // different values, same step count below
      save_checkpoint(*e, other);
    }
    std::string root = variant("swapped", [&](const std::string& d) {
      fs::copy_file(other + "/step_00000003/shard_00000.ckpt", d + "/shard_00000.ckpt",
                    fs::copy_options::overwrite_existing);
    });
    expect_error(root, {"shard_00000.ckpt", "does not belong to this checkpoint"});
  }
  SECTION("a malformed latest pointer") {
    std::string root = variant(
        "latest", [&](const std::string& d) { std::ofstream(fs::path(d).parent_path() / "latest") << "../../etc\n"; });
    expect_error(root, {"latest", "content"});
  }
  SECTION("another model: a shape differs") {
    Layout l;
    l.add_unit("embed", {{"embed.w", {7, 5}}, {"embed.b", {3}}});
    l.add_unit("layer0", {{"layer0.w", {11, 4}}, {"layer0.b", {5}}});
    l.add_unit("layer1", {{"layer1.w", {13}}});
    l.add_unit("head", {{"head.w", {4, 4}}});
    l.add_unit("big", {{"big.w", {200}}, {"big.s", {1}}});
    expect_error(dir + "/good", {"metadata.ckpt", "units[1].params[0].shape", "[11, 3]", "[11, 4]"}, std::move(l));
  }
  SECTION("another model: a name differs") {
    Layout l;
    l.add_unit("embed", {{"embed.w", {7, 5}}, {"embed.bias", {3}}});
    l.add_unit("layer0", {{"layer0.w", {11, 3}}, {"layer0.b", {5}}});
    l.add_unit("layer1", {{"layer1.w", {13}}});
    l.add_unit("head", {{"head.w", {4, 4}}});
    l.add_unit("big", {{"big.w", {200}}, {"big.s", {1}}});
    expect_error(dir + "/good", {"metadata.ckpt", "units[0].params[1].name", "embed.bias"}, std::move(l));
  }
  SECTION("another compute dtype, unless allowed") {
    Case b = c;
    b.dtype = DType::bf16;
    auto e = make_engine(b);
    CHECK_THROWS_WITH(load_checkpoint(*e, dir + "/good"), Contains("compute_dtype") && Contains("metadata.ckpt"));
    CheckpointLoadOptions o;
    o.allow_config_change = true;
    load_checkpoint(*e, dir + "/good", "latest", o);
    CHECK(e->global_step() == 2);
  }
  SECTION("another optimizer state shape (SGD has one moment)") {
    Case s = c;
    s.optimizer = "SGD";
    auto e = make_engine(s);
    CHECK_THROWS_WITH(load_checkpoint(*e, dir + "/good"), Contains("optimizer_moments"));
  }
  SECTION("load in the middle of a step") {
    auto e = fresh_engine(c);
    int last_unit = e->layout().num_units() - 1;
    {
      auto p = e->gather(last_unit);
      e->grads(last_unit);
      e->reduce(last_unit);
    }
    CHECK_THROWS_WITH(load_checkpoint(*e, dir + "/good"), Contains("middle of a step"));
  }
  remove_dir(dir);
}
