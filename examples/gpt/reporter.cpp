#include "reporter.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "zero/error.hpp"
#include "zero/plan.hpp"

namespace zero::gpt {

std::string format_duration(double s) {
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

std::string format_mib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / (1024.0 * 1024.0));
  return buf;
}

std::string format_si(double v) {
  char buf[32];
  if (v >= 1e9) std::snprintf(buf, sizeof buf, "%.2fG", v / 1e9);
  else if (v >= 1e6) std::snprintf(buf, sizeof buf, "%.2fM", v / 1e6);
  else if (v >= 1e3) std::snprintf(buf, sizeof buf, "%.2fk", v / 1e3);
  else std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

std::string format_significant(double v, int digits) {
  if (!std::isfinite(v)) return "?";
  // A fixed "%.1f" shows a 1.5B-parameter model's 0.04 samples/s as 0.0; keep `digits`
  // significant digits instead, and at least one decimal so the width stays familiar.
  const int magnitude = v == 0.0 ? 0 : static_cast<int>(std::floor(std::log10(std::abs(v))));
  const int decimals = std::clamp(digits - 1 - magnitude, 1, 12);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
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
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100.0 * mfu);
  return buf;
}

namespace {

// JSON has no NaN or infinity; a missing measurement is null.
nlohmann::ordered_json number(double v) { return std::isfinite(v) ? nlohmann::ordered_json(v) : nlohmann::ordered_json(); }

}  // namespace

Reporter::Reporter(bool root, const std::string& jsonl_path, bool append, bool progress)
    : root_(root), tty_(progress) {
  if (!root_ || jsonl_path.empty()) return;
  jsonl_.open(jsonl_path, append ? std::ios::app : std::ios::trunc);
  ZERO_CHECK(jsonl_, "zero-gpt: cannot write " + jsonl_path + "; check run.out_dir");
}

void Reporter::line(const std::string& text) {
  if (!root_) return;
  clear_progress();
  std::printf("%s\n", text.c_str());
  std::fflush(stdout);
}

void Reporter::record(const nlohmann::ordered_json& object) {
  if (!root_ || !jsonl_.is_open()) return;
  // One object per line, flushed: a run killed mid-way leaves every finished record readable.
  jsonl_ << object.dump() << '\n';
  jsonl_.flush();
}

std::string Reporter::train_line(const TrainRecord& r) {
  char buf[640];
  std::snprintf(buf, sizeof buf,
                "step %*lld/%lld | loss %.4f | lr %.2e | grad norm %.3f | scale %g%s | "
                "%s samples/s (avg %s) | %s tok/s | %.4f TFLOPs/dev (F=%.2f) | MFU %s | "
                "state %s/rank | peak RSS %s | inter-node %s/step | ETA %s | %s tokens in %.1f days",
                static_cast<int>(std::to_string(r.steps).size()), static_cast<long long>(r.step),
                static_cast<long long>(r.steps), r.loss, r.lr, r.grad_norm, r.loss_scale,
                r.skipped ? " (skipped: overflow)" : "", format_significant(r.samples_per_s).c_str(),
                format_significant(r.samples_per_s_avg).c_str(), format_si(r.tokens_per_s).c_str(),
                r.tflops_per_device, r.flops_factor, format_mfu(r.mfu).c_str(),
                format_mib(r.model_state_bytes).c_str(), format_mib(r.peak_rss_bytes).c_str(),
                format_mib(r.inter_node_bytes).c_str(), format_duration(r.eta_s).c_str(), format_si(r.token_budget).c_str(),
                r.token_budget_days);
  return buf;
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
          {"inter_node_bytes", number(r.inter_node_bytes)}});
}

void Reporter::eval(const EvalRecord& r) {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "eval step %lld | val loss %.4f | %lld sequences, %lld tokens | %.1fs",
                static_cast<long long>(r.step), r.val_loss, static_cast<long long>(r.val_sequences),
                static_cast<long long>(r.val_tokens), r.seconds);
  line(buf);
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
  std::printf("\r\033[Kstep %lld/%lld | loss %.4f | ETA %s", static_cast<long long>(step),
              static_cast<long long>(steps), loss, format_duration(eta_s).c_str());
  std::fflush(stdout);
  shown_ = true;
}

void Reporter::clear_progress() {
  if (shown_) std::printf("\r\033[K");
  shown_ = false;
}

}  // namespace zero::gpt
