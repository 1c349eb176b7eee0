#include "gpt/training_loop.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include <nlohmann/json.hpp>

#include "gpt/machine.hpp"
#include "zero/comm.hpp"
#include "zero/engine.hpp"
#include "zero/preemption.hpp"

namespace zero::gpt {

namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

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
      rep_.line(
          fmt::format("the checkpoint is at step {}, run.steps is {}: nothing to train (raise run.steps to "
                      "continue)",
                      f_.start_step, steps));
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
      rep_.line(fmt::format("done: no steps trained (the checkpoint is at step {}, run.steps is {})", f_.start_step,
                            s_.steps));
      return;
    }
    const std::int64_t ran = s_.steps - f_.start_step;
    std::string val = "none (no validation data: data.val is 'none', or shards without data.val)";
    if (trainer_.has_validation()) val = std::isfinite(last_val_) ? format_significant(last_val_, 5) : "not evaluated";
    rep_.line(fmt::format(
        "done: {} steps in {} ({} samples/s), final val loss {}", ran, format_duration(seconds_since(start_)),
        format_significant(ran > 0 ? f_.samples_per_step * static_cast<double>(ran) / train_seconds_ : 0.0), val));
  }

 private:
  void log_step(std::int64_t step, const GptTrainer::Step& s) {
    const std::int64_t steps = s_.steps;
    const double wall = seconds_since(start_);
    const double done = static_cast<double>(step - f_.start_step);  // steps in this session
    const double eta = wall / done * static_cast<double>(steps - step);
    if (step % trainer_.engine().config().steps_per_print != 0 && step != steps && step != f_.start_step + 1) {
      rep_.progress(step, steps, s.loss, eta);
      return;
    }
    TrainRecord r;
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
    const PipelineReport pr = trainer_.pipeline_report();
    r.tensor_parallel = pr.tensor;
    r.pipeline_parallel = pr.parts;
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
    EvalRecord r;
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
    rep_.line(fmt::format("checkpoint: step {} saved to {} ({})", step, f_.checkpoint_dir,
                          format_duration(seconds_since(t0))));
  }

  void stop(std::int64_t step, bool saved) {
    const int signo = zero::StopSignal::received();
    const std::string by =
        signo != 0 ? std::string("signal ") + ::strsignal(signo) : std::string("a signal on another rank");
    if (!saved) save(step);
    rep_.line(
        fmt::format("stopped by {} after step {} of {}; checkpoint in {}; resume with (behind the same mpirun or "
                    "srun):\n  {}",
                    by, step, s_.steps, f_.checkpoint_dir, f_.resume_command));
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

}  // namespace

void report_header(Reporter& rep, const RunConfig& rc, GptTrainer& trainer, const RunFacts& f, bool resumed,
                   bool config_saved) {
  const zero::Config& cfg = rc.cfg;
  const auto& mc = trainer.model_config();
  rep.line(
      fmt::format("zero-gpt: {} rank{}, ZeRO stage {}, {} parameters (the host model computes in fp32), {} "
                  "thread{} per rank",
                  f.world, f.world == 1 ? "" : "s", cfg.zero_optimization.stage, zero::dtype_name(cfg.compute_dtype()),
                  f.threads, f.threads == 1 ? "" : "s"));
  if (!f.thread_hint.empty()) rep.line(f.thread_hint);
  const PipelineReport pr = trainer.pipeline_report();
  const std::string tensor_note =
      trainer.tensor_parallel_size() > 1
          ? fmt::format("each layer split over {} ranks (tensor parallel{}), ", trainer.tensor_parallel_size(),
                        cfg.backend == zero::BackendKind::cuda ? ", all-reduces on the device" : "")
          : std::string();
  if (pr.parts > 1)
    rep.line(
        fmt::format("nodes: {}; grid {} (rank 0's part; {}each part's engine reduces over its {} data-parallel "
                    "ranks)",
                    f.nodes, pr.describe(), tensor_note, pr.data));
  else if (trainer.tensor_parallel_size() > 1)
    rep.line("nodes: " + f.nodes + "; grid " + trainer.grid() + ": " + tensor_note +
             "the engine's collectives over the data-parallel group");
  else
    rep.line("nodes: " + f.nodes + "; grid " + trainer.grid() +
             ": the engine's collectives span all ranks (one data-parallel group)");
  rep.line("model: " + mc.describe() + " (preset " + rc.settings.preset + ")");
  rep.line("data: train " + trainer.train_data().description() + "; validation " +
           (trainer.val_data() ? trainer.val_data()->description() : std::string("none")));
  rep.line(
      fmt::format("batch: {} sequences x {} tokens = {} tokens per step (micro-batch {} x accumulation {} x {} "
                  "data-parallel ranks); activations {} per rank",
                  cfg.train_batch_size, mc.seq_len, trainer.tokens_per_step(), cfg.train_micro_batch_size_per_gpu,
                  cfg.gradient_accumulation_steps, trainer.data_parallel_size(),
                  format_mib(static_cast<double>(trainer.activation_bytes()))));
  std::string flops = "flops per token: 6N + 6LTC = " + format_si(f.flops.model);
  if (f.flops.recompute > 0) flops += " + " + format_si(f.flops.recompute) + " recomputed (activation checkpointing)";
  flops += fmt::format("; F = {:.2f} per parameter", f.flops.total() / f.params);
  if (f.peak.known()) flops += fmt::format("; MFU against {:.4g} TFLOPs per device ({})", f.peak.tflops, f.peak.source);
  rep.line(flops);
  if (!f.peak.known()) rep.line("note: " + f.peak.source);  // once; the step lines say n/a
  rep.line("memory: " + trainer.engine().memory().to_string());
  for (const auto& n : cfg.notes) rep.line("note: " + n);
  if (resumed) rep.line(fmt::format("resumed from {} at step {}", f.resumed_from, f.start_step));
  rep.line("--- resolved configuration (" + std::string(config_saved ? "saved to " : "NOT saved to ") +
           (fs::path(rc.settings.out_dir) / "config.yaml").string() + ") ---\n" + rc.resolved_yaml + "---");
  rep.record(
      {{"type", "start"},
       {"step", f.start_step},
       {"name", fs::path(rc.settings.out_dir).filename().string()},
       {"model", mc.describe()},
       {"params", f.params},
       {"world", f.world},
       {"grid", trainer.grid()},
       {"tensor_parallel", trainer.tensor_parallel_size()},
       {"pipeline_parallel", pr.parts},
       {"data_parallel", trainer.data_parallel_size()},
       {"pipeline_bubble", pr.bubble},
       {"stage", cfg.zero_optimization.stage},
       {"tokens_per_step", f.tokens_per_step},
       {"flops_per_token", f.flops.total()},
       {"model_flops_per_token", f.flops.model},
       {"peak_tflops_per_device", f.peak.known() ? nlohmann::ordered_json(f.peak.tflops) : nlohmann::ordered_json()}});
}

bool train_session(zero::Context& ctx, GptTrainer& trainer, Reporter& rep, const RunFacts& facts) {
  TrainingLoop loop(ctx, trainer, rep, facts);
  if (!loop.run()) return false;
  loop.report_done();
  return true;
}

}  // namespace zero::gpt
