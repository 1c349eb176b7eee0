// What a zero-gpt run tells its user: the log lines on rank 0's stdout, the live progress line
// on a terminal, and <out_dir>/metrics.jsonl, one JSON object per line.
//
// The log and the JSONL carry the same records, built once: a TrainRecord or EvalRecord is
// formatted for a person by the reporter and serialised for a program (zero-plot, pandas) as
// JSON. Every record has "type" ("start", "train", "eval", "stop") and "step"; the keys of each
// type are listed in examples/gpt/README.md. Only rank 0 writes; the other ranks' reporters are
// silent, so the loop can call them unconditionally.
//
// Every write to the run directory (metrics.jsonl, config.yaml, sample.txt) and to the log on
// stdout is checked. The checkpoints are what a run must not lose, and they are written and
// checked elsewhere; so a failed write (a full or read-only disk) gives one warning naming the
// file and the OS error, the file is not written again, and training goes on. With
// run.strict_outputs the failure is an error that ends the run instead.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace zero::gpt {

// Numbers for people: "1h02m", "12.3 MiB", "1.23M", and a value with `digits` significant
// digits but no exponent ("0.00123", "12.3", "1234.5").
std::string format_duration(double seconds);
std::string format_mib(double bytes);
std::string format_si(double v);
std::string format_significant(double v, int digits = 3);
// A tensor x data x pipeline grid, as the log and metrics name it: "TP 2 x DP 1 x PP 2".
std::string format_grid(int tensor, int data, int pipeline);

// What MFU divides by: the peak per device in TFLOP/s and where it came from. tflops 0 means
// unknown (a GPU that no planner preset describes, with no run.peak_tflops): the run trains all
// the same, the start says why MFU is missing, and each step shows it as n/a.
struct MfuPeak {
  double tflops = 0;
  std::string source;
  bool known() const { return tflops > 0; }
};
// For a CUDA device called `device_name` with `memory_bytes`: run.peak_tflops where stated
// (> 0), else the dense bf16 peak of the planner's preset for the device, else unknown.
MfuPeak gpu_mfu_peak(double stated_tflops, const std::string& device_name, double memory_bytes);
// MFU as the step line shows it: "12.3%", or "n/a (set run.peak_tflops)" when the peak is
// unknown (mfu is NaN: in metrics.jsonl it is then null).
std::string format_mfu(double mfu);

struct TrainRecord {
  std::int64_t step = 0, steps = 0;
  double tokens = 0;  // trained since step 0 (resumed runs included)
  double loss = 0, lr = 0, grad_norm = 0, loss_scale = 0;
  bool skipped = false;          // an fp16 overflow skipped the update
  double samples_per_s = 0;      // since the last printed step
  double samples_per_s_avg = 0;  // over this session's optimizer steps
  double tokens_per_s = 0;
  double tflops_per_device = 0;  // what the hardware computed, recompute included
  double flops_factor = 0;       // FLOPs per token / parameters (6 + attention + recompute)
  double mfu = 0;                // model FLOPs (6N + 6LTC per token) / peak, per device; NaN: no peak
  double model_state_bytes = 0;  // per rank
  double peak_rss_bytes = 0;     // the largest over the ranks
  double eta_s = 0, token_budget = 0, token_budget_days = 0, elapsed_s = 0;
  // Bytes this rank sent in the last step's collectives, inside its node and to other nodes
  // (the ring model of zero/comm.hpp).
  double intra_node_bytes = 0, inter_node_bytes = 0;
  double inter_node_bytes_max = 0;  // the busiest rank's inter-node bytes in the last step
  // The grid and the pipeline schedule's idle fraction (P - 1) / (m + P - 1) (0 without one).
  int tensor_parallel = 1, pipeline_parallel = 1, data_parallel = 1;
  double pipeline_bubble = 0;
};

struct EvalRecord {
  std::int64_t step = 0;
  double tokens = 0;  // trained so far, for plots against tokens
  double val_loss = 0;
  std::int64_t val_sequences = 0, val_tokens = 0;
  double seconds = 0, elapsed_s = 0;
};

class Reporter {
 public:
  // root: this rank writes. jsonl_path "" writes no JSONL; append continues a resumed run's file.
  // progress: show the overwritten-in-place progress line (a terminal).
  // strict: a failed write throws instead of warning. On append, a last line cut short (the
  // disk filled inside a record) is ended first, and line() says so.
  Reporter(bool root, const std::string& jsonl_path, bool append, bool progress, bool strict);
  ~Reporter();
  Reporter(const Reporter&) = delete;
  Reporter& operator=(const Reporter&) = delete;

  // Writes a whole file of the run directory (rank 0); false after the warning when it fails.
  bool write_file(const std::string& path, const std::string& text);

  void line(const std::string& text);
  // Any other record ("start", "stop"): written to the JSONL as given.
  void record(const nlohmann::ordered_json& object);
  void train(const TrainRecord& r);
  // The step's log line (train() prints it).
  static std::string train_line(const TrainRecord& r);
  void eval(const EvalRecord& r);
  void progress(std::int64_t step, std::int64_t steps, double loss, double eta_s);

 private:
  void clear_progress();
  // A failed write of `path`: strict, an error; otherwise one warning on stderr.
  void failed(const std::string& path, const std::string& what, int err);
  bool root_ = false, tty_ = false, shown_ = false, strict_ = false, log_failed_ = false;
  int jsonl_ = -1;  // closed after a failed write: a later record would be glued to a cut one
  std::string jsonl_path_;
};

}  // namespace zero::gpt
