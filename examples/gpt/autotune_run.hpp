// zero-gpt --autotune: measure, on this machine and with zero-gpt's own training step, a few
// steps of every candidate setting that fits, and keep the fastest.
//
// The candidates are the combinations of ZeRO stage, micro-batch (at the configured global
// batch: accumulation follows), bucket size, overlap and optimizer offload that the command
// line lists (zero::tune_grid), each at every tensor x pipeline grid listed (zero::with_grids;
// by default only the config's model.tensor_parallel x pipeline_parallel). A candidate's
// process groups, engine (make_gpt_engine: its part of the model) and trainer are its own
// (zero::autotune_grid). A grid that does not divide the ranks, or that the planner refuses (a
// head count or vocabulary T does not divide, stages 2-3 with a pipeline), is refused with the
// reason before anything is built. Before a candidate costs any time, the planner's memory model
// (zero/plan/plan.hpp: model states exactly as the engine counts them, the trainer's activations,
// communication and offload buffers) is checked against the memory this rank can use. On the
// host backend the "device" is the host itself, so device and offloaded bytes are one sum held
// against one budget: the memory available on the node (MemAvailable, measured with the ranks
// already running, so their baseline is not counted twice) shared by its ranks, or the budget
// given with --autotune-memory; under TP x PP it is a rank's: its part of the model and its
// pipeline part's micro-batches in flight. Every candidate that fits is timed on a fresh engine, the
// same initial parameters and the same data.
//
// The run directory receives autotune.yaml (the winner: a complete zero-gpt config file,
// resolved for the rank count it was tuned at, its grid in the model section) and autotune.txt (every candidate with
// its time, or why it was skipped or failed). Then zero-gpt exits (the default, as DeepSpeed's
// `--autotuning tune`) or trains with the winner (--autotune-then train).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gpt/trainer.hpp"
#include "zero/plan/autotune.hpp"
#include "zero/config.hpp"
#include "zero/context.hpp"

namespace CLI {
class App;
}

namespace zero::gpt {

struct AutotuneRequest {
  bool enabled = false;
  std::vector<int> stages{0, 1, 2, 3};
  std::vector<std::int64_t> micro_batches;  // empty: powers of two dividing the per-rank batch
  std::vector<std::int64_t> bucket_sizes;   // empty: the config's
  std::vector<std::string> overlap;         // "on" / "off"; empty: the config's
  std::vector<std::string> offload{"none", "cpu"};
  std::vector<int> tensor_parallel;  // grids to try; empty: the config's sizes
  std::vector<int> pipeline_parallel;
  int warmup_steps = 1;
  int timed_steps = 3;
  double memory_bytes = 0;    // per rank; 0: the node's MemAvailable over its ranks
  std::string then = "exit";  // "exit" or "train"
};

// The --autotune flag and its --autotune-* options, in their own group of --help.
void add_autotune_options(CLI::App& app, AutotuneRequest& request);

struct AutotuneOutcome {
  zero::TuneResult result;
  std::string config_path;  // <out_dir>/autotune.yaml (written only when a candidate ran)
  std::string table_path;   // <out_dir>/autotune.txt
  double memory_bytes = 0;  // the per-rank budget the candidates were held against
};

// The settings with the grid's sizes as model.tensor_parallel and pipeline_parallel (the
// winner's grid, to train with what was tuned).
GptSettings with_grid(const GptSettings& settings, zero::GridSpec grid);

// Collective. `base` is zero-gpt's resolved config (for its grid's data-parallel size); `settings` its model/data/run
// sections, which the winner's file carries too. Creates settings.out_dir (rank 0) if needed.
AutotuneOutcome run_autotune(zero::Context& ctx, const zero::Config& base, const GptSettings& settings,
                             const AutotuneRequest& request);
// What rank 0 prints: the table, the winner, where the files are and how to train with it.
std::string autotune_report(const AutotuneOutcome& outcome);

}  // namespace zero::gpt
