// Checkpoints of a model split over a tensor x pipeline grid (the model of split_model.hpp).
// A process cannot change its world size, so the work is split over ctest entries sharing
// ZERO_GRID_CKPT_DIR:
//   [save]  at 4 ranks, for TP 2 x DP 2 and PP 2 x DP 2: 3 steps, save, 3 more steps and save
//           again (the uninterrupted run); a fresh engine resumed from step 3 on the same grid
//           matches it bit for bit (norms and every rank's master). (Loads onto another grid:
//           test_checkpoint_regrid.cpp.) A save that fails on one rank of one position leaves no new step. A
//           checkpoint whose positions disagree, or whose shards of two positions were swapped
//           (the metadata's records rewritten to match), is refused on every rank, naming what.
//   [load]  at 2 ranks (TP 2 x DP 1, PP 2 x DP 1): the step-3 checkpoint resumed at the new
//           data-parallel size, saved again at once: its whole model (the grid's parts put
//           together) equals the saved one bit for bit; after 3 more steps it equals the
//           uninterrupted run's within fp32 reduction-order error.
// The tags are hidden: running the executable without one runs nothing.
#include <catch2/catch.hpp>

#include <stdlib.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/format.hpp"
#include "checkpoint/json.hpp"
#include "split_model.hpp"
#include "zero/checkpoint.hpp"
#include "zero/comm.hpp"
#include "zero/context.hpp"
#include "zero/engine.hpp"
#include "zero/error.hpp"
#include "zero/groups.hpp"

using namespace zero;
using namespace zero::test::split;

namespace {

std::string test_dir() {
  const char* d = std::getenv("ZERO_GRID_CKPT_DIR");
  REQUIRE(d != nullptr);  // set by ctest (test/mpi/CMakeLists.txt)
  return d;
}

// ZeRO stage 2 under TP (the optimizer state and gradients sharded over the data group), stage 1
// under PP (what pipelines are run with).
const std::vector<Grid> kGrids = {{2, 1, 2}, {1, 2, 1}};

// The whole model of a checkpoint, flat in unit order, with its tensors' names.
std::vector<float> whole_model(const std::string& root, const std::string& tag, std::vector<std::string>* names) {
  std::vector<float> all;
  for_each_checkpoint_tensor(root, tag, [&](const CheckpointTensor& t, std::span<const float> v) {
    if (names) names->push_back(t.unit + "." + t.name);
    all.insert(all.end(), v.begin(), v.end());
  });
  return all;
}

// A copy of checkpoint root `from` at `to` whose step `step` has been edited by `edit` (on rank
// 0; every rank waits for it): its metadata's JSON, re-signed, with each shard record rewritten
// from the file under its name, as a tool that rebuilds the metadata from the files would.
void edited_copy(Context& ctx, const std::string& from, const std::string& to, const std::string& step,
                 const std::function<void(const std::string&, json::Json&)>& edit) {
  if (ctx.rank() == 0) {
    std::filesystem::remove_all(to);
    std::filesystem::copy(from, to, std::filesystem::copy_options::recursive);
    std::filesystem::remove(to + "/zero.lock");
    const std::string dir = to + "/" + step, path = dir + "/" + ckpt::kMetadataFile;
    json::Json doc;
    {
      ckpt::Fd f = ckpt::Fd::open_read(path);
      doc = json::parse(ckpt::read_index(f, ckpt::read_header(f, ckpt::FileKind::metadata)), path);
    }
    edit(dir, doc);
    for (auto& pos : doc["grid"]["positions"])
      for (auto& s : pos["shards"]) {
        ckpt::Fd f = ckpt::Fd::open_read(dir + "/" + s["file"].get<std::string>());
        const ckpt::FileHeader h = ckpt::read_header(f, ckpt::FileKind::shard);
        s["bytes"] = ckpt::kHeaderBytes + h.payload_bytes;
        s["index_checksum"] = json::hex64(h.index_checksum);
      }
    std::filesystem::remove(path);
    ckpt::write_small_file(path, ckpt::FileKind::metadata, json::dump_pretty(doc, "test metadata"));
  }
  ctx.comm().barrier();
}

// The unsplit model's size: what the whole model read back must hold.
std::size_t model_elements() {
  std::size_t n = 0;
  for (const auto& u : kModel)
    for (const auto& p : u.params) n += static_cast<std::size_t>(p.rows * p.cols);
  return n;
}

}  // namespace

TEST_CASE("grid checkpoints: saved at TP or PP x DP 2, resumed bit for bit on the same grid", "[.][save]") {
  Context& ctx = *Context::current();
  REQUIRE(ctx.world_size() == 4);
  const std::string dir = test_dir();
  if (ctx.rank() == 0) {  // a fresh directory: the saves below start from step 0 again
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  ctx.comm().barrier();
  for (const Grid& g : kGrids) {
    INFO(g.name() << " stage " << g.stage);
    const std::string root = dir + "/" + g.name();
    std::vector<double> norms;
    std::vector<float> master;
    {
      Job a(ctx, g);
      norms = a.train(0, 3);
      save_checkpoint(a.engine, root, {{"grid", g.name()}}, {.keep_last = 0});
      const auto more = a.train(3, 6);
      norms.insert(norms.end(), more.begin(), more.end());
      save_checkpoint(a.engine, root, {{"grid", g.name()}}, {.keep_last = 0});
      master = a.master();
    }
    Job b(ctx, g);
    const ClientState client = load_checkpoint(b.engine, root, "3");
    REQUIRE(client.at("grid") == g.name());
    const auto resumed = b.train(3, 6);
    for (std::size_t s = 0; s < resumed.size(); ++s) REQUIRE(resumed[s] == norms[3 + s]);
    const auto got = b.master();
    REQUIRE(got.size() == master.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      INFO("element " << i << ": " << got[i] << " vs " << master[i]);
      REQUIRE(std::bit_cast<std::uint32_t>(got[i]) == std::bit_cast<std::uint32_t>(master[i]));
    }
    if (ctx.rank() == 0) {
      // The whole model: every parameter once, whole shapes.
      std::vector<std::string> names;
      REQUIRE(whole_model(root, "6", &names).size() == model_elements());
      REQUIRE(names == std::vector<std::string>{"embed.w", "embed.b", "mlp.w", "mlp.b", "big.w", "big.g"});
      std::ostringstream listing;
      REQUIRE(inspect_checkpoint(root, listing));
      const std::string last = g.tensor == 2 ? "position tensor 1, pipeline 0" : "position tensor 0, pipeline 1";
      CHECK_THAT(listing.str(), Catch::Contains("grid TP " + std::to_string(g.tensor) + " x PP " +
                                                std::to_string(g.pipeline) + " x DP 2") &&
                                    Catch::Contains(last) && Catch::Contains("all checksums ok"));
    }
  }

  // A save that fails on one rank of one position is no checkpoint: every rank gets the error,
  // and latest stays at the previous complete step.
  {
    Job c(ctx, {2, 1, 2});
    c.train(0, 1);
    save_checkpoint(c.engine, dir + "/partial", {}, {.keep_last = 0});
    c.train(1, 2);
    if (ctx.rank() == 3) ::setenv("ZERO_CKPT_FAIL_AT", "after_shard", 1);
    REQUIRE_THROWS_WITH(save_checkpoint(c.engine, dir + "/partial", {}, {.keep_last = 0}),
                        Catch::Contains("stopped at 'after_shard'"));
    ::unsetenv("ZERO_CKPT_FAIL_AT");
    if (ctx.rank() == 0) {
      REQUIRE(list_checkpoints(dir + "/partial") == std::vector<std::int64_t>{1});
      REQUIRE(resolve_checkpoint(dir + "/partial") == dir + "/partial/step_00000001");
    }
  }

  // Positions that disagree: every rank refuses with the same words as inspect and export (before,
  // only the rank of the edited position did, comparing its own part with its engine).
  {
    edited_copy(ctx, dir + "/tp2_pp1", dir + "/disagree", "step_00000003",
                [](const std::string&, json::Json& d) { d["grid"]["positions"][1]["units"][0]["name"] = "embed2"; });
    Job j(ctx, {2, 1, 2});
    REQUIRE_THROWS_WITH(load_checkpoint(j.engine, dir + "/disagree", "3"),
                        Catch::Contains("the positions of the grid TP 2 x PP 1 disagree (1 problem)") &&
                            Catch::Contains("position (tensor 1, pipeline 0): field 'grid.positions[1].units[0].name' "
                                            "= \"embed2\", position (tensor 0, pipeline 0) has \"embed\""));
  }
  // Two positions' shards swapped (the same shapes: before, each tensor rank loaded the other's part).
  {
    edited_copy(ctx, dir + "/tp2_pp1", dir + "/swapped", "step_00000003", [](const std::string& step, json::Json&) {
      const std::string a = step + "/shard_t00_p00_00000.ckpt", b = step + "/shard_t01_p00_00000.ckpt";
      std::filesystem::rename(a, step + "/swap.tmp");
      std::filesystem::rename(b, a);
      std::filesystem::rename(step + "/swap.tmp", b);
    });
    Job j(ctx, {2, 1, 2});
    REQUIRE_THROWS_WITH(load_checkpoint(j.engine, dir + "/swapped", "3"),
                        Catch::Contains("shard_t00_p00_00000.ckpt': field 'index.position' records position (tensor 1, "
                                        "pipeline 0), data-parallel rank 0, but the file was found in the place of "
                                        "position (tensor 0, pipeline 0), rank 0"));
  }
}

TEST_CASE("grid checkpoints: resumed at another data-parallel size with the same grid", "[.][load]") {
  Context& ctx = *Context::current();
  REQUIRE(ctx.world_size() == 2);
  const std::string dir = test_dir();
  for (const Grid& g : kGrids) {
    INFO(g.name() << " resumed at DP 1");
    const std::string root = dir + "/" + g.name(), again = dir + "/" + g.name() + "_dp1";
    Job j(ctx, g);
    REQUIRE(j.groups.data_size() == 1);
    load_checkpoint(j.engine, root, "3");
    save_checkpoint(j.engine, again, {}, {.keep_last = 0});
    const auto norms = j.train(3, 6);
    for (double n : norms) REQUIRE(n > 0.5);  // clipping active
    save_checkpoint(j.engine, again, {}, {.keep_last = 0});
    if (ctx.rank() != 0) continue;
    // Loaded as saved: the same whole model, bit for bit.
    const auto saved = whole_model(root, "3", nullptr), loaded = whole_model(again, "3", nullptr);
    REQUIRE(saved.size() == model_elements());
    REQUIRE(loaded.size() == saved.size());
    for (std::size_t i = 0; i < saved.size(); ++i)
      REQUIRE(std::bit_cast<std::uint32_t>(saved[i]) == std::bit_cast<std::uint32_t>(loaded[i]));
    // Trained on: the uninterrupted 4-rank run's model within reduction-order error.
    const auto ref = whole_model(root, "6", nullptr), got = whole_model(again, "6", nullptr);
    REQUIRE(got.size() == ref.size());
    double worst = 0;
    for (std::size_t i = 0; i < ref.size(); ++i) {
      INFO("element " << i << ": " << got[i] << " vs " << ref[i]);
      REQUIRE(std::abs(got[i] - ref[i]) <= 1e-5f * std::max(1.0f, std::abs(ref[i])));
      worst = std::max(worst, static_cast<double>(std::abs(got[i] - ref[i])));
      REQUIRE(got[i] != saved[i]);  // every element trained (no gradient is exactly zero)
    }
    WARN(g.name() << ": DP 1 vs DP 2 after 3 resumed steps: max abs difference " << worst);
  }
}
