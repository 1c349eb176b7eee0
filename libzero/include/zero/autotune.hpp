// Autotuning: run a few steps of each candidate setting that the planner says fits, on the
// actual machine, and keep the fastest.
//
// DeepSpeed's autotuner launches trials, including ones that run out of memory; here the
// planner (zero/plan.hpp) rules those out first, so only candidates that can fit cost time.
// Each candidate is the base config with some settings changed (stage, micro-batch at the same
// global batch, bucket sizes, overlap, optimizer offload). The application supplies its training
// step; every candidate gets a fresh Engine, the same initial parameters, warm-up steps, then
// timed steps (the slowest rank's wall time). The result holds the winning Config (written as
// YAML when asked) and a table of every candidate: skipped with the planner's reason, failed
// with its error, or timed.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "zero/config.hpp"
#include "zero/engine.hpp"
#include "zero/layout.hpp"
#include "zero/plan.hpp"

namespace zero {

class Context;

// What a candidate changes in the base config; an unset field keeps the base's value.
struct TuneCandidate {
  std::optional<int> stage;
  std::optional<std::int64_t> micro_batch;   // the global batch stays; accumulation follows
  std::optional<std::int64_t> bucket_size;   // reduce_bucket_size and allgather_bucket_size
  std::optional<bool> overlap_comm;
  std::optional<OffloadDevice> offload_optimizer;
  std::optional<int> hpz_partition_size;     // ZeRO++ hpZ (stage 3)
  std::optional<bool> quantized_weights;     // ZeRO++ qwZ (stage 3)
  std::string label() const;
};

// Every combination of the given values (an empty list keeps the base's value).
std::vector<TuneCandidate> tune_grid(const std::vector<int>& stages, const std::vector<std::int64_t>& micro_batches,
                                     const std::vector<std::int64_t>& bucket_sizes = {},
                                     const std::vector<bool>& overlap = {},
                                     const std::vector<OffloadDevice>& offload = {});

// ZeRO++ for runs across nodes: each stage-3 candidate (a stage of 3, or an unset stage when
// the base is at stage 3) is followed by its variants with hpZ over `hpz_group` ranks (normally
// the ranks of a node; 1 skips hpZ), with qwZ, and with both.
std::vector<TuneCandidate> with_zero_plus_plus(const std::vector<TuneCandidate>& candidates, int base_stage,
                                               int hpz_group);

struct TuneTrial {
  TuneCandidate candidate;
  enum class Outcome { timed, does_not_fit, failed } outcome = Outcome::failed;
  std::string note;            // the planner's reason, or the error
  double step_s = 0;           // mean over the timed steps, slowest rank
  double samples_per_s = 0;    // global batch / step_s
};

// The planner's verdict on a resolved candidate config: true to run it; false with `why` set.
using FitsFn = std::function<bool(const Config& cfg, std::string& why)>;
// fits() for a GPT of `shape` on `cluster` (plan::make_plan with the config's settings). A loop
// whose engine runs over the data-parallel group of a tensor x pipeline grid (zero::ProcessGroups)
// passes the grid's sizes: the verdict is then a rank's, holding its part of the model.
FitsFn plan_fits(const plan::GptShape& shape, const plan::Cluster& cluster, int tensor_parallel = 1,
                 int pipeline_parallel = 1);

struct TuneOptions {
  int warmup_steps = 1;
  int timed_steps = 3;
  FitsFn fits;                // null: every candidate runs
  std::string config_out;     // rank 0 writes the winner's YAML here (empty: not written)
  std::string table_out;      // rank 0 writes the trial table here (empty: not written)
};

struct TuneResult {
  bool found = false;
  int best_index = -1;        // into trials
  Config best;                // resolved for the world size it was tuned at
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
                               const MakeTrainStepFn& make_train_step,
                               const std::vector<TuneCandidate>& candidates, const TuneOptions& options = {});

}  // namespace zero
