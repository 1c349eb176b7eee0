// The configuration of a zero-gpt run, loaded once: the engine's settings resolved for the
// data-parallel size, the trainer's sections, and the YAML of both that the run saves and prints.
#pragma once

#include <string>

#include "gpt/command_line.hpp"
#include "gpt/trainer.hpp"
#include "zero/config.hpp"

namespace zero::gpt {

struct RunConfig {
  zero::Config cfg;
  GptSettings settings;
  std::string resolved_yaml;  // what ran, exactly: the engine's settings and the trainer's
};

// The engine's settings with the trainer's sections, as YAML.
std::string resolved_yaml(const zero::Config& cfg, const GptSettings& settings);

// Loads --config with the --set overrides. The scheduler may take its length from the run
// (total_num_steps: "auto"), and the run's length, run.steps, is in the same file: see
// run_config.cpp.
RunConfig load_run_config(const Cli& cli, int world_size);

}  // namespace zero::gpt
