// zero-gpt --autotune (examples/gpt/autotune_run.hpp) at 2 ranks on the host backend, with a
// small GPT and a small candidate set:
//   - with room for everything, every candidate whose micro-batch divides the batch is timed
//     and the one that does not fails with the config's message;
//   - with a budget between the smallest and the largest need, exactly the candidates needing
//     more than the budget are skipped, each with the reason, and none of them is timed;
//   - autotune.txt lists every candidate with its time or its reason, the winner is the fastest
//     timed one, and autotune.yaml loads with zero::load_config as a zero-gpt config file
//     carrying the winner's settings, and trains;
//   - [grid] (2 and 4 ranks): over tensor {1, 2, 4} x pipeline {1, 2} at stages 0, 1, 2 every
//     candidate the grid allows is timed on its own groups and engine; a grid that does not
//     divide the ranks, TP 4 with 2 heads and stage 2 with a pipeline are refused with the
//     reason; TP 2 needs less memory per rank than TP 1; the winner's file carries its grid in
//     the model section and trains with it; a config with its own grid is tuned at that grid.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>

#include "gpt/autotune_run.hpp"
#include "gpt/reporter.hpp"
#include "gpt/trainer.hpp"
#include "zero/config.hpp"
#include "zero/context.hpp"
#include "zero/groups.hpp"

using namespace zero::gpt;

namespace {

zero::Context& ctx() { return *zero::Context::current(); }

struct Setup {
  zero::Config cfg;
  GptSettings settings;
};

// `grid`: model section lines after the shape (tensor_parallel / pipeline_parallel); the config
// is resolved for its data-parallel size.
Setup make_setup(const std::string& out_dir, int n_layer = 1, const std::string& grid = "") {
  const int world = ctx().world_size();
  std::string y = "train_batch_size: " + std::to_string(4 * world) + "\ntrain_micro_batch_size_per_gpu: 4\n";
  y += "zero_optimization:\n  stage: 1\n";
  y += "optimizer:\n  type: AdamW\n  params:\n    lr: 0.001\n";
  y += "model:\n  n_layer: " + std::to_string(n_layer) +
       "\n  n_head: 2\n  n_embd: 64\n  seq_len: 32\n  vocab_size: 256\n" + grid;
  y += "data:\n  train: shakespeare\n";
  y += "run:\n  steps: 2\n  out_dir: " + out_dir + "\n";
  zero::LoadOptions o;
  o.extra_sections = gpt_sections();
  Setup s{zero::parse_config(y, "test_gpt_autotune", o), {}};
  s.settings = read_gpt_settings(s.cfg);
  s.cfg.resolve(gpt_data_parallel_size(s.settings, world));
  return s;
}

AutotuneRequest small_request() {
  AutotuneRequest r;
  r.enabled = true;
  r.stages = {0, 3};
  r.micro_batches = {1, 4, 3};  // 3 does not divide the 4 sequences per rank
  r.offload = {"none", "cpu"};
  r.warmup_steps = 1;
  r.timed_steps = 1;
  return r;
}

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// The memory the note says the candidate needs, in MiB (NaN when the note has none).
double need_mib(const std::string& note) {
  std::smatch m;
  static const std::regex re("memory per rank: ([0-9.]+) MiB");
  return std::regex_search(note, m, re) ? std::stod(m[1]) : std::nan("");
}

// The table's row for a candidate: "<label>[ (best)] | <outcome> | ...".
std::string row(const std::string& table, const std::string& label) {
  std::istringstream in(table);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(label + " |", 0) == 0 || line.rfind(label + " (best) |", 0) == 0) return line;
  return "";
}

void check_files(const AutotuneOutcome& o) {
  const std::string table = read_text(o.table_path);
  for (std::size_t i = 0; i < o.result.trials.size(); ++i) {
    const zero::TuneTrial& t = o.result.trials[i];
    const std::string r = row(table, t.candidate.label());
    INFO(t.candidate.label() << " -> '" << r << "'");
    REQUIRE(!r.empty());
    switch (t.outcome) {
      case zero::TuneTrial::Outcome::timed:
        CHECK(std::regex_search(r, std::regex(" \\| timed \\| [0-9]+\\.[0-9]+ \\| [0-9.]+ \\| ")));
        break;
      case zero::TuneTrial::Outcome::does_not_fit:
        CHECK_THAT(r, Catch::Contains("does not fit") && Catch::Contains("memory per rank"));
        break;
      case zero::TuneTrial::Outcome::failed:
        CHECK_THAT(r, Catch::Contains("failed") && Catch::Contains("do not divide"));
        break;
      case zero::TuneTrial::Outcome::refused:
        FAIL("refused: " << r);  // the candidates of these cases have no grid
        break;
    }
    CHECK((r.find("(best)") != std::string::npos) == (static_cast<int>(i) == o.result.best_index));
  }

  // The winner's file is a zero-gpt config: the engine's keys and the model/data/run sections.
  zero::LoadOptions lo;
  lo.extra_sections = gpt_sections();
  zero::Config loaded = zero::load_config(o.config_path, lo);
  loaded.resolve(ctx().world_size());
  const zero::TuneCandidate& best = o.result.best_trial.candidate;
  CHECK(loaded.zero_optimization.stage == *best.stage);
  CHECK(loaded.train_micro_batch_size_per_gpu == *best.micro_batch);
  CHECK(loaded.zero_optimization.offload_optimizer.device == *best.offload_optimizer);
  CHECK(loaded.train_batch_size == 4 * ctx().world_size());
  const GptSettings s = read_gpt_settings(loaded);
  CHECK(s.model.n_layer == 1);
  CHECK(s.model.n_embd == 64);
  GptTrainer trainer(ctx(), loaded, s);
  CHECK(std::isfinite(trainer.train_step().loss));
}

}  // namespace

TEST_CASE("zero-gpt autotune times what fits and writes a loadable winner", "[gpt][autotune][mpi]") {
  const auto dir =
      std::filesystem::temp_directory_path() / ("zero_gpt_autotune_np" + std::to_string(ctx().world_size()));
  const Setup setup = make_setup(dir.string());
  AutotuneRequest req = small_request();

  // Room for every candidate.
  req.memory_bytes = 1e12;
  const AutotuneOutcome all = run_autotune(ctx(), setup.cfg, setup.settings, req);
  // stage 0: mb 1, 4, 3 (no offload at stage 0); stage 3: the same, with and without offload.
  REQUIRE(all.result.trials.size() == 9);
  double least = 1e300, most = 0;
  for (const auto& t : all.result.trials) {
    INFO(t.candidate.label() << ": " << t.note);
    if (*t.candidate.micro_batch == 3) {
      CHECK(t.outcome == zero::TuneTrial::Outcome::failed);
      continue;
    }
    REQUIRE(t.outcome == zero::TuneTrial::Outcome::timed);
    CHECK(t.step_s > 0);
    CHECK(all.result.best_trial.step_s <= t.step_s);
    least = std::min(least, need_mib(t.note));
    most = std::max(most, need_mib(t.note));
  }
  REQUIRE(all.result.found);
  check_files(all);

  // A budget between the smallest and the largest need: some are skipped, the rest run.
  REQUIRE(most > least + 0.01);
  req.memory_bytes = (least + most) / 2 * (1 << 20);
  const AutotuneOutcome some = run_autotune(ctx(), setup.cfg, setup.settings, req);
  REQUIRE(some.result.trials.size() == all.result.trials.size());
  int timed = 0, skipped = 0;
  for (std::size_t i = 0; i < some.result.trials.size(); ++i) {
    const zero::TuneTrial& t = some.result.trials[i];
    INFO(t.candidate.label() << ": " << t.note);
    if (*t.candidate.micro_batch == 3) continue;
    const double need = need_mib(all.result.trials[i].note);
    CHECK(need_mib(t.note) == need);
    if (need > req.memory_bytes / (1 << 20) + 0.001) {
      CHECK(t.outcome == zero::TuneTrial::Outcome::does_not_fit);
      CHECK(t.step_s == 0);
      ++skipped;
    } else if (need < req.memory_bytes / (1 << 20) - 0.001) {
      CHECK(t.outcome == zero::TuneTrial::Outcome::timed);
      ++timed;
    }
    // A micro-batch of 4 needs more than one of 1 at the same stage and offload.
    if (*t.candidate.micro_batch == 4)
      for (const auto& o : all.result.trials)
        if (o.candidate.stage == t.candidate.stage && o.candidate.offload_optimizer == t.candidate.offload_optimizer &&
            *o.candidate.micro_batch == 1)
          CHECK(need > need_mib(o.note));
  }
  CHECK(timed >= 1);
  CHECK(skipped >= 1);
  REQUIRE(some.result.found);
  CHECK(some.result.best_trial.outcome == zero::TuneTrial::Outcome::timed);
  check_files(some);
}

TEST_CASE("zero-gpt autotune adds ZeRO++ and MiCS variants across nodes only", "[gpt][autotune][mpi][zeropp]") {
  const auto dir =
      std::filesystem::temp_directory_path() / ("zero_gpt_autotune_zpp_np" + std::to_string(ctx().world_size()));
  const Setup setup = make_setup(dir.string());
  AutotuneRequest req = small_request();
  req.micro_batches = {4};
  req.offload = {"none"};
  req.memory_bytes = 1e12;
  const AutotuneOutcome o = run_autotune(ctx(), setup.cfg, setup.settings, req);
  const zero::NodeLayout nodes = zero::node_layout(ctx());
  std::vector<std::string> labels;
  for (const auto& t : o.result.trials) {
    INFO(t.candidate.label() << ": " << t.note);
    CHECK(t.outcome == zero::TuneTrial::Outcome::timed);
    labels.push_back(t.candidate.label());
  }
  if (nodes.nodes > 1) {
    const std::string h = "hpz " + std::to_string(nodes.ranks_per_node);
    const std::string m = "mics " + std::to_string(nodes.ranks_per_node);
    CHECK(labels == std::vector<std::string>{"stage 0, mb 4, offload none", "stage 3, mb 4, offload none",
                                             "stage 3, mb 4, offload none, qwz", "stage 3, mb 4, offload none, " + h,
                                             "stage 3, mb 4, offload none, " + h + ", qwz",
                                             "stage 3, mb 4, offload none, " + h + ", qwz, qgz",
                                             "stage 3, mb 4, offload none, " + m});
  } else {
    CHECK(labels == std::vector<std::string>{"stage 0, mb 4, offload none", "stage 3, mb 4, offload none"});
  }
  check_files(o);
}

namespace {

// The winner's file: its grid in the model section, resolved for that grid's data-parallel
// size; a trainer built from it alone (its own groups) trains.
void check_grid_winner(const AutotuneOutcome& o) {
  zero::LoadOptions lo;
  lo.extra_sections = gpt_sections();
  zero::Config loaded = zero::load_config(o.config_path, lo);
  const GptSettings s = read_gpt_settings(loaded);
  const zero::GridSpec g = o.result.best_trial.grid;
  CHECK(s.tensor_parallel == g.tensor);
  CHECK(s.pipeline_parallel == g.pipeline);
  CHECK(loaded.zero_optimization.stage == o.result.best.zero_optimization.stage);
  loaded.resolve(gpt_data_parallel_size(s, ctx().world_size()));
  CHECK(loaded.train_batch_size == 4 * ctx().world_size());
  GptTrainer trainer(ctx(), loaded, s);
  CHECK(trainer.grid() == format_grid(g.tensor, ctx().world_size() / (g.tensor * g.pipeline), g.pipeline));
  CHECK(std::isfinite(trainer.train_step().loss));
}

}  // namespace

TEST_CASE("zero-gpt autotune over tensor and pipeline grids", "[gpt][autotune][mpi][grid]") {
  const int world = ctx().world_size();
  const auto dir = std::filesystem::temp_directory_path() / ("zero_gpt_autotune_grid_np" + std::to_string(world));
  const Setup setup = make_setup(dir.string(), 2);
  AutotuneRequest req = small_request();
  req.stages = {0, 1, 2};
  req.micro_batches = {4};
  req.offload = {"none"};
  req.tensor_parallel = {1, 2, 4};
  req.pipeline_parallel = {1, 2};
  req.memory_bytes = 1e12;
  const AutotuneOutcome o = run_autotune(ctx(), setup.cfg, setup.settings, req);
  REQUIRE(o.result.trials.size() == 18);
  const std::string table = read_text(o.table_path);
  std::map<std::string, double> need;  // "tp/pp/stage" -> MiB
  int timed = 0;
  for (std::size_t i = 0; i < o.result.trials.size(); ++i) {
    const zero::TuneTrial& t = o.result.trials[i];
    const int T = *t.candidate.tensor_parallel, P = *t.candidate.pipeline_parallel, st = *t.candidate.stage;
    INFO(t.candidate.label() << ": " << t.note);
    CHECK(t.grid.tensor == T);
    CHECK(t.grid.pipeline == P);
    const std::string r = row(table, t.candidate.label());
    REQUIRE(!r.empty());
    if (ctx().rank() == 0) CHECK_THAT(r, Catch::Contains(t.note));  // rank 0 wrote it (errors name their rank)
    CHECK((r.find("(best)") != std::string::npos) == (static_cast<int>(i) == o.result.best_index));
    if (world % (T * P) != 0) {
      CHECK(t.outcome == zero::TuneTrial::Outcome::refused);
      CHECK_THAT(t.note, Catch::Contains("does not divide the " + std::to_string(world) + " ranks"));
      CHECK_THAT(r, Catch::Contains("| refused |"));
    } else if (T == 4) {
      CHECK(t.outcome == zero::TuneTrial::Outcome::refused);
      CHECK_THAT(t.note, Catch::Contains("n_head 2 is not a multiple"));
    } else if (P > 1 && st == 2) {
      CHECK(t.outcome == zero::TuneTrial::Outcome::refused);
      CHECK_THAT(t.note, Catch::Contains("ZeRO stage 2 with pipeline parallelism 2 is refused"));
    } else {
      REQUIRE(t.outcome == zero::TuneTrial::Outcome::timed);
      CHECK(t.step_s > 0);
      CHECK(o.result.best_trial.step_s <= t.step_s);
      CHECK(std::regex_search(r, std::regex(" \\| timed \\| [0-9]+\\.[0-9]+ \\| [0-9.]+ \\| ")));
      need[std::to_string(T) + "/" + std::to_string(P) + "/" + std::to_string(st)] = need_mib(t.note);
      ++timed;
    }
  }
  // 1x1 at three stages, TP 2 at three, PP 2 and TP 2 x PP 2 (4 ranks) at two each.
  CHECK(timed == (world == 4 ? 3 + 3 + 2 + 2 : 3 + 3 + 2));
  // A rank holds half of each split matrix under TP 2.
  for (int st : {0, 1, 2}) {
    INFO("stage " << st);
    CHECK(need.at("2/1/" + std::to_string(st)) < need.at("1/1/" + std::to_string(st)));
  }
  REQUIRE(o.result.found);
  check_grid_winner(o);

  // A config with its own grid and no size lists: every candidate runs at that grid, and the
  // winner's file keeps it.
  const std::string grid = world == 4 ? "  tensor_parallel: 2\n  pipeline_parallel: 2\n" : "  tensor_parallel: 2\n";
  const Setup own = make_setup(dir.string(), 2, grid);
  AutotuneRequest plain = small_request();
  plain.stages = {0, 1};
  plain.micro_batches = {2, 4};
  plain.offload = {"none"};
  plain.memory_bytes = 1e12;
  const AutotuneOutcome g = run_autotune(ctx(), own.cfg, own.settings, plain);
  REQUIRE(g.result.trials.size() == 4);
  for (const auto& t : g.result.trials) {
    INFO(t.candidate.label() << ": " << t.note);
    CHECK(t.outcome == zero::TuneTrial::Outcome::timed);
    CHECK(t.grid.tensor == 2);
    CHECK(t.grid.pipeline == (world == 4 ? 2 : 1));
  }
  REQUIRE(g.result.found);
  check_grid_winner(g);
}
