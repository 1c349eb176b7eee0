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
// (at any rank count and stage), --sample only prints a sample from a checkpoint.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cblas.h>
#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "data.hpp"
#include "trainer.hpp"
#include "zero/comm.hpp"
#include "zero/config.hpp"
#include "zero/context.hpp"
#include "zero/engine.hpp"
#include "zero/error.hpp"

namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

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

std::string duration(double s) {
  char buf[64];
  if (!std::isfinite(s) || s < 0) return "?";
  const long t = std::lround(s);
  if (t >= 86400)
    std::snprintf(buf, sizeof buf, "%ldd%02ldh", t / 86400, (t % 86400) / 3600);
  else if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 3600, (t % 3600) / 60);
  else if (t >= 60)
    std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  else
    std::snprintf(buf, sizeof buf, "%lds", t);
  return buf;
}

std::string mib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / (1024.0 * 1024.0));
  return buf;
}

std::string si(double v) {
  char buf[32];
  if (v >= 1e9) std::snprintf(buf, sizeof buf, "%.2fG", v / 1e9);
  else if (v >= 1e6) std::snprintf(buf, sizeof buf, "%.2fM", v / 1e6);
  else if (v >= 1e3) std::snprintf(buf, sizeof buf, "%.2fk", v / 1e3);
  else std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

// Peak resident set size of this process (VmHWM), in bytes; 0 where /proc is unavailable.
double peak_rss_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::atof(line.c_str() + 6) * 1024.0;
  return 0.0;
}

std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

// Rank 0's output: the log lines, metrics.jsonl, and the one-line progress display on a
// terminal (overwritten in place, cleared before each regular line).
class Reporter {
 public:
  Reporter(bool root, const std::string& out_dir, bool jsonl, bool progress, bool append)
      : root_(root), tty_(progress) {
    if (!root_) return;
    if (jsonl) {
      const std::string path = (fs::path(out_dir) / "metrics.jsonl").string();
      jsonl_.open(path, append ? std::ios::app : std::ios::trunc);
      ZERO_CHECK(jsonl_, "zero-gpt: cannot write " + path + "; check run.out_dir");
    }
  }
  void line(const std::string& s) {
    if (!root_) return;
    clear_progress();
    std::printf("%s\n", s.c_str());
    std::fflush(stdout);
  }
  void record(const std::string& json) {
    if (!root_ || !jsonl_.is_open()) return;
    jsonl_ << json << '\n';
    jsonl_.flush();
  }
  void progress(const std::string& s) {
    if (!root_ || !tty_) return;
    std::printf("\r\033[K%s", s.c_str());
    std::fflush(stdout);
    shown_ = true;
  }

 private:
  void clear_progress() {
    if (shown_) std::printf("\r\033[K");
    shown_ = false;
  }
  bool root_ = false, tty_ = false, shown_ = false;
  std::ofstream jsonl_;
};

int run(zero::Context& ctx, int argc, char** argv) {
  CLI::App app{"zero-gpt: GPT-2 training with ZeRO-sharded data parallelism (stages 0-3).\n"
               "Launch with mpirun / srun for several ranks; a single process needs no launcher."};
  std::string config_path;
  std::vector<std::string> sets;
  bool print_config = false, resume = false, sample_only = false;
  std::string checkpoint_dir, prompt;
  app.add_option("-c,--config", config_path,
                 "YAML or DeepSpeed JSON file: engine keys plus the model/data/run sections")
      ->required()
      ->check(CLI::ExistingFile);
  app.add_option("--set", sets,
                 "override one key, e.g. --set zero_optimization.stage=3 --set run.steps=200 "
                 "(repeatable; validated like the file)")
      ->take_all();
  app.add_flag("--print-config", print_config, "print the resolved configuration and exit");
  app.add_flag("--resume", resume,
               "continue from the latest checkpoint (in <run.out_dir>/checkpoints, or --checkpoint); "
               "the rank count and ZeRO stage may differ from the run that saved it");
  app.add_flag("--sample", sample_only,
               "load the latest checkpoint and print run.sample_tokens sampled tokens; no training");
  app.add_option("--checkpoint", checkpoint_dir,
                 "checkpoint root (default <run.out_dir>/checkpoints) or one step directory");
  app.add_option("--prompt", prompt, "text the sample continues (byte vocabulary only)");
  app.footer("\n" + zero::gpt::gpt_settings_help() +
             "\nEngine keys (DeepSpeed names): train_micro_batch_size_per_gpu, "
             "gradient_accumulation_steps,\ntrain_batch_size, gradient_clipping, steps_per_print, "
             "zero_optimization.*, fp16.*, bf16.enabled,\noptimizer.{type,params.*}, "
             "scheduler.{type,params.*}; see the README.\n");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (ctx.is_root()) return app.exit(e);
    return e.get_exit_code();
  }

  int threads = 1;
  const std::string thread_hint = configure_threads(ctx, threads);

  // The scheduler's total_num_steps may be "auto" (= run.steps), which lives in the same file:
  // read the file once to learn run.steps, then load it for real.
  zero::LoadOptions opts;
  opts.extra_sections = zero::gpt::gpt_sections();
  opts.overrides = sets;
  opts.total_num_steps = std::numeric_limits<std::int32_t>::max();
  zero::gpt::GptSettings settings = zero::gpt::read_gpt_settings(zero::load_config(config_path, opts));
  opts.total_num_steps = settings.steps;
  zero::Config cfg = zero::load_config(config_path, opts);
  cfg.resolve(ctx.world_size());
  settings = zero::gpt::read_gpt_settings(cfg);

  // What ran, exactly: the engine's resolved settings with the trainer's resolved sections.
  zero::Config shown = cfg;
  for (auto& [name, yaml] : settings.sections()) shown.extra_sections[name] = yaml;
  const std::string resolved_yaml = shown.to_yaml();
  if (print_config) {
    if (ctx.is_root()) std::printf("%s", resolved_yaml.c_str());
    return 0;
  }
  // Data and engine first: a wrong data path fails before the run directory is created.
  zero::gpt::GptTrainer trainer(ctx, cfg, settings);
  const auto& mc = trainer.model_config();
  if (checkpoint_dir.empty()) checkpoint_dir = (fs::path(settings.out_dir) / "checkpoints").string();
  ZERO_CHECK(prompt.empty() || mc.vocab_size == 256,
             "zero-gpt: --prompt needs the byte vocabulary (model.vocab_size 256); this model's "
             "tokens come from another tokenizer");
  std::vector<int> prompt_tokens;
  for (unsigned char c : prompt) prompt_tokens.push_back(c);
  auto print_sample = [&](const std::string& out_dir) {
    if (settings.sample_tokens <= 0) return;
    std::vector<int> out = trainer.sample(prompt_tokens, settings.sample_tokens,
                                          static_cast<float>(settings.temperature), settings.top_k,
                                          settings.data_seed);
    if (!ctx.is_root()) return;
    std::string text = prompt;
    if (mc.vocab_size == 256) {
      text += zero::gpt::decode_bytes(out);
    } else {
      // No BPE decoder here: print the ids (decode them with the GPT-2 tokenizer).
      for (int t : out) text += std::to_string(t) + " ";
    }
    std::printf("--- sample (%zu tokens, temperature %.2f, top_k %d) ---\n%s\n---\n", out.size(),
                settings.temperature, settings.top_k, text.c_str());
    std::fflush(stdout);
    if (!out_dir.empty()) std::ofstream(fs::path(out_dir) / "sample.txt") << text << '\n';
  };
  if (sample_only) {
    const std::int64_t at = trainer.load_checkpoint(checkpoint_dir);
    if (ctx.is_root()) std::printf("loaded %s (step %lld)\n", checkpoint_dir.c_str(), static_cast<long long>(at));
    print_sample("");
    return 0;
  }
  std::int64_t start_step = 0;
  if (resume) start_step = trainer.load_checkpoint(checkpoint_dir);
  if (ctx.is_root()) {
    std::error_code ec;
    fs::create_directories(settings.out_dir, ec);
    ZERO_CHECK(!ec, "zero-gpt: cannot create run.out_dir '" + settings.out_dir + "': " +
                        ec.message() + "; choose a writable directory");
    std::ofstream(fs::path(settings.out_dir) / "config.yaml") << resolved_yaml;
  }
  ctx.comm().barrier();  // out_dir exists before anyone writes to it

  zero::Engine& engine = trainer.engine();
  const int world = ctx.world_size();
  const double params = static_cast<double>(engine.layout().num_params());
  const double flops_factor = mc.activation_checkpointing ? 8.0 : 6.0;
  const double samples_per_step = static_cast<double>(cfg.train_batch_size);

  const bool progress = settings.progress == "on" ||
                        (settings.progress == "auto" && world == 1 && ::isatty(STDOUT_FILENO));
  Reporter rep(ctx.is_root(), settings.out_dir, settings.log_jsonl, progress, resume);
  {
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "zero-gpt: %d rank%s, ZeRO stage %d, %s parameters (the host model computes in "
                  "fp32), %d thread%s per rank",
                  world, world == 1 ? "" : "s", cfg.zero_optimization.stage,
                  std::string(zero::dtype_name(cfg.compute_dtype())).c_str(), threads,
                  threads == 1 ? "" : "s");
    rep.line(buf);
    if (!thread_hint.empty()) rep.line(thread_hint);
    rep.line("model: " + mc.describe() + " (preset " + settings.preset + ")");
    rep.line("data: train " + trainer.train_data().description() + "; validation " +
             (trainer.val_data() ? trainer.val_data()->description() : std::string("none")));
    std::snprintf(buf, sizeof buf,
                  "batch: %lld sequences x %d tokens = %lld tokens per step (micro-batch %lld x "
                  "accumulation %lld x %d ranks); activations %s per rank",
                  static_cast<long long>(cfg.train_batch_size), mc.seq_len,
                  static_cast<long long>(trainer.tokens_per_step()),
                  static_cast<long long>(cfg.train_micro_batch_size_per_gpu),
                  static_cast<long long>(cfg.gradient_accumulation_steps), world,
                  mib(static_cast<double>(trainer.activation_bytes())).c_str());
    rep.line(buf);
    rep.line("memory: " + engine.memory().to_string());
    for (const auto& n : cfg.notes) rep.line("note: " + n);
    if (resume)
      rep.line("resumed from " + checkpoint_dir + " at step " + std::to_string(start_step));
    rep.line("--- resolved configuration (saved to " +
             (fs::path(settings.out_dir) / "config.yaml").string() + ") ---\n" + resolved_yaml +
             "---");
  }

  const std::int64_t steps = settings.steps;
  const std::int64_t print_every = cfg.steps_per_print;
  const auto start = Clock::now();
  double train_seconds = 0.0;  // optimizer steps only: evaluation excluded from throughput
  double interval_seconds = 0.0;
  std::int64_t interval_steps = 0;
  double last_val = std::numeric_limits<double>::quiet_NaN();

  auto evaluate = [&](std::int64_t step) {
    if (!trainer.has_validation()) return;
    const auto t0 = Clock::now();
    last_val = trainer.evaluate();
    const double took = seconds_since(t0);
    char buf[256];
    std::snprintf(buf, sizeof buf, "eval step %lld | val loss %.4f | %d micro-batches | %.1fs",
                  static_cast<long long>(step), last_val, settings.eval_batches, took);
    rep.line(buf);
    rep.record("{\"type\":\"eval\",\"step\":" + std::to_string(step) + ",\"val_loss\":" +
               json_number(last_val) + ",\"elapsed_s\":" + json_number(seconds_since(start)) + "}");
  };

  if (start_step >= steps)
    rep.line("the checkpoint is at step " + std::to_string(start_step) + ", run.steps is " +
             std::to_string(steps) + ": nothing to train (raise run.steps to continue)");
  for (std::int64_t step = start_step + 1; step <= steps; ++step) {
    const auto t0 = Clock::now();
    const zero::gpt::GptTrainer::Step s = trainer.train_step();
    const double dt = seconds_since(t0);
    train_seconds += dt;
    interval_seconds += dt;
    ++interval_steps;

    const double wall = seconds_since(start);
    const double done = static_cast<double>(step - start_step);  // steps in this session
    const double eta = wall / done * static_cast<double>(steps - step);
    if (step % print_every == 0 || step == steps || step == start_step + 1) {
      const double sps = samples_per_step * static_cast<double>(interval_steps) / interval_seconds;
      const double sps_avg = samples_per_step * done / train_seconds;
      const double tps = sps * mc.seq_len;
      const double tflops = params * flops_factor * tps / world / 1e12;
      const double budget_days = settings.token_budget / tps / 86400.0;  // at the current rate
      const double state = static_cast<double>(engine.memory().model_state());
      const double rss = ctx.comm().all_reduce_scalar(peak_rss_bytes(), zero::ReduceOp::max);
      char buf[512];
      std::snprintf(buf, sizeof buf,
                    "step %*lld/%lld | loss %.4f | lr %.2e | grad norm %.3f | scale %g%s | "
                    "%.1f samples/s (avg %.1f) | %s tok/s | %.4f TFLOPs/dev (F=%g) | state %s/rank | "
                    "peak RSS %s | ETA %s | %s tokens in %.1f days",
                    static_cast<int>(std::to_string(steps).size()), static_cast<long long>(step),
                    static_cast<long long>(steps), s.loss, s.result.lr, s.result.grad_norm,
                    s.result.loss_scale, s.result.skipped ? " (skipped: overflow)" : "", sps,
                    sps_avg, si(tps).c_str(), tflops, flops_factor, mib(state).c_str(),
                    mib(rss).c_str(), duration(eta).c_str(), si(settings.token_budget).c_str(),
                    budget_days);
      rep.line(buf);
      rep.record(
          "{\"type\":\"train\",\"step\":" + std::to_string(step) + ",\"loss\":" +
          json_number(s.loss) + ",\"lr\":" + json_number(s.result.lr) + ",\"grad_norm\":" +
          json_number(s.result.grad_norm) + ",\"loss_scale\":" + json_number(s.result.loss_scale) +
          ",\"skipped\":" + (s.result.skipped ? "true" : "false") + ",\"samples_per_s\":" +
          json_number(sps) + ",\"samples_per_s_avg\":" + json_number(sps_avg) +
          ",\"tokens_per_s\":" + json_number(tps) + ",\"tflops_per_device\":" +
          json_number(tflops) + ",\"flops_factor\":" + json_number(flops_factor) +
          ",\"model_state_bytes\":" + json_number(state) + ",\"peak_rss_bytes\":" +
          json_number(rss) + ",\"eta_s\":" + json_number(eta) + ",\"token_budget_days\":" +
          json_number(budget_days) + ",\"elapsed_s\":" + json_number(wall) + "}");
      interval_seconds = 0.0;
      interval_steps = 0;
    } else {
      rep.progress("step " + std::to_string(step) + "/" + std::to_string(steps) + " | loss " +
                   std::to_string(s.loss).substr(0, 6) + " | ETA " + duration(eta));
    }
    if ((settings.eval_interval > 0 && step % settings.eval_interval == 0) || step == steps)
      evaluate(step);
    if (settings.save_interval > 0 && (step % settings.save_interval == 0 || step == steps)) {
      const auto t1 = Clock::now();
      trainer.save_checkpoint(checkpoint_dir);
      rep.line("checkpoint: step " + std::to_string(step) + " saved to " + checkpoint_dir + " (" +
               duration(seconds_since(t1)) + ")");
    }
  }

  const std::int64_t ran = steps - start_step;
  char buf[256];
  std::snprintf(buf, sizeof buf, "done: %lld steps in %s (%.1f samples/s), final val loss %.4f",
                static_cast<long long>(ran), duration(seconds_since(start)).c_str(),
                ran > 0 ? samples_per_step * static_cast<double>(ran) / train_seconds : 0.0, last_val);
  rep.line(buf);
  print_sample(settings.out_dir);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  zero::Context ctx(&argc, &argv);
  return ctx.run([&] { return run(ctx, argc, argv); });
}
