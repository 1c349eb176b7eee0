// zero-gpt: trains a GPT-2 model with ZeRO-sharded data parallelism.
//
//   mpirun -np 2 build/release/examples/gpt/zero-gpt --config examples/gpt/configs/tiny.yaml
//   zero-gpt --config run.yaml --set zero_optimization.stage=3 --set run.steps=200
//
// The config file holds the engine's settings (DeepSpeed key names) plus three sections of the
// trainer's own (model, data, run; see --help). Rank 0 prints the resolved configuration, logs
// a line every steps_per_print steps (the same records go to <out_dir>/metrics.jsonl),
// evaluates every run.eval_interval steps and prints a sample at the end. With
// run.save_interval it checkpoints into <out_dir>/checkpoints; --resume continues from there
// (at any rank count and stage; under model.tensor_parallel at any data-parallel size with the
// same tensor size), --sample only prints a sample from a checkpoint.
//
// SIGTERM, SIGINT or SIGUSR1 on any rank stops every rank after the same step: a checkpoint is
// saved, its place and the command that resumes from it are printed, and the exit status is
// zero::kExitStopped (75). A second signal ends the process at once.
//
// run() reads as the phases of a run: the command line, the configuration (loaded once), the
// trainer, the run directory, the header of the log, the training loop, the sample.
#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "gpt/autotune_run.hpp"
#include "gpt/command_line.hpp"
#include "gpt/data.hpp"
#include "gpt/machine.hpp"
#include "gpt/reporter.hpp"
#include "gpt/run_config.hpp"
#include "gpt/trainer.hpp"
#include "gpt/training_loop.hpp"
#include "zero/checkpoint.hpp"
#include "zero/comm.hpp"
#include "zero/config.hpp"
#include "zero/context.hpp"
#include "zero/error.hpp"
#include "zero/groups.hpp"
#include "zero/preemption.hpp"

namespace {

namespace fs = std::filesystem;
using namespace zero::gpt;

std::vector<int> prompt_tokens(const std::string& prompt) {
  std::vector<int> t;
  for (unsigned char c : prompt) t.push_back(c);
  return t;
}

// Collective only at its start (GptTrainer::sample); rank 0 samples, prints the sample and writes
// <out_dir>/sample.txt if given.
void print_sample(zero::Context& ctx, GptTrainer& trainer, const Cli& cli, Reporter* rep, const std::string& out_dir) {
  const GptSettings& s = trainer.settings();
  if (s.sample_tokens <= 0) return;
  const std::vector<int> out = trainer.sample(prompt_tokens(cli.prompt), s.sample_tokens,
                                              static_cast<float>(s.temperature), s.top_k, s.data_seed);
  if (!ctx.is_root()) return;
  std::string text = cli.prompt;
  if (trainer.model_config().vocab_size == 256) {
    text += decode_bytes(out);
  } else {
    // No BPE decoder here: print the ids (decode them with the GPT-2 tokenizer).
    for (int t : out) text += fmt::format("{} ", t);
  }
  std::fputs(fmt::format("--- sample ({} tokens, temperature {:.2f}, top_k {}) ---\n{}\n---\n", out.size(),
                         s.temperature, s.top_k, text)
                 .c_str(),
             stdout);
  std::fflush(stdout);
  if (rep && !out_dir.empty()) rep->write_file((fs::path(out_dir) / "sample.txt").string(), text + '\n');
}

// Rank 0 creates out_dir; every rank waits for it.
void create_run_dir(zero::Context& ctx, const RunConfig& rc) {
  const std::string& dir = rc.settings.out_dir;
  if (ctx.is_root()) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    ZERO_CHECK(!ec,
               "zero-gpt: cannot create run.out_dir '" + dir + "': " + ec.message() + "; choose a writable directory");
  }
  ctx.comm().barrier();
}

int run(zero::Context& ctx, int argc, char** argv) {
  Cli cli;
  if (const std::optional<int> status = parse_cli(ctx, argc, argv, cli)) return *status;
  RunFacts facts;
  facts.world = ctx.world_size();
  facts.thread_hint = configure_threads(ctx, facts.threads);

  RunConfig rc = load_run_config(cli, ctx.world_size());
  const GptSettings& settings = rc.settings;
  if (cli.print_config) {
    // The "auto" block as YAML comments, so the output still loads as a config.
    std::string autos = rc.cfg.auto_block();
    for (std::size_t at = 0; at < autos.size(); at = autos.find('\n', at) + 1) autos.insert(at, "# ");
    if (ctx.is_root()) std::fputs((autos + rc.resolved_yaml).c_str(), stdout);
    return 0;
  }
  if (cli.autotune.enabled) {
    ZERO_CHECK(!cli.resume && cli.resume_from.empty() && !cli.sample_only,
               "zero-gpt: --autotune times candidates from the initial parameters; it does not combine "
               "with --resume or --sample (tune first, then resume with the winner's config file)");
    const AutotuneOutcome tuned = run_autotune(ctx, rc.cfg, settings, cli.autotune);
    if (ctx.is_root()) {
      std::fputs(autotune_report(tuned).c_str(), stdout);
      std::fflush(stdout);
    }
    ZERO_CHECK(tuned.result.found, "zero-gpt --autotune: no candidate ran (" + tuned.table_path +
                                       " says why each was skipped or failed); widen the lists or "
                                       "raise --autotune-memory");
    if (cli.autotune.then == "exit") return 0;
    rc.cfg = tuned.result.best;
    rc.settings = with_grid(rc.settings, tuned.result.best_trial.grid);  // `settings` follows
    rc.resolved_yaml = resolved_yaml(rc.cfg, settings);
  }
  // Data and engine first: a wrong data path fails before the run directory is created.
  GptTrainer trainer(ctx, rc.cfg, settings);
  ZERO_CHECK(cli.prompt.empty() || trainer.model_config().vocab_size == 256,
             "zero-gpt: --prompt needs the byte vocabulary (model.vocab_size 256); this model's "
             "tokens come from another tokenizer");
  facts.resume_command = resume_command(argc, argv);
  facts.checkpoint_dir =
      cli.checkpoint_dir.empty() ? (fs::path(settings.out_dir) / "checkpoints").string() : cli.checkpoint_dir;
  if (cli.dry_run) {
    ZERO_CHECK(cli.resume || !cli.resume_from.empty(),
               "zero-gpt: --dry-run checks a resume: give --resume or --resume-from as well");
    const std::string from = cli.resume_from.empty() ? facts.checkpoint_dir : cli.resume_from;
    trainer.load_checkpoint(from, "latest", /*read_only=*/true, /*dry_run=*/true);
    if (ctx.is_root())
      std::fputs(
          fmt::format("zero-gpt --dry-run: {} resumes in this run; nothing was trained or written\n", from).c_str(),
          stdout);
    return 0;
  }
  if (cli.sample_only) {
    // Only reads: a sample may be taken beside the job that is writing the checkpoints.
    const std::int64_t at = trainer.load_checkpoint(facts.checkpoint_dir, "latest", /*read_only=*/true);
    if (ctx.is_root()) std::fputs(fmt::format("loaded {} (step {})\n", facts.checkpoint_dir, at).c_str(), stdout);
    print_sample(ctx, trainer, cli, nullptr, "");
    return 0;
  }
  // A run may save into its checkpoint root at any step (a stop signal saves too): take the
  // root now, and the run directory its logs go to, so a second job on either is refused
  // before it trains or writes anything.
  zero::lock_checkpoint_root(trainer.engine(), facts.checkpoint_dir);
  zero::lock_run_directory(trainer.engine(), settings.out_dir);
  // Hours of training must not end in a first save that cannot fit.
  zero::check_checkpoint_space(trainer.engine(), facts.checkpoint_dir);
  if (!cli.resume_from.empty()) {
    facts.start_step = trainer.load_checkpoint(cli.resume_from);
    facts.resumed_from = cli.resume_from;
  } else if (cli.resume) {
    facts.start_step = trainer.load_checkpoint(facts.checkpoint_dir);
    facts.resumed_from = facts.checkpoint_dir;
  }
  create_run_dir(ctx, rc);

  facts.nodes = zero::node_layout(ctx).describe();
  // The whole model's (this rank's layout holds its tensor-parallel share of its pipeline part).
  facts.params = static_cast<double>(trainer.model_config().num_params());
  facts.samples_per_step = static_cast<double>(rc.cfg.train_batch_size);
  facts.tokens_per_step = static_cast<double>(trainer.tokens_per_step());
  facts.flops = training_flops_per_token(trainer.model_config());
  facts.peak = device_peak_tflops(ctx, settings, rc.cfg, facts.threads);

  const bool progress =
      settings.progress == "on" || (settings.progress == "auto" && facts.world == 1 && ::isatty(STDOUT_FILENO));
  Reporter rep(ctx.is_root(), settings.log_jsonl ? (fs::path(settings.out_dir) / "metrics.jsonl").string() : "",
               !facts.resumed_from.empty(), progress, settings.strict_outputs);
  const bool config_saved = rep.write_file((fs::path(settings.out_dir) / "config.yaml").string(), rc.resolved_yaml);
  report_header(rep, rc, trainer, facts, !facts.resumed_from.empty(), config_saved);

  if (!train_session(ctx, trainer, rep, facts)) return zero::kExitStopped;
  print_sample(ctx, trainer, cli, &rep, settings.out_dir);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  zero::Context ctx(&argc, &argv);
  return ctx.run([&] { return run(ctx, argc, argv); });
}
