// zero-gpt's command line: its flags (the config file, --set overrides, resume, sample,
// autotune) and the command that resumes this run, printed when a signal stops it.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "gpt/autotune_run.hpp"
#include "zero/context.hpp"

namespace zero::gpt {

struct Cli {
  std::string config_path;
  std::vector<std::string> sets;
  bool print_config = false, resume = false, sample_only = false, dry_run = false;
  std::string checkpoint_dir, prompt, resume_from;
  zero::gpt::AutotuneRequest autotune;
};

// Returns an exit status when the command line asks for no run (--help, a mistake).
std::optional<int> parse_cli(const zero::Context& ctx, int argc, char** argv, Cli& cli);

// This process's command line with --resume added (once), each word quoted for a shell where
// it needs to be; the launcher (mpirun, srun) is not visible from here and goes in front.
// --resume-from goes: the run continues from its own checkpoints now.
std::string resume_command(int argc, char** argv);

}  // namespace zero::gpt
