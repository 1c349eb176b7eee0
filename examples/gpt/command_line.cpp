#include "gpt/command_line.hpp"

#include <CLI/CLI.hpp>

#include "gpt/trainer.hpp"
#include "zero/config.hpp"

namespace zero::gpt {

std::optional<int> parse_cli(const zero::Context& ctx, int argc, char** argv, Cli& cli) {
  CLI::App app{
      "zero-gpt: GPT-2 training with ZeRO-sharded data parallelism (stages 0-3).\n"
      "Launch with mpirun / srun for several ranks; a single process needs no launcher."};
  app.add_option("-c,--config", cli.config_path,
                 "YAML or DeepSpeed JSON file: engine keys plus the model/data/run sections")
      ->required()
      ->check(CLI::ExistingFile);
  app.add_option("--set", cli.sets,
                 "override one key, e.g. --set zero_optimization.stage=3 --set run.steps=200 "
                 "(repeatable; validated like the file)")
      ->take_all();
  app.add_flag("--print-config", cli.print_config, "print the resolved configuration and exit");
  app.add_flag("--resume", cli.resume,
               "continue from the latest checkpoint (in <run.out_dir>/checkpoints, or --checkpoint); "
               "the rank count and ZeRO stage may differ from the run that saved it");
  app.add_option("--resume-from", cli.resume_from,
                 "continue from the checkpoint at this root or step directory, which is only read (a "
                 "read-only mount will do); saves go to --checkpoint or <run.out_dir>/checkpoints");
  app.add_flag("--dry-run", cli.dry_run,
               "with --resume or --resume-from: check the checkpoint against this run (model, grid, "
               "optimizer) and say what the load would do (read as saved, or cut anew for another grid); "
               "nothing is trained or written");
  app.add_flag("--sample", cli.sample_only,
               "load the latest checkpoint and print run.sample_tokens sampled tokens; no training");
  app.add_option("--checkpoint", cli.checkpoint_dir,
                 "checkpoint root (default <run.out_dir>/checkpoints) or one step directory");
  app.add_option("--prompt", cli.prompt, "text the sample continues (byte vocabulary only)");
  add_autotune_options(app, cli.autotune);
  app.footer("\n" + gpt_settings_help() + "\nEngine keys (DeepSpeed names; the README explains each):\n" +
             zero::config_keys_help() +
             "\nExit status: 0 done; 75 stopped by SIGTERM/SIGINT/SIGUSR1 after saving a "
             "checkpoint\n(rerun with --resume); 1 error.\n");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (ctx.is_root()) return app.exit(e);
    return e.get_exit_code();
  }
  return std::nullopt;
}

std::string resume_command(int argc, char** argv) {
  std::string cmd;
  bool has_resume = false;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--resume-from") {
      ++i;
      continue;
    }
    if (a.rfind("--resume-from=", 0) == 0) continue;
    has_resume = has_resume || a == "--resume";
    if (a.find_first_of(" \t'\"*?$") != std::string::npos) {
      std::string q = "'";
      for (char c : a) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
      a = q + "'";
    }
    cmd += (i ? " " : "") + a;
  }
  return has_resume ? cmd : cmd + " --resume";
}

}  // namespace zero::gpt
