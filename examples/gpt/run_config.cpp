#include "gpt/run_config.hpp"

#include <fmt/format.h>

#include <cstdint>
#include <limits>

#include "zero/error.hpp"

namespace zero::gpt {

std::string resolved_yaml(const zero::Config& cfg, const GptSettings& settings) {
  zero::Config shown = cfg;
  for (auto& [name, yaml] : settings.sections()) shown.extra_sections[name] = yaml;
  return shown.to_yaml();
}

// The scheduler may take its length from the run (total_num_steps: "auto"), and the run's
// length, run.steps, is in the same file. The file is loaded once, with a placeholder length
// that no real setting uses; run.steps then takes its place.
RunConfig load_run_config(const Cli& cli, int world_size) {
  constexpr std::int64_t kPlaceholder = std::numeric_limits<std::int32_t>::max();
  zero::LoadOptions opts;
  opts.extra_sections = gpt_sections();
  opts.overrides = cli.sets;
  opts.total_num_steps = kPlaceholder;
  RunConfig rc{zero::load_config(cli.config_path, opts), {}, {}};
  rc.settings = read_gpt_settings(rc.cfg);
  zero::SchedulerConfig& sched = rc.cfg.scheduler;
  if (sched.type != zero::SchedulerType::none && sched.total_num_steps == kPlaceholder) {
    sched.total_num_steps = rc.settings.steps;
    const std::string placeholder = fmt::format("{}", kPlaceholder), steps = fmt::format("{}", rc.settings.steps);
    for (auto& n : rc.cfg.notes)
      if (n.find(placeholder) != std::string::npos)
        n = fmt::format("scheduler.params.total_num_steps: \"auto\" -> {} (run.steps)", steps);
    for (auto& a : rc.cfg.autos)
      if (a.value == placeholder) a = {a.path, steps, "run.steps"};
    ZERO_CHECK(sched.total_num_steps >= sched.warmup_num_steps,
               fmt::format("scheduler.params.total_num_steps is \"auto\", so it is run.steps = {}, less than "
                           "warmup_num_steps = {}: the run would end inside the warmup; raise run.steps or shorten "
                           "the warmup",
                           steps, sched.warmup_num_steps));
  }
  // The engine's batch arithmetic counts data-parallel ranks: a tensor group and a pipeline
  // train one batch together (world / (tensor x pipeline) data-parallel ranks).
  rc.cfg.resolve(gpt_data_parallel_size(rc.settings, world_size));
  // The resolved sections replace what the file said (a preset name becomes its shape), so a
  // checkpoint's saved config names the model's n_head and vocab_size for zero-ckpt export.
  for (auto& [name, yaml] : rc.settings.sections()) rc.cfg.extra_sections[name] = yaml;
  rc.resolved_yaml = resolved_yaml(rc.cfg, rc.settings);
  return rc;
}

}  // namespace zero::gpt
