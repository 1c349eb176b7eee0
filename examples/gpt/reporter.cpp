#include "gpt/reporter.hpp"

#include <fmt/format.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "zero/error.hpp"
#include "zero/plan/plan.hpp"

namespace zero::gpt {

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const long t = std::lround(s);
  if (t >= 86400) return fmt::format("{}d{:02}h", t / 86400, (t % 86400) / 3600);
  if (t >= 3600) return fmt::format("{}h{:02}m", t / 3600, (t % 3600) / 60);
  if (t >= 60) return fmt::format("{}m{:02}s", t / 60, t % 60);
  return fmt::format("{}s", t);
}

std::string format_mib(double bytes) { return fmt::format("{:.1f} MiB", bytes / (1024.0 * 1024.0)); }

std::string format_si(double v) {
  if (v >= 1e9) return fmt::format("{:.2f}G", v / 1e9);
  if (v >= 1e6) return fmt::format("{:.2f}M", v / 1e6);
  if (v >= 1e3) return fmt::format("{:.2f}k", v / 1e3);
  return fmt::format("{:.1f}", v);
}

std::string format_grid(int tensor, int data, int pipeline) {
  return fmt::format("TP {} x DP {} x PP {}", tensor, data, pipeline);
}

std::string format_significant(double v, int digits) {
  if (!std::isfinite(v)) return "?";
  // A fixed "%.1f" shows a 1.5B-parameter model's 0.04 samples/s as 0.0; keep `digits`
  // significant digits instead, and at least one decimal so the width stays familiar.
  const int magnitude = v == 0.0 ? 0 : static_cast<int>(std::floor(std::log10(std::abs(v))));
  const int decimals = std::clamp(digits - 1 - magnitude, 1, 12);
  return fmt::format("{:.{}f}", v, decimals);
}

MfuPeak gpu_mfu_peak(double stated_tflops, const std::string& device_name, double memory_bytes) {
  if (stated_tflops > 0) return {stated_tflops, "run.peak_tflops"};
  if (auto g = zero::plan::gpu_preset_for_device(device_name, memory_bytes))
    return {g->peak_flops / 1e12, "dense bf16 peak of " + g->name + " (" + device_name + ")"};
  // An H100 PCIe or NVL, an L40S, an RTX card: training does not need the figure, only MFU.
  return {0.0, "no peak is known for the GPU '" + device_name +
                   "' (no planner preset describes it), so MFU is shown as n/a; set run.peak_tflops to its dense "
                   "bf16 tensor peak (TFLOP/s) to see it"};
}

std::string format_mfu(double mfu) {
  if (!std::isfinite(mfu)) return "n/a (set run.peak_tflops)";
  return fmt::format("{:.1f}%", 100.0 * mfu);
}

namespace {

// JSON has no NaN or infinity; a missing measurement is null.
nlohmann::ordered_json number(double v) {
  return std::isfinite(v) ? nlohmann::ordered_json(v) : nlohmann::ordered_json();
}

}  // namespace

Reporter::Reporter(bool root, const std::string& jsonl_path, bool append, bool progress, bool strict)
    : root_(root), tty_(progress), strict_(strict), jsonl_path_(jsonl_path) {
  if (!root_ || jsonl_path.empty()) return;
  jsonl_ = ::open(jsonl_path.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC | (append ? 0 : O_TRUNC), 0644);
  if (jsonl_ < 0) {
    failed(jsonl_path, "open", errno);
    return;
  }
  // A record cut short by a full disk (or a kill) would swallow the first new one: end it.
  struct stat st {};
  char last = '\n';
  if (append && ::fstat(jsonl_, &st) == 0 && st.st_size > 0 && ::pread(jsonl_, &last, 1, st.st_size - 1) == 1 &&
      last != '\n') {
    if (::write(jsonl_, "\n", 1) != 1) {
      failed(jsonl_path, "end the cut-short last line of", errno);
      return;
    }
    line("note: the last line of " + jsonl_path +
         " was a record cut short (a full disk or a killed run); it was ended "
         "before appending, and zero-plot skips it (1 line)");
  }
}

Reporter::~Reporter() {
  if (jsonl_ >= 0) ::close(jsonl_);
}

void Reporter::failed(const std::string& path, const std::string& what, int err) {
  const std::string msg = "cannot " + what + " '" + path + "': " + std::strerror(err);
  if (strict_)
    ZERO_THROW("zero-gpt: " + msg +
               "; run.strict_outputs is true, so the run stops. Free space in run.out_dir or "
               "choose another, or set run.strict_outputs: false to train on without it");
  std::fputs(fmt::format("zero-gpt: warning: {}; training continues without it (checkpoints are written "
                         "separately; set run.strict_outputs: true to stop instead)\n",
                         msg)
                 .c_str(),
             stderr);
  std::fflush(stderr);
}

namespace {

// write() until done; the errno of a failure, or 0.
int write_all(int fd, const char* p, std::size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return errno;
    if (w == 0) return ENOSPC;
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return 0;
}

}  // namespace

bool Reporter::write_file(const std::string& path, const std::string& text) {
  if (!root_) return true;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  int err = fd < 0 ? errno : write_all(fd, text.data(), text.size());
  if (fd >= 0 && ::close(fd) != 0 && err == 0) err = errno;  // NFS reports a full disk here
  if (err == 0) return true;
  failed(path, "write", err);
  return false;
}

void Reporter::line(const std::string& text) {
  if (!root_) return;
  clear_progress();
  std::fputs((text + '\n').c_str(), stdout);
  // The log is stdout, often a file on the same full disk: warn once (on stderr, which is often
  // elsewhere), then go on.
  if (std::fflush(stdout) != 0 && !log_failed_) {
    const int err = errno;
    log_failed_ = true;
    std::clearerr(stdout);
    failed("standard output (the log)", "write to", err);
  }
}

void Reporter::record(const nlohmann::ordered_json& object) {
  if (!root_ || jsonl_ < 0) return;
  // One object per line, one write: a run killed mid-way leaves every finished record readable.
  const std::string text = object.dump() + '\n';
  if (const int err = write_all(jsonl_, text.data(), text.size())) {
    ::close(jsonl_);
    jsonl_ = -1;
    failed(jsonl_path_, "append to", err);
  }
}

std::string Reporter::train_line(const TrainRecord& r) {
  const std::string steps = fmt::format("{}", r.steps);
  std::string text = fmt::format(
      "step {:>{}}/{} | loss {:.4f} | lr {:.2e} | grad norm {:.3f} | scale {:g}{} | {} samples/s (avg {}) | {} tok/s | "
      "{:.4f} TFLOPs/dev (F={:.2f}) | MFU {} | state {}/rank | peak RSS {} | inter-node {}/step | ETA {} | {} tokens "
      "in {:.1f} days",
      r.step, steps.size(), steps, r.loss, r.lr, r.grad_norm, r.loss_scale, r.skipped ? " (skipped: overflow)" : "",
      format_significant(r.samples_per_s), format_significant(r.samples_per_s_avg), format_si(r.tokens_per_s),
      r.tflops_per_device, r.flops_factor, format_mfu(r.mfu), format_mib(r.model_state_bytes),
      format_mib(r.peak_rss_bytes), format_mib(r.inter_node_bytes_max), format_duration(r.eta_s),
      format_si(r.token_budget), r.token_budget_days);
  if (r.pipeline_parallel > 1 || r.tensor_parallel > 1)
    text +=
        fmt::format(" | grid {}, bubble {:.1f}%", format_grid(r.tensor_parallel, r.data_parallel, r.pipeline_parallel),
                    100.0 * r.pipeline_bubble);
  return text;
}

void Reporter::train(const TrainRecord& r) {
  line(train_line(r));
  record({{"type", "train"},
          {"step", r.step},
          {"tokens", number(r.tokens)},
          {"loss", number(r.loss)},
          {"lr", number(r.lr)},
          {"grad_norm", number(r.grad_norm)},
          {"loss_scale", number(r.loss_scale)},
          {"skipped", r.skipped},
          {"samples_per_s", number(r.samples_per_s)},
          {"samples_per_s_avg", number(r.samples_per_s_avg)},
          {"tokens_per_s", number(r.tokens_per_s)},
          {"tflops_per_device", number(r.tflops_per_device)},
          {"flops_factor", number(r.flops_factor)},
          {"mfu", number(r.mfu)},
          {"model_state_bytes", number(r.model_state_bytes)},
          {"peak_rss_bytes", number(r.peak_rss_bytes)},
          {"eta_s", number(r.eta_s)},
          {"token_budget_days", number(r.token_budget_days)},
          {"elapsed_s", number(r.elapsed_s)},
          {"intra_node_bytes", number(r.intra_node_bytes)},
          {"inter_node_bytes", number(r.inter_node_bytes)},
          {"inter_node_bytes_max", number(r.inter_node_bytes_max)},
          {"grid", format_grid(r.tensor_parallel, r.data_parallel, r.pipeline_parallel)},
          {"pipeline_bubble", number(r.pipeline_bubble)}});
}

void Reporter::eval(const EvalRecord& r) {
  line(fmt::format("eval step {} | val loss {:.4f} | {} sequences, {} tokens | {:.1f}s", r.step, r.val_loss,
                   r.val_sequences, r.val_tokens, r.seconds));
  record({{"type", "eval"},
          {"step", r.step},
          {"tokens", number(r.tokens)},
          {"val_loss", number(r.val_loss)},
          {"val_sequences", r.val_sequences},
          {"val_tokens", r.val_tokens},
          {"elapsed_s", number(r.elapsed_s)}});
}

void Reporter::progress(std::int64_t step, std::int64_t steps, double loss, double eta_s) {
  if (!root_ || !tty_) return;
  const std::string text =
      fmt::format("\r\033[Kstep {}/{} | loss {:.4f} | ETA {}", step, steps, loss, format_duration(eta_s));
  std::fputs(text.c_str(), stdout);
  std::fflush(stdout);
  shown_ = true;
}

void Reporter::clear_progress() {
  if (shown_) std::fputs("\r\033[K", stdout);
  shown_ = false;
}

}  // namespace zero::gpt
