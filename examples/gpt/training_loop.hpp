// A zero-gpt session's training: the header of its log, then the optimizer steps from where it
// starts to run.steps, with their log lines, evaluations, checkpoints and the stop on a signal.
#pragma once

#include <cstdint>
#include <string>

#include "gpt/reporter.hpp"
#include "gpt/run_config.hpp"
#include "gpt/trainer.hpp"
#include "zero/context.hpp"

namespace zero::gpt {

// What a run trains and against what it is measured; fixed for the run.
struct RunFacts {
  int world = 1, threads = 1;
  std::string thread_hint;
  double params = 0;            // Ψ, padded vocabulary included
  double samples_per_step = 0;  // global
  double tokens_per_step = 0;
  zero::gpt::TokenFlops flops;  // per token
  zero::gpt::MfuPeak peak;      // per device
  std::int64_t start_step = 0;
  std::string checkpoint_dir;
  std::string resumed_from;    // the checkpoint this session continues ("" when it starts anew)
  std::string resume_command;  // this command line with --resume, for the stop message
  std::string nodes;           // "2 nodes x 2 ranks"
};

// The start of the log: what runs where, the batch, the FLOPs, the memory, the notes and the
// resolved configuration; and the "start" record.
void report_header(Reporter& rep, const RunConfig& rc, GptTrainer& trainer, const RunFacts& f, bool resumed,
                   bool config_saved);

// Trains from facts.start_step to run.steps and logs the closing line. Returns false when a stop
// signal ended the session early (a checkpoint of the last step taken is then saved).
bool train_session(zero::Context& ctx, GptTrainer& trainer, Reporter& rep, const RunFacts& facts);

}  // namespace zero::gpt
