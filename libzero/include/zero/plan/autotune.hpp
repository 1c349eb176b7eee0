// Autotuning: run a few steps of each candidate setting that the planner says fits, on the actual
// machine, and keep the fastest. Why and how: docs/architecture.md, note autotune (usage:
// docs/zero-plan.md, Autotuning).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "zero/config.hpp"
#include "zero/engine.hpp"
#include "zero/groups.hpp"
#include "zero/layout.hpp"
#include "zero/plan/plan.hpp"

namespace zero {

class Context;

// What a candidate changes in the base config; an unset field keeps the base's value.
struct TuneCandidate {
  std::optional<int> stage;
  std::optional<std::int64_t> micro_batch;  // the global batch stays; accumulation follows
  std::optional<std::int64_t> bucket_size;  // reduce_bucket_size and allgather_bucket_size
  std::optional<bool> overlap_comm;
  std::optional<OffloadDevice> offload_optimizer;
  std::optional<int> hpz_partition_size;    // ZeRO++ hpZ (stage 3)
  std::optional<bool> quantized_weights;    // ZeRO++ qwZ (stage 3)
  std::optional<bool> quantized_gradients;  // ZeRO++ qgZ (stages 2-3)
  std::optional<int> mics_shard_size;       // MiCS (stages 1-3)
  // The grid (ProcessGroups): ranks splitting each layer, pipeline parts; the data-parallel
  // size, which the config is resolved for, is world / (T x P). Unset: TuneOptions::grid's.
  std::optional<int> tensor_parallel;
  std::optional<int> pipeline_parallel;
  GridSpec grid(GridSpec base) const {
    return {tensor_parallel.value_or(base.tensor), pipeline_parallel.value_or(base.pipeline)};
  }
  std::string label() const;
};

// Every combination of the given values (an empty list keeps the base's value).
std::vector<TuneCandidate> tune_grid(const std::vector<int>& stages, const std::vector<std::int64_t>& micro_batches,
                                     const std::vector<std::int64_t>& bucket_sizes = {},
                                     const std::vector<bool>& overlap = {},
                                     const std::vector<OffloadDevice>& offload = {});

// ZeRO++ and MiCS for runs across nodes, `node_ranks` ranks a node (1 skips hpZ and MiCS). Each
// candidate (its stage, or the base's when unset) is followed by its variants: at stage 3 with
// qwZ, hpZ over the node, both, and the three of hpZ, qwZ and qgZ (qwZ and qgZ without hpZ on
// one rank a node); at stage 2 with qgZ; at stages 1-3 with MiCS over the node. Candidates with
// a tensor or pipeline size above 1 get no qgZ or MiCS variant (the engine takes neither there).
// Each candidate once per (tensor, pipeline) pair of the lists, the grid varying slowest (an
// empty list keeps the base's size).
std::vector<TuneCandidate> with_grids(const std::vector<TuneCandidate>& candidates, const std::vector<int>& tensor,
                                      const std::vector<int>& pipeline);

std::vector<TuneCandidate> with_zero_plus_plus(const std::vector<TuneCandidate>& candidates, int base_stage,
                                               int node_ranks);

struct TuneTrial {
  TuneCandidate candidate;
  enum class Outcome { timed, does_not_fit, failed, refused } outcome = Outcome::failed;
  std::string note;          // the planner's reason, or the error
  GridSpec grid;             // the tensor x pipeline sizes it ran (or would have run) with
  double step_s = 0;         // mean over the timed steps, slowest rank
  double samples_per_s = 0;  // global batch / step_s
};

// The planner's verdict on a resolved candidate config (resolved for the data-parallel size of
// `grid`): true to run it; false with `why` set. A zero::Error thrown here refuses the
// candidate with its message (a grid or stage the planner does not accept).
using FitsFn = std::function<bool(const Config& cfg, GridSpec grid, std::string& why)>;
// fits() for a GPT of `shape` on `cluster` (plan::make_plan with the config's settings and the
// candidate's grid): a rank's verdict, holding its part of the model.
FitsFn plan_fits(const plan::GptShape& shape, const plan::Cluster& cluster);

struct TuneOptions {
  int warmup_steps = 1;
  int timed_steps = 3;
  FitsFn fits;             // null: every candidate runs
  std::string config_out;  // rank 0 writes the winner's YAML here (empty: not written)
  std::string table_out;   // rank 0 writes the trial table here (empty: not written)
  GridSpec grid;           // the base's grid: what a candidate without sizes runs with
  // Where the application's config keeps the grid (the engine's keys do not: a GPT's model
  // section, say): called on every candidate's resolved config, so the winner's carries it.
  std::function<void(Config& cfg, GridSpec grid)> record_grid;
};

struct TuneResult {
  bool found = false;
  int best_index = -1;  // into trials
  Config best;          // resolved for its data-parallel size at the world size it was tuned at
  TuneTrial best_trial;
  std::vector<TuneTrial> trials;
  std::string table() const;  // one row per candidate, the winner marked
};

// One optimizer step of the application's loop on `engine` (micro-steps, then engine.step()).
using TrainStepFn = std::function<void(Engine& engine)>;
using InitFn = std::function<void(const ParamInfo&, std::span<float>)>;

// Collective over ctx's ranks. `base` is resolved or not; its global batch is kept.
TuneResult autotune(Context& ctx, const Config& base, const Layout& layout, const InitFn& init,
                    const TrainStepFn& train_step, const std::vector<TuneCandidate>& candidates,
                    const TuneOptions& options = {});

// For a loop with state of its own per engine (buffers sized by the micro-batch, a data
// loader): called once per candidate, after the engine is built and initialised and before any
// timed step, and returns that engine's step. Building that state is not timed; an error while
// building it fails the candidate like an error in a step. The step is destroyed before its engine.
// (A name of its own: a lambda returning the step also converts to TrainStepFn.)
using MakeTrainStepFn = std::function<TrainStepFn(Engine& engine)>;
TuneResult autotune_per_engine(Context& ctx, const Config& base, const Layout& layout, const InitFn& init,
                               const MakeTrainStepFn& make_train_step, const std::vector<TuneCandidate>& candidates,
                               const TuneOptions& options = {});

// A candidate's engine and the groups it runs over. Members in this order: the engine goes
// before its groups.
struct TuneEngine {
  std::unique_ptr<ProcessGroups> groups;  // null: the engine runs over the world (a 1 x 1 grid)
  std::unique_ptr<Engine> engine;         // this rank's part of the model, parameters initialised
};
// Collective: builds the engine for a resolved candidate config over `grid` (its groups, this
// rank's layout, the engine over groups->data(), the initial parameters). A zero::Error fails
// the candidate with its message (a grid the model cannot be split by, a stage it refuses).
using MakeEngineFn = std::function<TuneEngine(const Config& cfg, GridSpec grid)>;
// As MakeTrainStepFn, with the groups the step's model parallelism runs over.
using MakeGridStepFn = std::function<TrainStepFn(TuneEngine& run)>;
// Candidates with their own grids: each one's groups and engine come from make_engine, the
// config is resolved for world / (T x P) data-parallel ranks at the base's global batch, and
// a grid whose T x P does not divide the world is refused before anything is built.
TuneResult autotune_grid(Context& ctx, const Config& base, const MakeEngineFn& make_engine,
                         const MakeGridStepFn& make_train_step, const std::vector<TuneCandidate>& candidates,
                         const TuneOptions& options = {});

}  // namespace zero
