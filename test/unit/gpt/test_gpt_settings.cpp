// zero-gpt's model / data / run sections: presets and overrides, strict keys with suggestions,
// --set overrides, and the resolved sections written back for the run log.
#include <catch2/catch.hpp>

#include <limits>
#include <string>

#include "generated_block.hpp"
#include "gpt/reporter.hpp"
#include "gpt/settings.hpp"
#include "zero/config.hpp"
#include "zero/error.hpp"

using namespace zero::gpt;

namespace {

GptSettings read(const std::string& yaml, std::vector<std::string> overrides = {}) {
  zero::LoadOptions o;
  o.extra_sections = gpt_sections();
  o.overrides = std::move(overrides);
  return read_gpt_settings(zero::parse_config(yaml, "run.yaml", o));
}

}  // namespace

TEST_CASE("defaults: the tiny preset on tiny Shakespeare", "[gpt][settings]") {
  const GptSettings s = read("train_micro_batch_size_per_gpu: 4\n");
  CHECK(s.preset == "tiny");
  CHECK(s.model.n_layer == gpt_preset("tiny").n_layer);
  CHECK(s.train == "shakespeare");
  CHECK(s.val.empty());
  CHECK(s.out_dir == "runs/tiny");
  CHECK(s.token_budget == 100e9);
  CHECK(!s.model.activation_checkpointing);
}

TEST_CASE("a preset with explicit overrides", "[gpt][settings]") {
  const GptSettings s = read(
      "model:\n  preset: gpt2\n  n_layer: 2\n  seq_len: 128\n  activation_checkpointing: true\n"
      "run:\n  steps: 7\n  token_budget: 1e6\n",
      {"model.n_embd=384", "data.train=data/*.bin"});
  CHECK(s.model.n_layer == 2);
  CHECK(s.model.n_head == 12);
  CHECK(s.model.n_embd == 384);
  CHECK(s.model.seq_len == 128);
  CHECK(s.model.vocab_size == 50257);
  CHECK(s.model.activation_checkpointing);
  CHECK(s.train == "data/*.bin");
  CHECK(s.steps == 7);
  CHECK(s.token_budget == 1e6);
  CHECK(s.out_dir == "runs/gpt2");

  SECTION("the resolved sections load back to the same settings") {
    std::string yaml;
    for (const auto& [name, body] : s.sections()) {
      yaml += name + ":\n";
      std::size_t at = 0;
      while (at < body.size()) {
        const std::size_t nl = body.find('\n', at);
        yaml += "  " + body.substr(at, nl - at) + "\n";
        at = nl + 1;
      }
    }
    const GptSettings back = read(yaml);
    CHECK(back.sections() == s.sections());
  }
}

TEST_CASE("mistakes are errors that say where and what to do", "[gpt][settings]") {
  CHECK_THROWS_WITH(read("model:\n  n_layers: 3\n"), Catch::Contains("model.n_layers") && Catch::Contains("n_layer"));
  CHECK_THROWS_WITH(read("run:\n  stesp: 3\n"), Catch::Contains("run.stesp") && Catch::Contains("steps"));
  CHECK_THROWS_WITH(read("model:\n  preset: gpt3\n"), Catch::Contains("model.preset"));
  CHECK_THROWS_WITH(read("model:\n  n_embd: 100\n  n_head: 3\n"),
                    Catch::Contains("model.n_head") && Catch::Contains("divisible"));
  CHECK_THROWS_WITH(read("run:\n  keep_checkpoints: -1\n"), Catch::Contains("run.keep_checkpoints"));
  CHECK_THROWS_WITH(read("data:\n  val: other.txt\n"), Catch::Contains("data.val"));
  CHECK_THROWS_WITH(read("run:\n  steps: 0\n"), Catch::Contains("run.steps"));
  // A count of micro-batches meant other tokens at another batch size: replaced, and said so.
  CHECK_THROWS_WITH(read("run:\n  eval_batches: 8\n"),
                    Catch::Contains("run.eval_batches") && Catch::Contains("eval_sequences"));
  CHECK_THROWS_WITH(read("model:\n  n_layer: 2\n", {"model.n_layr=3"}), Catch::Contains("model.n_layr"));
  // Without the trainer's sections registered, the engine's loader rejects them.
  CHECK_THROWS_AS(zero::parse_config("model:\n  preset: tiny\n", "run.yaml"), zero::Error);
}

TEST_CASE("--help text covers every key", "[gpt][settings]") {
  const std::string help = gpt_settings_help();
  for (const char* key : {"preset",           "n_layer",      "seq_len",   "vocab_size",    "activation_checkpointing",
                          "train:",           "val:",         "steps:",    "eval_interval", "eval_sequences",
                          "sample_tokens",    "temperature",  "top_k",     "out_dir",       "save_interval",
                          "keep_checkpoints", "token_budget", "log_jsonl", "progress",      "peak_tflops"})
    CHECK_THAT(help, Catch::Contains(key));
}

TEST_CASE("one table gives the defaults, the reading and the documented table", "[gpt][settings]") {
  // A default-constructed GptSettings holds what reading a file without the sections gives.
  CHECK(GptSettings().sections() == read("train_micro_batch_size_per_gpu: 4\n").sections());
  const std::string table = gpt_settings_reference_markdown();
  // Rows written by hand here (not by the code under test), one of each kind.
  for (const char* row :
       {"| `model.preset` | `tiny` \\| `llama-tiny` \\| `bloom-tiny` \\| `gpt2` \\| `gpt2-medium` \\| `gpt2-large` \\| "
        "`gpt2-xl` \\| `bloom-560m` \\| `bloom-7b1` \\| `llama2-7b`",
        "| `model.arch` | `gpt2` \\| `bloom` \\| `llama` | the preset's |",
        "| `model.n_layer` | integer 1..4096 | the preset's |", "| `model.seed` | integer >= 0 | `42` |",
        "| `data.train` | string | `shakespeare` |", "| `run.temperature` | number >= 0 | `0.8` |",
        "| `run.token_budget` | number > 0 | `1e+11` |", "| `run.log_jsonl` | bool | `true` |",
        "| `run.out_dir` | string | `runs/<preset>` |", "- `run.eval_batches` was replaced by run.eval_sequences"})
    CHECK_THAT(table, Catch::Contains(row));
  // Every key the resolved sections write has its row.
  for (const auto& [section, body] : GptSettings().sections())
    for (std::size_t at = 0; at < body.size(); at = body.find('\n', at) + 1)
      CHECK_THAT(table, Catch::Contains("| `" + section + "." + body.substr(at, body.find(':', at) - at) + "` |"));
}

TEST_CASE("the GPT README's key table is the one generated from the key table", "[gpt][settings]") {
  zero::test::check_generated_block(ZERO_GPT_README,
                                    "<!-- gpt-settings: generated from examples/gpt/settings_keys.cpp -->\n",
                                    "<!-- end of gpt-settings -->\n", gpt_settings_reference_markdown());
}

TEST_CASE("rates keep their significant digits in the log", "[gpt][report]") {
  // A 1.5B-parameter model on a few devices trains a fraction of a sample per second; "%.1f"
  // printed that as 0.0.
  CHECK(format_significant(0.0123) == "0.0123");
  CHECK(format_significant(0.000456) == "0.000456");
  CHECK(format_significant(25.71) == "25.7");
  CHECK(format_significant(1234.56) == "1234.6");
  CHECK(format_significant(0.0) == "0.00");
  CHECK(format_duration(3725) == "1h02m");
  CHECK(format_mib(3 * 1024 * 1024) == "3.0 MiB");
}

TEST_CASE("a GPU without a planner preset trains with MFU shown as n/a", "[gpt][report]") {
  const double gib = 1024.0 * 1024.0 * 1024.0;
  // A preset's device: its dense bf16 peak.
  const MfuPeak sxm = gpu_mfu_peak(0, "NVIDIA H100 80GB HBM3", 80 * gib);
  CHECK(sxm.known());
  CHECK(sxm.tflops == Approx(989).epsilon(0.01));
  CHECK(sxm.source.find("H100-SXM") != std::string::npos);
  // No preset (the PCIe card has another peak): unknown, and the source says what to set.
  const MfuPeak pcie = gpu_mfu_peak(0, "NVIDIA H100 PCIe", 80 * gib);
  CHECK(!pcie.known());
  CHECK(pcie.source.find("'NVIDIA H100 PCIe'") != std::string::npos);
  CHECK(pcie.source.find("set run.peak_tflops") != std::string::npos);
  CHECK(!gpu_mfu_peak(0, "NVIDIA L40S", 48 * gib).known());
  // A stated peak wins over both.
  const MfuPeak stated = gpu_mfu_peak(362, "NVIDIA L40S", 48 * gib);
  CHECK(stated.tflops == 362);
  CHECK(stated.source == "run.peak_tflops");

  CHECK(format_mfu(0.4213) == "42.1%");
  CHECK(format_mfu(std::numeric_limits<double>::quiet_NaN()) == "n/a (set run.peak_tflops)");
  TrainRecord r;
  r.step = 3;
  r.steps = 10;
  r.mfu = std::numeric_limits<double>::quiet_NaN();
  CHECK(Reporter::train_line(r).find("| MFU n/a (set run.peak_tflops) |") != std::string::npos);
  r.mfu = 0.25;
  CHECK(Reporter::train_line(r).find("| MFU 25.0% |") != std::string::npos);
  // The grid and the bubble only under model parallelism, in the start line's words.
  CHECK(Reporter::train_line(r).find("grid") == std::string::npos);
  r.tensor_parallel = 2;
  r.pipeline_parallel = 2;
  r.pipeline_bubble = 0.2;
  CHECK(Reporter::train_line(r).ends_with(" | grid TP 2 x DP 1 x PP 2, bubble 20.0%"));
  CHECK(format_grid(2, 1, 2) == "TP 2 x DP 1 x PP 2");
}

TEST_CASE("backend: cuda trains in bf16 and says so otherwise", "[gpt][settings]") {
  using Catch::Matchers::Contains;
#if ZERO_GPT_CUDA
  CHECK_THROWS_WITH(read("backend: cuda\n"), Contains("trains in bf16") && Contains("bf16.enabled: true"));
  CHECK_THROWS_WITH(read("backend: cuda\nfp16:\n  enabled: true\n"),
                    Contains("fp16") && Contains("fp16.enabled: false"));
  CHECK(read("backend: cuda\nbf16:\n  enabled: true\n").preset == "tiny");
  // cuBLASLt's bf16 rows: n_embd / T and the vocabulary part must be multiples of 8, said by key.
  const std::string cuda = "backend: cuda\nbf16:\n  enabled: true\n";
  CHECK_THROWS_WITH(read(cuda + "model:\n  n_embd: 100\n  n_head: 4\n"),
                    Contains("model.n_embd") && Contains("(100 / 1) to be a multiple of 8"));
  CHECK_THROWS_WITH(read(cuda + "model:\n  n_embd: 112\n  n_head: 8\n  tensor_parallel: 4\n"),
                    Contains("model.n_embd") && Contains("112 / 4") && Contains("(32) or a smaller"));
  CHECK_THROWS_WITH(read(cuda + "model:\n  preset: gpt2\n  n_head: 64\n  tensor_parallel: 64\n"),
                    Contains("model.tensor_parallel") && Contains("768 / 64") && Contains("(512)"));
  // gpt2's 50304 ids over 32 ranks are parts of 1572: refused; 16 ranks (3144 ids) pass.
  CHECK_THROWS_WITH(read(cuda + "model:\n  preset: gpt2\n  n_head: 32\n  tensor_parallel: 32\n"),
                    Contains("50304 / 32 ids") && Contains("dividing 6288"));
  CHECK(read(cuda + "model:\n  preset: gpt2\n  n_head: 16\n  tensor_parallel: 16\n").tensor_parallel == 16);
  // Key/value heads replicated over the tensor group: the host model only, said by key.
  CHECK_THROWS_WITH(
      read(cuda + "model:\n  preset: llama3.2-1b\n  tensor_parallel: 16\n"),
      Contains("model.tensor_parallel") && Contains("multiple of n_kv_head = 8") && Contains("over 2 ranks"));
  CHECK(read("model:\n  preset: llama3.2-1b\n  tensor_parallel: 16\n").tensor_parallel == 16);
  // The host backend has no such rule.
  CHECK(read("model:\n  n_embd: 100\n  n_head: 4\n").model.n_embd == 100);
#else
  CHECK_THROWS_WITH(read("backend: cuda\nbf16:\n  enabled: true\n"), Contains("no CUDA support"));
#endif
}
