// Checkpoints resumed on another tensor x pipeline grid (the model of split_model.hpp, with the
// last pipeline part's tied copy of embed.w), on 4 ranks:
//   [resume] trained at TP 2 x PP 2 x DP 1 for 10 steps and saved, resumed at TP 1 x PP 1 x DP 4,
//            TP 1 x PP 2 x DP 2, TP 2 x PP 1 x DP 2 and TP 4 x PP 1 x DP 1, at stages 1 and 3.
//            A dry run first leaves the engine as it was. Saved again at once, the whole model and every optimizer
//            moment put together from the new checkpoint equal those of the old one bit for bit. The next 5 steps'
//            gradient norms and the weights after them equal, within 1e-6 relative, a run on the new grid whose state
//            the test cut itself from the old checkpoint's whole tensors (its own index arithmetic, not the loader's).
//            zero-ckpt reshard's rewrite for each grid holds the same state, and a plain resume from it trains as the
//            direct resume did. zero-ckpt inspect lists the tensor sizes the checkpoint's splits allow.
//   [memory] a load at TP 1 x DP 4 (stage 3) of a TP 2 x PP 2 checkpoint of 4 units of 2M
//            elements grows each rank's resident memory by at most its own shard plus one
//            unit plus 8 MiB, less than the whole model (the figures are printed).
//   [refuse] models that do not match the checkpoint's whole model are refused on every rank
//            with a message naming the parameter and both grids; zero-ckpt reshard refuses a
//            grid it cannot write.
// The tags are hidden: running the executable without one runs nothing.
#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/format.hpp"
#include "split_model.hpp"
#include "zero/checkpoint.hpp"
#include "zero/comm.hpp"
#include "zero/context.hpp"
#include "zero/engine.hpp"
#include "zero/engine_state.hpp"
#include "zero/error.hpp"
#include "zero/groups.hpp"

using namespace zero;
using namespace zero::test::split;

namespace {

std::string test_dir() {
  const char* d = std::getenv("ZERO_REGRID_CKPT_DIR");
  REQUIRE(d != nullptr);  // set by ctest (test/mpi/CMakeLists.txt)
  return d;
}

// "unit.param" -> the whole tensor's arrays: master, then each moment.
using WholeState = std::map<std::string, std::vector<std::vector<float>>>;

WholeState whole_state(const std::string& root, const std::string& tag) {
  WholeState out;
  for_each_checkpoint_state(root, tag, [&](const CheckpointTensor& t, std::span<const std::span<const float>> a) {
    auto& v = out[t.unit + "." + t.name];
    for (const auto& s : a) v.emplace_back(s.begin(), s.end());
  });
  return out;
}

// Sets the engine's state as the checkpoint's whole model cut for this rank: each element of
// its part found in the whole tensor by split_model's own rule (rows over tensor ranks), and the
// counters from the metadata. What a resume must amount to, written without the loader.
void set_state_from_whole(Engine& engine, GridCoord c, const WholeState& whole, const ckpt::Metadata& m) {
  EngineState e(engine);
  e.begin_restore();
  const int moments = e.optimizer_moments();
  for (int i = 0; i < engine.layout().num_units(); ++i) {
    const UnitInfo& u = engine.layout().unit(i);
    const OwnedRange r = e.owned_range(i);
    for (int k = 0; k <= moments; ++k) {
      std::vector<float> owned(static_cast<std::size_t>(r.len), 0.0f);
      for (const ParamInfo& p : u.params) {
        const auto& arr = whole.at(u.name + "." + p.name)[static_cast<std::size_t>(k)];
        for (std::int64_t j = std::max(r.begin, p.offset); j < std::min(r.begin + r.len, p.offset + p.numel); ++j)
          owned[static_cast<std::size_t>(j - r.begin)] =
              arr[static_cast<std::size_t>(global_index(p, c.tensor, j - p.offset))];
      }
      e.write_owned(i, k, owned.data());
    }
  }
  e.finish_restore({m.step, m.applied, m.scaler, m.loop_lr}, m.scaler_dynamic);
}

void require_bit_equal(const WholeState& a, const WholeState& b) {
  REQUIRE(a.size() == b.size());
  for (const auto& [name, arrays] : a) {
    INFO("tensor " << name);
    REQUIRE(b.count(name) == 1);
    const auto& other = b.at(name);
    REQUIRE(arrays.size() == other.size());
    for (std::size_t k = 0; k < arrays.size(); ++k) {
      INFO("array " << k << " (0: master)");
      REQUIRE(arrays[k].size() == other[k].size());
      for (std::size_t i = 0; i < arrays[k].size(); ++i) {
        INFO("element " << i << ": " << arrays[k][i] << " vs " << other[k][i]);
        REQUIRE(std::bit_cast<std::uint32_t>(arrays[k][i]) == std::bit_cast<std::uint32_t>(other[k][i]));
      }
    }
  }
}

double relative(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-30); }

constexpr int kSaved = 10, kMore = 5;
const Grid kFrom = {2, 2, 1};

}  // namespace

TEST_CASE("regrid: a TP 2 x PP 2 checkpoint resumed at four other grids, stages 1 and 3", "[.][resume]") {
  Context& ctx = *Context::current();
  REQUIRE(ctx.world_size() == 4);
  const std::string dir = test_dir();
  if (ctx.rank() == 0) {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  ctx.comm().barrier();
  const std::string from = dir + "/from";
  {
    Job a(ctx, kFrom, /*tied=*/true);
    a.train(0, kSaved);
    save_checkpoint(a.engine, from, {{"data.samples", "80"}}, {.keep_last = 0});
  }
  const WholeState saved = whole_state(from, std::to_string(kSaved));
  REQUIRE(saved.size() == 6);                   // every parameter once, the tied copy too
  REQUIRE(saved.at("mlp.w").size() == 3);       // AdamW: master, m, v
  REQUIRE(saved.at("mlp.w")[0].size() == 120);  // whole: 12 x 10
  if (ctx.rank() == 0) {                        // the split extents 8, 12 and 200 divide by 1, 2 and 4 only
    std::ostringstream listing;
    REQUIRE(inspect_checkpoint(from, listing));
    CHECK_THAT(listing.str(), Catch::Contains("resumes at: TP 1, 2, 4 (every recorded split divides"));
  }
  const ckpt::Metadata meta =
      ckpt::read_metadata_file(resolve_checkpoint(from, std::to_string(kSaved)) + "/" + ckpt::kMetadataFile);

  for (const int stage : {1, 3})
    for (const auto& [T, P] : std::vector<std::pair<int, int>>{{1, 1}, {1, 2}, {2, 1}, {4, 1}}) {
      const Grid g{T, P, stage};
      INFO(g.name() << " stage " << stage);
      const std::string again = dir + "/" + g.name() + "_s" + std::to_string(stage);
      std::vector<double> norms, ref_norms;
      std::vector<float> weights, ref_weights;
      {
        Job b(ctx, g, true);
        // A dry run checks everything and changes nothing.
        const std::vector<float> initial = b.master();
        CheckpointLoadOptions dry;
        dry.dry_run = true;
        REQUIRE(load_checkpoint(b.engine, from, std::to_string(kSaved), dry).at("data.samples") == "80");
        REQUIRE(b.engine.global_step() == 0);
        REQUIRE(b.master() == initial);
        const ClientState client = load_checkpoint(b.engine, from, std::to_string(kSaved));
        REQUIRE(client.at("data.samples") == "80");
        REQUIRE(b.engine.global_step() == kSaved);
        save_checkpoint(b.engine, again, {}, {.keep_last = 0});
        norms = b.train(kSaved, kSaved + kMore);
        weights = b.master();
      }
      require_bit_equal(whole_state(again, std::to_string(kSaved)), saved);
      {
        Job r(ctx, g, true);
        set_state_from_whole(r.engine, r.groups.coord(), saved, meta);
        ref_norms = r.train(kSaved, kSaved + kMore);
        ref_weights = r.master();
      }
      // The same through the offline tool: resharded for the new grid, then a plain resume.
      const std::string offline = again + "_offline";
      if (ctx.rank() == 0) {
        std::error_code ec;
        std::filesystem::remove_all(offline, ec);
        reshard_checkpoint(from, offline, 4 / (T * P), stage, std::to_string(kSaved), T, P);
      }
      ctx.comm().barrier();
      require_bit_equal(whole_state(offline, std::to_string(kSaved)), saved);
      {
        Job c(ctx, g, true);
        load_checkpoint(c.engine, offline, std::to_string(kSaved));
        const auto offline_norms = c.train(kSaved, kSaved + kMore);
        for (std::size_t s = 0; s < norms.size(); ++s) REQUIRE(offline_norms[s] == norms[s]);
        REQUIRE(c.master() == weights);
      }
      double worst = 0;
      for (std::size_t s = 0; s < norms.size(); ++s) {
        INFO("step " << kSaved + s << ": " << norms[s] << " vs " << ref_norms[s]);
        REQUIRE(relative(norms[s], ref_norms[s]) <= 1e-6);
        REQUIRE(norms[s] > 0.5);  // clipping active: the norm decides every update
        worst = std::max(worst, relative(norms[s], ref_norms[s]));
      }
      REQUIRE(weights.size() == ref_weights.size());
      for (std::size_t i = 0; i < weights.size(); ++i) {
        INFO("element " << i << ": " << weights[i] << " vs " << ref_weights[i]);
        REQUIRE(std::abs(weights[i] - ref_weights[i]) <= 1e-6f * std::max(1.0f, std::abs(ref_weights[i])));
      }
      if (ctx.rank() == 0)
        WARN(g.name() << " stage " << stage << ": resumed vs cut by hand, largest relative norm difference " << worst);
    }
}

namespace {

// An engine over `groups` on a layout of the split model edited by `edit` (on every rank).
void refuse(Context& ctx, const Grid& g, const std::function<void(Layout&, GridCoord)>& build, const std::string& root,
            const std::vector<std::string>& words) {
  ProcessGroups groups(ctx, {.tensor = g.tensor, .pipeline = g.pipeline});
  Layout l;
  build(l, groups.coord());
  Config c = parse_config(config_text(g.stage, groups.data_size()), "test_checkpoint_regrid");
  c.resolve(groups.data_size());
  Engine engine(ctx, c, std::move(l), groups);
  init_part(engine, groups.coord());
  try {
    load_checkpoint(engine, root, std::to_string(kSaved));
    FAIL("the load was not refused");
  } catch (const Error& e) {
    const std::string what = e.what();
    for (const auto& w : words) {
      INFO(what);
      CHECK(what.find(w) != std::string::npos);
    }
  }
}

}  // namespace

TEST_CASE("regrid: models that are not the checkpoint's are refused, naming both grids", "[.][refuse]") {
  Context& ctx = *Context::current();
  REQUIRE(ctx.world_size() == 4);
  const std::string from = test_dir() + "/from";  // written by [resume]
  const Grid whole{1, 1, 1}, tp2{2, 1, 1};
  // The whole model less one parameter: no rank would hold it.
  refuse(ctx, whole,
         [](Layout& l, GridCoord) {
           l.add_unit("embed", {{"w", {8, 6}}, {"b", {5, 1}}});
           l.add_unit("mlp", {{"w", {12, 10}}, {"b", {3, 1}}});
           l.add_unit("big", {{"w", {200, 1}}});
         },
         from,
         {"saved on the grid TP 2 x PP 2", "holds 1 parameter(s) that no rank of this job (TP 1 x PP 1 x DP 4) holds",
          "'g' of unit 'big'"});
  // A parameter of another whole shape.
  refuse(ctx, whole,
         [](Layout& l, GridCoord) {
           l.add_unit("embed", {{"w", {8, 6}}, {"b", {5, 1}}});
           l.add_unit("mlp", {{"w", {12, 5}}, {"b", {3, 1}}});
           l.add_unit("big", {{"w", {200, 1}}, {"g", {1, 1}}});
         },
         from,
         {"parameter 'w' of unit 'mlp' is [12, 10] as a whole tensor", "(saved on the grid TP 2 x PP 2)",
          "this job's model (TP 1 x PP 1 x DP 4) has [12, 5]"});
  // A unit the checkpoint does not have.
  refuse(ctx, whole,
         [](Layout& l, GridCoord) {
           l.add_unit("embed", {{"w", {8, 6}}, {"b", {5, 1}}});
           l.add_unit("mlp", {{"w", {12, 10}}, {"b", {3, 1}}});
           l.add_unit("big", {{"w", {200, 1}}, {"g", {1, 1}}});
           l.add_unit("extra", {{"w", {4, 4}}});
         },
         from, {"has no unit 'extra', which this job's model (TP 1 x PP 1 x DP 4) holds"});
  // The offline tool: a pipeline it cannot cut, a tensor size a parameter does not divide by;
  // neither leaves an output behind.
  if (ctx.rank() == 0) {
    const std::string out = test_dir() + "/bad_reshard";
    REQUIRE_THROWS_WITH(reshard_checkpoint(from, out, 1, -1, std::to_string(kSaved), 1, 3),
                        Catch::Contains("reshard: --pp 3") && Catch::Contains("saved on the grid TP 2 x PP 2") &&
                            Catch::Contains("keeps the pipeline size or makes it 1"));
    REQUIRE_THROWS_WITH(reshard_checkpoint(from, out, 1, -1, std::to_string(kSaved), 3, 1),
                        Catch::Contains("parameter 'w' of unit 'embed' ([8, 6]) cannot be cut for TP 3"));
    REQUIRE(list_checkpoints(out).empty());
  }
  ctx.comm().barrier();
  // Adafactor's factored statistics cannot be cut across tensor ranks.
  {
    const char* adafactor =
        "train_micro_batch_size_per_gpu: 2\noptimizer:\n  type: Adafactor\n  params:\n    lr: 0.01\n"
        "zero_optimization:\n  stage: 1\n";
    ProcessGroups g(ctx, {.tensor = 1, .pipeline = 1});
    Config c = parse_config(adafactor, "test_checkpoint_regrid");
    c.resolve(g.data_size());
    Engine e(ctx, c, part_layout(1, 1, g.coord()), g);
    init_part(e, g.coord());
    const std::string root = test_dir() + "/adafactor";
    if (ctx.rank() == 0) std::filesystem::remove_all(root);
    ctx.comm().barrier();
    save_checkpoint(e, root, {}, {.keep_last = 0});
    if (ctx.rank() == 0)
      REQUIRE_THROWS_WITH(reshard_checkpoint(root, test_dir() + "/adafactor_tp2", 1, -1, "0", 2, 1),
                          Catch::Contains("holds Adafactor's state") &&
                              Catch::Contains("cannot be cut from the grid TP 1 x PP 1 for TP 2"));
    ctx.comm().barrier();
    // Nor loaded at another tensor parallelism.
    if (ctx.world_size() % 2 == 0) {
      ProcessGroups g2(ctx, {.tensor = 2, .pipeline = 1});
      Config c2 = parse_config(adafactor, "test_checkpoint_regrid");
      c2.resolve(g2.data_size());
      Engine e2(ctx, c2, part_layout(2, 1, g2.coord()), g2);
      REQUIRE_THROWS_WITH(load_checkpoint(e2, root),
                          Catch::Contains("holds Adafactor's state at tensor parallelism 1") &&
                              Catch::Contains("resume at tensor parallelism 1"));
    }
  }
  // Under TP 2, a parameter neither split nor replicated cannot be cut.
  refuse(ctx, tp2,
         [](Layout& l, GridCoord) {
           const int e = l.add_unit("embed", {{"w", {4, 6}}, {"b", {5, 1}}});
           l.set_split(e, "w", 0);
           l.set_replicated(e, "b");
           const int m = l.add_unit("mlp", {{"w", {6, 10}}, {"b", {3, 1}}});
           l.set_split(m, "w", 0);
           l.set_replicated(m, "b");
           const int b = l.add_unit("big", {{"w", {100, 1}}, {"g", {1, 1}}});
           l.set_replicated(b, "g");  // big.w: declared neither
         },
         from,
         {"parameter 'w' of unit 'big' is neither split nor replicated over this job's 2 tensor ranks (TP 2 x PP 1 x "
          "DP 2)",
          "saved on the grid TP 2 x PP 2"});
}

namespace {

// Resident memory of this process, from /proc/self/status: the peak (VmHWM) or now (VmRSS), bytes.
std::int64_t status_bytes(const std::string& field) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1)) * 1024;
  return -1;
}

// A model of 4 units of 2M-element matrices (split by rows under TP) and a replicated vector.
constexpr std::int64_t kRows = 2048, kCols = 1024;
Layout big_layout(int T, int P, GridCoord c) {
  Layout l;
  for (int u = 0; u < 4; ++u) {
    if (u * P / 4 != c.pipeline) continue;
    const char* names[] = {"u0", "u1", "u2", "u3"};
    const int id = l.add_unit(names[u], {{"w", {kRows / T, kCols}}, {"b", {16}}});
    if (T > 1) l.set_split(id, "w", 0);
    l.set_replicated(id, "b");
  }
  return l;
}

}  // namespace

TEST_CASE("regrid: a load's peak memory is the rank's shard plus one unit", "[.][memory]") {
  Context& ctx = *Context::current();
  REQUIRE(ctx.world_size() == 4);
  const std::string root = test_dir() + "/big";
  if (ctx.rank() == 0) {
    std::error_code ec;
    std::filesystem::remove_all(root, ec);
  }
  ctx.comm().barrier();
  auto engine_on = [&](ProcessGroups& g, int stage, Layout l) {
    Config c = parse_config(config_text(stage, g.data_size()), "test_checkpoint_regrid");
    c.resolve(g.data_size());
    return Engine(ctx, c, std::move(l), g);
  };
  {
    ProcessGroups g(ctx, {.tensor = 2, .pipeline = 2});
    Engine e = engine_on(g, 1, big_layout(2, 2, g.coord()));
    init_part(e, g.coord());
    save_checkpoint(e, root, {}, {.keep_last = 0});
  }
  ProcessGroups g(ctx, {.tensor = 1, .pipeline = 1});
  Engine e = engine_on(g, 3, big_layout(1, 1, g.coord()));
  init_part(e, g.coord());
  EngineState st(e);
  const std::int64_t arrays = 1 + st.optimizer_moments();
  std::int64_t shard = 0, unit = 0;
  for (int i = 0; i < e.layout().num_units(); ++i) {
    shard += st.owned_range(i).len * arrays * 4;
    unit = std::max(unit, e.layout().unit(i).numel * arrays * 4);
  }
  {  // reset the peak to what is resident now (Linux: clear_refs 5)
    std::ofstream("/proc/self/clear_refs") << "5";
  }
  const std::int64_t before = status_bytes("VmRSS");
  load_checkpoint(e, root);
  const std::int64_t peak = status_bytes("VmHWM") - before;
  constexpr std::int64_t kAllowance = 8 << 20;
  const std::int64_t whole = 4 * unit;
  WARN("rank " << ctx.rank() << ": a load at TP 1 x DP 4 (stage 3) from TP 2 x PP 2 grew the resident memory by "
               << peak / 1048576.0 << " MiB; its shard " << shard / 1048576.0 << " MiB, one unit " << unit / 1048576.0
               << " MiB, allowance " << kAllowance / 1048576.0 << " MiB (the whole model " << whole / 1048576.0
               << " MiB)");
  REQUIRE(before > 0);
  REQUIRE(peak <= shard + unit + kAllowance);
  REQUIRE(shard + unit + kAllowance < whole);  // the bound would catch a whole-model assembly
}
