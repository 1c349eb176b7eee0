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
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cblas.h>
#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "gpt/autotune_run.hpp"
#include "gpt/data.hpp"
#include "gpt/ops.hpp"
#if ZERO_GPT_CUDA
#include "gpt/cuda_library.hpp"
#endif
#include "gpt/reporter.hpp"
#include "gpt/trainer.hpp"
#include "zero/checkpoint.hpp"
#include "zero/comm.hpp"
#include "zero/config.hpp"
#include "zero/context.hpp"
#include "zero/engine.hpp"
#include "zero/error.hpp"
#include "zero/groups.hpp"
#include "zero/preemption.hpp"

namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;
using zero::gpt::GptSettings;
using zero::gpt::GptTrainer;
using zero::gpt::Reporter;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// ------------------------------------------------------------------------------ command line

struct Cli {
  std::string config_path;
  std::vector<std::string> sets;
  bool print_config = false, resume = false, sample_only = false;
  std::string checkpoint_dir, prompt, resume_from;
  zero::gpt::AutotuneRequest autotune;
};

// Returns an exit status when the command line asks for no run (--help, a mistake).
std::optional<int> parse_cli(const zero::Context& ctx, int argc, char** argv, Cli& cli) {
  CLI::App app{"zero-gpt: GPT-2 training with ZeRO-sharded data parallelism (stages 0-3).\n"
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
  app.add_flag("--sample", cli.sample_only,
               "load the latest checkpoint and print run.sample_tokens sampled tokens; no training");
  app.add_option("--checkpoint", cli.checkpoint_dir,
                 "checkpoint root (default <run.out_dir>/checkpoints) or one step directory");
  app.add_option("--prompt", cli.prompt, "text the sample continues (byte vocabulary only)");
  zero::gpt::add_autotune_options(app, cli.autotune);
  app.footer("\n" + zero::gpt::gpt_settings_help() +
             "\nEngine keys (DeepSpeed names; the README explains each):\n" +
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

// ------------------------------------------------------------------------------ configuration

struct RunConfig {
  zero::Config cfg;
  GptSettings settings;
  std::string resolved_yaml;  // what ran, exactly: the engine's settings and the trainer's
};

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
  opts.extra_sections = zero::gpt::gpt_sections();
  opts.overrides = cli.sets;
  opts.total_num_steps = kPlaceholder;
  RunConfig rc{zero::load_config(cli.config_path, opts), {}, {}};
  rc.settings = zero::gpt::read_gpt_settings(rc.cfg);
  zero::SchedulerConfig& sched = rc.cfg.scheduler;
  if (sched.type != zero::SchedulerType::none && sched.total_num_steps == kPlaceholder) {
    sched.total_num_steps = rc.settings.steps;
    const std::string placeholder = std::to_string(kPlaceholder);
    for (auto& n : rc.cfg.notes)
      if (n.find(placeholder) != std::string::npos)
        n = "scheduler.params.total_num_steps: \"auto\" -> " + std::to_string(rc.settings.steps) +
            " (run.steps)";
    for (auto& a : rc.cfg.autos)
      if (a.value == placeholder) a = {a.path, std::to_string(rc.settings.steps), "run.steps"};
    ZERO_CHECK(sched.total_num_steps >= sched.warmup_num_steps,
               "scheduler.params.total_num_steps is \"auto\", so it is run.steps = " +
                   std::to_string(rc.settings.steps) + ", less than warmup_num_steps = " +
                   std::to_string(sched.warmup_num_steps) +
                   ": the run would end inside the warmup; raise run.steps or shorten the warmup");
  }
  // The engine's batch arithmetic counts data-parallel ranks: a tensor group and a pipeline
  // train one batch together (world / (tensor x pipeline) data-parallel ranks).
  rc.cfg.resolve(zero::gpt::gpt_data_parallel_size(rc.settings, world_size));
  // The resolved sections replace what the file said (a preset name becomes its shape), so a
  // checkpoint's saved config names the model's n_head and vocab_size for zero-ckpt export.
  for (auto& [name, yaml] : rc.settings.sections()) rc.cfg.extra_sections[name] = yaml;
  rc.resolved_yaml = resolved_yaml(rc.cfg, rc.settings);
  return rc;
}

// ------------------------------------------------------------------------------ machine

// Ranks sharing a machine share its cores; returns a hint for the log, or "".
// OpenBLAS (pthreads) and OpenMP keep separate thread pools whose idle threads spin, so with
// more than one thread per rank the two pools fight over the cores (a 3-5x slowdown measured on
// the tiny model) unless OpenMP waits passively, which only the environment can set before the
// process starts. Unless the user chose (OMP_NUM_THREADS or OPENBLAS_NUM_THREADS), each rank
// therefore gives its share of the cores to the matrix products and runs its own loops on one
// thread.
std::string configure_threads(const zero::Context& ctx, int& threads) {
  const char* omp = std::getenv("OMP_NUM_THREADS");
  const char* blas = std::getenv("OPENBLAS_NUM_THREADS");
  if (omp || blas) {
    threads = std::max(omp_get_max_threads(), openblas_get_num_threads());
    const char* wait = std::getenv("OMP_WAIT_POLICY");
    if (omp_get_max_threads() > 1 && openblas_get_num_threads() > 1 && !wait)
      return "hint: OpenMP and OpenBLAS both run several threads; export OMP_WAIT_POLICY=passive "
             "so their idle threads do not spin against each other";
    return "";
  }
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  threads = std::max(1, cores / std::max(1, ctx.local_size()));
  omp_set_num_threads(1);
  openblas_set_num_threads(threads);
  return "";
}

// Peak resident set size of this process (VmHWM), in bytes; 0 where /proc is unavailable.
double peak_rss_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::atof(line.c_str() + 6) * 1024.0;
  return 0.0;
}

// The per-device peak MFU divides by, and where it came from (unknown for a GPU without a
// planner preset: the run goes on without MFU). On the host every rank measures at once (ranks
// on one machine share its cores, as they do while training) and the mean counts.
zero::gpt::MfuPeak device_peak_tflops(zero::Context& ctx, const GptSettings& s, const zero::Config& cfg,
                                      int threads) {
  if (s.peak_tflops > 0) return {s.peak_tflops, "run.peak_tflops"};
#if ZERO_GPT_CUDA
  if (cfg.backend == zero::BackendKind::cuda) {
    // The dense bf16 tensor peak of the device's preset, or none known (an H100 PCIe, a
    // consumer card): MFU is then n/a until run.peak_tflops states it.
    // Never the host measurement below: its barrier would wait for ranks whose query worked.
    std::string name;
    double bytes = 0;
    if (zero::gpt::gpt_cuda_library().current_device(&name, &bytes))
      return zero::gpt::gpu_mfu_peak(s.peak_tflops, name, bytes);
    return {0.0, "the CUDA device could not be queried, so MFU is shown as n/a; set run.peak_tflops to its "
                 "dense bf16 tensor peak (TFLOP/s) to see it"};
  }
#else
  (void)cfg;
#endif
  ctx.comm().barrier();
  const double mine = zero::gpt::measure_host_sgemm_tflops();
  const double mean = ctx.comm().all_reduce_scalar(mine, zero::ReduceOp::avg);
  return {mean, "OpenBLAS sgemm measured at start, " + std::to_string(threads) + " thread" +
                    (threads == 1 ? "" : "s") + " per rank; set run.peak_tflops to state one"};
}

// ------------------------------------------------------------------------------ phases

std::vector<int> prompt_tokens(const std::string& prompt) {
  std::vector<int> t;
  for (unsigned char c : prompt) t.push_back(c);
  return t;
}

// This process's command line with --resume added (once), each word quoted for a shell where
// it needs to be; the launcher (mpirun, srun) is not visible from here and goes in front.
// --resume-from goes: the run continues from its own checkpoints now.
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

// Collective only at its start (GptTrainer::sample); rank 0 samples, prints the sample and writes
// <out_dir>/sample.txt if given.
void print_sample(zero::Context& ctx, GptTrainer& trainer, const Cli& cli, Reporter* rep,
                  const std::string& out_dir) {
  const GptSettings& s = trainer.settings();
  if (s.sample_tokens <= 0) return;
  const std::vector<int> out = trainer.sample(prompt_tokens(cli.prompt), s.sample_tokens,
                                              static_cast<float>(s.temperature), s.top_k,
                                              s.data_seed);
  if (!ctx.is_root()) return;
  std::string text = cli.prompt;
  if (trainer.model_config().vocab_size == 256) {
    text += zero::gpt::decode_bytes(out);
  } else {
    // No BPE decoder here: print the ids (decode them with the GPT-2 tokenizer).
    for (int t : out) text += std::to_string(t) + " ";
  }
  std::printf("--- sample (%zu tokens, temperature %.2f, top_k %d) ---\n%s\n---\n", out.size(),
              s.temperature, s.top_k, text.c_str());
  std::fflush(stdout);
  if (rep && !out_dir.empty()) rep->write_file((fs::path(out_dir) / "sample.txt").string(), text + '\n');
}

// Rank 0 creates out_dir; every rank waits for it.
void create_run_dir(zero::Context& ctx, const RunConfig& rc) {
  const std::string& dir = rc.settings.out_dir;
  if (ctx.is_root()) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    ZERO_CHECK(!ec, "zero-gpt: cannot create run.out_dir '" + dir + "': " + ec.message() +
                        "; choose a writable directory");
  }
  ctx.comm().barrier();
}

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

void report_header(Reporter& rep, const RunConfig& rc, GptTrainer& trainer, const RunFacts& f,
                   bool resumed, bool config_saved) {
  const zero::Config& cfg = rc.cfg;
  const auto& mc = trainer.model_config();
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "zero-gpt: %d rank%s, ZeRO stage %d, %s parameters (the host model computes in "
                "fp32), %d thread%s per rank",
                f.world, f.world == 1 ? "" : "s", cfg.zero_optimization.stage,
                std::string(zero::dtype_name(cfg.compute_dtype())).c_str(), f.threads,
                f.threads == 1 ? "" : "s");
  rep.line(buf);
  if (!f.thread_hint.empty()) rep.line(f.thread_hint);
  const zero::gpt::PipelineReport pr = trainer.pipeline_report();
  const std::string tensor_note =
      trainer.tensor_parallel_size() > 1
          ? "each layer split over " + std::to_string(trainer.tensor_parallel_size()) + " ranks (tensor parallel), "
          : std::string();
  if (pr.stages > 1)
    rep.line("nodes: " + f.nodes + "; grid " + pr.describe() + " (rank 0's stage; " + tensor_note +
             "each stage's engine reduces over its " + std::to_string(pr.data) + " data-parallel ranks)");
  else if (trainer.tensor_parallel_size() > 1)
    rep.line("nodes: " + f.nodes + "; grid " + trainer.grid() + ": " + tensor_note +
             "the engine's collectives over the data-parallel group");
  else
    rep.line("nodes: " + f.nodes + "; grid " + trainer.grid() +
             ": the engine's collectives span all ranks (one data-parallel group)");
  rep.line("model: " + mc.describe() + " (preset " + rc.settings.preset + ")");
  rep.line("data: train " + trainer.train_data().description() + "; validation " +
           (trainer.val_data() ? trainer.val_data()->description() : std::string("none")));
  std::snprintf(buf, sizeof buf,
                "batch: %lld sequences x %d tokens = %lld tokens per step (micro-batch %lld x "
                "accumulation %lld x %d data-parallel ranks); activations %s per rank",
                static_cast<long long>(cfg.train_batch_size), mc.seq_len,
                static_cast<long long>(trainer.tokens_per_step()),
                static_cast<long long>(cfg.train_micro_batch_size_per_gpu),
                static_cast<long long>(cfg.gradient_accumulation_steps), trainer.data_parallel_size(),
                zero::gpt::format_mib(static_cast<double>(trainer.activation_bytes())).c_str());
  rep.line(buf);
  std::string flops = "flops per token: 6N + 6LTC = " + zero::gpt::format_si(f.flops.model);
  if (f.flops.recompute > 0)
    flops += " + " + zero::gpt::format_si(f.flops.recompute) + " recomputed (activation checkpointing)";
  std::snprintf(buf, sizeof buf, "; F = %.2f per parameter", f.flops.total() / f.params);
  flops += buf;
  if (f.peak.known()) {
    std::snprintf(buf, sizeof buf, "; MFU against %.4g TFLOPs per device (%s)", f.peak.tflops, f.peak.source.c_str());
    flops += buf;
  }
  rep.line(flops);
  if (!f.peak.known()) rep.line("note: " + f.peak.source);  // once; the step lines say n/a
  rep.line("memory: " + trainer.engine().memory().to_string());
  for (const auto& n : cfg.notes) rep.line("note: " + n);
  if (resumed)
    rep.line("resumed from " + f.resumed_from + " at step " + std::to_string(f.start_step));
  rep.line("--- resolved configuration (" + std::string(config_saved ? "saved to " : "NOT saved to ") +
           (fs::path(rc.settings.out_dir) / "config.yaml").string() + ") ---\n" +
           rc.resolved_yaml + "---");
  rep.record({{"type", "start"},
              {"step", f.start_step},
              {"name", fs::path(rc.settings.out_dir).filename().string()},
              {"model", mc.describe()},
              {"params", f.params},
              {"world", f.world},
              {"grid", trainer.grid()},
              {"tensor_parallel", trainer.tensor_parallel_size()},
              {"pipeline_parallel", pr.stages},
              {"data_parallel", trainer.data_parallel_size()},
              {"pipeline_bubble", pr.bubble},
              {"stage", cfg.zero_optimization.stage},
              {"tokens_per_step", f.tokens_per_step},
              {"flops_per_token", f.flops.total()},
              {"model_flops_per_token", f.flops.model},
              {"peak_tflops_per_device",
               f.peak.known() ? nlohmann::ordered_json(f.peak.tflops) : nlohmann::ordered_json()}});
}

// The optimizer steps of one session, with the clocks and counters their log lines need.
class TrainingLoop {
 public:
  TrainingLoop(zero::Context& ctx, GptTrainer& trainer, Reporter& rep, const RunFacts& facts)
      : ctx_(ctx), trainer_(trainer), rep_(rep), f_(facts), s_(trainer.settings()) {}

  // Trains from facts.start_step to run.steps. Returns false when a stop signal ended the
  // session early (a checkpoint of the last step taken is then saved).
  bool run() {
    const std::int64_t steps = s_.steps;
    if (f_.start_step >= steps)
      rep_.line("the checkpoint is at step " + std::to_string(f_.start_step) + ", run.steps is " +
                std::to_string(steps) + ": nothing to train (raise run.steps to continue)");
    zero::StopSignal stop_signal;
    // Imported weights are evaluated before they change: the loss they bring (step 0).
    if (!s_.init_from.empty() && f_.start_step == 0 && steps > 0) evaluate(0);
    for (std::int64_t step = f_.start_step + 1; step <= steps; ++step) {
      const auto t0 = Clock::now();
      const zero::TrafficBytes sent = trainer_.traffic();
      const GptTrainer::Step s = trainer_.train_step();
      step_traffic_ = trainer_.traffic() - sent;
      const double dt = seconds_since(t0);
      train_seconds_ += dt;
      interval_seconds_ += dt;
      ++interval_steps_;
      log_step(step, s);
      if ((s_.eval_interval > 0 && step % s_.eval_interval == 0) || step == steps) evaluate(step);
      const bool saved = s_.save_interval > 0 && (step % s_.save_interval == 0 || step == steps);
      if (saved) save(step);
      // Every rank asks after the same step; the last step needs no stop.
      if (step < steps && zero::stop_requested(ctx_)) {
        stop(step, saved);
        return false;
      }
    }
    return true;
  }

  // The closing line: steps, time, throughput, the last validation loss.
  void report_done() {
    if (f_.start_step >= s_.steps) {  // run() said why: nothing was trained
      rep_.line("done: no steps trained (the checkpoint is at step " + std::to_string(f_.start_step) +
                ", run.steps is " + std::to_string(s_.steps) + ")");
      return;
    }
    const std::int64_t ran = s_.steps - f_.start_step;
    std::string val = "none (no validation data: data.val is 'none', or shards without data.val)";
    if (trainer_.has_validation())
      val = std::isfinite(last_val_) ? zero::gpt::format_significant(last_val_, 5) : "not evaluated";
    rep_.line("done: " + std::to_string(ran) + " steps in " +
              zero::gpt::format_duration(seconds_since(start_)) + " (" +
              zero::gpt::format_significant(
                  ran > 0 ? f_.samples_per_step * static_cast<double>(ran) / train_seconds_ : 0.0) +
              " samples/s), final val loss " + val);
  }

 private:
  void log_step(std::int64_t step, const GptTrainer::Step& s) {
    const std::int64_t steps = s_.steps;
    const double wall = seconds_since(start_);
    const double done = static_cast<double>(step - f_.start_step);  // steps in this session
    const double eta = wall / done * static_cast<double>(steps - step);
    if (step % trainer_.engine().config().steps_per_print != 0 && step != steps &&
        step != f_.start_step + 1) {
      rep_.progress(step, steps, s.loss, eta);
      return;
    }
    zero::gpt::TrainRecord r;
    r.step = step;
    r.steps = steps;
    r.tokens = f_.tokens_per_step * static_cast<double>(step);
    r.loss = s.loss;
    r.lr = s.result.lr;
    r.grad_norm = s.result.grad_norm;
    r.loss_scale = s.result.loss_scale;
    r.skipped = s.result.skipped;
    r.samples_per_s = f_.samples_per_step * static_cast<double>(interval_steps_) / interval_seconds_;
    r.samples_per_s_avg = f_.samples_per_step * done / train_seconds_;
    r.tokens_per_s = f_.tokens_per_step * static_cast<double>(interval_steps_) / interval_seconds_;
    r.tflops_per_device = f_.flops.total() * r.tokens_per_s / f_.world / 1e12;
    r.flops_factor = f_.flops.total() / f_.params;
    r.mfu = f_.peak.known() ? f_.flops.model * r.tokens_per_s / f_.world / 1e12 / f_.peak.tflops
                            : std::numeric_limits<double>::quiet_NaN();
    r.model_state_bytes = static_cast<double>(trainer_.engine().memory().model_state());
    r.peak_rss_bytes = ctx_.comm().all_reduce_scalar(peak_rss_bytes(), zero::ReduceOp::max);
    r.eta_s = eta;
    r.token_budget = s_.token_budget;
    r.token_budget_days = s_.token_budget / r.tokens_per_s / 86400.0;  // at the current rate
    r.elapsed_s = wall;
    r.intra_node_bytes = static_cast<double>(step_traffic_.intra_node);
    r.inter_node_bytes = static_cast<double>(step_traffic_.inter_node);
    // The ranks that send across nodes are those whose ring neighbour is on another node, which
    // rank 0 (whose record this is) often is not: the busiest rank's figure is the link's load.
    r.inter_node_bytes_max = ctx_.comm().all_reduce_scalar(r.inter_node_bytes, zero::ReduceOp::max);
    const zero::gpt::PipelineReport pr = trainer_.pipeline_report();
    r.tensor_parallel = pr.tensor;
    r.pipeline_parallel = pr.stages;
    r.data_parallel = pr.data;
    r.pipeline_bubble = pr.bubble;
    rep_.train(r);
    interval_seconds_ = 0.0;
    interval_steps_ = 0;
  }

  void evaluate(std::int64_t step) {
    if (!trainer_.has_validation()) return;
    const auto t0 = Clock::now();
    const GptTrainer::Evaluation e = trainer_.evaluate();
    last_val_ = e.loss;
    zero::gpt::EvalRecord r;
    r.step = step;
    r.tokens = f_.tokens_per_step * static_cast<double>(step);
    r.val_loss = e.loss;
    r.val_sequences = e.sequences;
    r.val_tokens = e.tokens;
    r.seconds = seconds_since(t0);
    r.elapsed_s = seconds_since(start_);
    rep_.eval(r);
  }

  void save(std::int64_t step) {
    const auto t0 = Clock::now();
    trainer_.save_checkpoint(f_.checkpoint_dir);
    rep_.line("checkpoint: step " + std::to_string(step) + " saved to " + f_.checkpoint_dir +
              " (" + zero::gpt::format_duration(seconds_since(t0)) + ")");
  }

  void stop(std::int64_t step, bool saved) {
    const int signo = zero::StopSignal::received();
    const std::string by = signo != 0 ? std::string("signal ") + ::strsignal(signo)
                                      : std::string("a signal on another rank");
    if (!saved) save(step);
    rep_.line("stopped by " + by + " after step " + std::to_string(step) + " of " +
              std::to_string(s_.steps) + "; checkpoint in " + f_.checkpoint_dir +
              "; resume with (behind the same mpirun or srun):\n  " + f_.resume_command);
    rep_.record({{"type", "stop"}, {"step", step}, {"checkpoint", f_.checkpoint_dir}});
  }

  zero::Context& ctx_;
  GptTrainer& trainer_;
  Reporter& rep_;
  const RunFacts& f_;
  const GptSettings& s_;
  const Clock::time_point start_ = Clock::now();
  double train_seconds_ = 0.0;  // optimizer steps only: evaluation excluded from throughput
  double interval_seconds_ = 0.0;
  std::int64_t interval_steps_ = 0;
  zero::TrafficBytes step_traffic_;  // what this rank sent in the last step's collectives
  double last_val_ = std::numeric_limits<double>::quiet_NaN();
};

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
    if (ctx.is_root()) std::printf("%s%s", autos.c_str(), rc.resolved_yaml.c_str());
    return 0;
  }
  if (cli.autotune.enabled) {
    ZERO_CHECK(!cli.resume && cli.resume_from.empty() && !cli.sample_only,
               "zero-gpt: --autotune times candidates from the initial parameters; it does not combine "
               "with --resume or --sample (tune first, then resume with the winner's config file)");
    const zero::gpt::AutotuneOutcome tuned = zero::gpt::run_autotune(ctx, rc.cfg, settings, cli.autotune);
    if (ctx.is_root()) {
      std::printf("%s", zero::gpt::autotune_report(tuned).c_str());
      std::fflush(stdout);
    }
    ZERO_CHECK(tuned.result.found, "zero-gpt --autotune: no candidate ran (" + tuned.table_path +
                                       " says why each was skipped or failed); widen the lists or "
                                       "raise --autotune-memory");
    if (cli.autotune.then == "exit") return 0;
    rc.cfg = tuned.result.best;
    rc.settings = zero::gpt::with_grid(rc.settings, tuned.result.best_trial.grid);  // `settings` follows
    rc.resolved_yaml = resolved_yaml(rc.cfg, settings);
  }
  // Data and engine first: a wrong data path fails before the run directory is created.
  GptTrainer trainer(ctx, rc.cfg, settings);
  ZERO_CHECK(cli.prompt.empty() || trainer.model_config().vocab_size == 256,
             "zero-gpt: --prompt needs the byte vocabulary (model.vocab_size 256); this model's "
             "tokens come from another tokenizer");
  facts.resume_command = resume_command(argc, argv);
  facts.checkpoint_dir = cli.checkpoint_dir.empty()
                             ? (fs::path(settings.out_dir) / "checkpoints").string()
                             : cli.checkpoint_dir;
  if (cli.sample_only) {
    // Only reads: a sample may be taken beside the job that is writing the checkpoints.
    const std::int64_t at = trainer.load_checkpoint(facts.checkpoint_dir, "latest", /*read_only=*/true);
    if (ctx.is_root())
      std::printf("loaded %s (step %lld)\n", facts.checkpoint_dir.c_str(), static_cast<long long>(at));
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
  // The whole model's (this rank's layout holds its tensor-parallel part of its stage).
  facts.params = static_cast<double>(trainer.model_config().num_params());
  facts.samples_per_step = static_cast<double>(rc.cfg.train_batch_size);
  facts.tokens_per_step = static_cast<double>(trainer.tokens_per_step());
  facts.flops = zero::gpt::training_flops_per_token(trainer.model_config());
  facts.peak = device_peak_tflops(ctx, settings, rc.cfg, facts.threads);

  const bool progress = settings.progress == "on" ||
                        (settings.progress == "auto" && facts.world == 1 && ::isatty(STDOUT_FILENO));
  Reporter rep(ctx.is_root(),
               settings.log_jsonl ? (fs::path(settings.out_dir) / "metrics.jsonl").string() : "",
               !facts.resumed_from.empty(), progress, settings.strict_outputs);
  const bool config_saved = rep.write_file((fs::path(settings.out_dir) / "config.yaml").string(), rc.resolved_yaml);
  report_header(rep, rc, trainer, facts, !facts.resumed_from.empty(), config_saved);

  TrainingLoop loop(ctx, trainer, rep, facts);
  if (!loop.run()) return zero::kExitStopped;
  loop.report_done();
  print_sample(ctx, trainer, cli, &rep, settings.out_dir);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  zero::Context ctx(&argc, &argv);
  return ctx.run([&] { return run(ctx, argc, argv); });
}
