// The GPT trainer's pipeline parallelism (model.pipeline_parallel), against the 1-rank run:
//   - at 1 rank (the fixture test_gpt_pipeline_np1) the plain trainer writes its curves (losses
//     and gradient norms over 20 steps, the validation loss, a sample) at ZeRO stages 0 and 1 and
//     at stage 1 with bf16 and activation checkpointing to gpt_pipeline_reference.txt in the
//     test directory;
//   - at 2 ranks PP 2, at 4 ranks PP 2 x DP 2, PP 4 and TP 2 x PP 2 (model.tensor_parallel with
//     the pipeline: each part cut over a tensor group) train on the same global batch and must
//     match it within 1e-4 relative per step (1e-3 in bf16); evaluation and sampling through the
//     pipeline give the same validation loss and tokens;
//   - each pipeline part held exactly the 1F1B bound of micro-batches, min(P - part, m), and its
//     activation memory is that many micro-batches' activations plus the shared scratch;
//   - a pipelined run's checkpoint (each part's shard set, grid checkpoints) resumes bit for bit;
//   - ZeRO stages 2-3 with PP (with TP too), more pipeline parts than blocks, a world the grid does not
//     divide and a tensor size n_head does not divide are clear errors.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "gpt/gpt_model.hpp"
#include "gpt/ops.hpp"
#include "gpt/pipeline.hpp"
#include "scratch_dir.hpp"
#include "gpt/trainer.hpp"
#include "zero/config.hpp"
#include "zero/context.hpp"
#include "zero/error.hpp"

using namespace zero::gpt;

namespace {

zero::Context& ctx() { return *zero::Context::current(); }

constexpr int kSteps = 20, kGlobalBatch = 8, kSampleTokens = 16;
constexpr const char* kReferenceFile = "gpt_pipeline_reference.txt";

// The variants compared: ZeRO stage 0, stage 1, and stage 1 with bf16 parameters (widened for
// the host model) and activation checkpointing (the part's blocks recomputed per micro-batch).
struct Variant {
  int stage;
  bool bf16_checkpointing;
};
const std::vector<Variant> kVariants = {{0, false}, {1, false}, {1, true}};

std::string yaml(int stage, int pipeline, int micro, bool bf16_checkpointing = false, int tensor = 1,
                 const std::string& arch = "") {
  const int data = std::max(1, ctx().world_size() / (tensor * pipeline));
  const int gas = kGlobalBatch / (micro * data);
  std::string y;
  y += "train_micro_batch_size_per_gpu: " + std::to_string(micro) + "\n";
  y += "gradient_accumulation_steps: " + std::to_string(gas) + "\n";
  y += "gradient_clipping: 1.0\n";
  y += "zero_optimization:\n  stage: " + std::to_string(stage) + "\n  reduce_bucket_size: 20000\n";
  y += "optimizer:\n  type: AdamW\n  params:\n    lr: 3.0e-3\n    betas: [0.9, 0.95]\n    weight_decay: 0.1\n";
  y += "model:\n  n_layer: 4\n  n_head: 2\n  n_embd: 32\n  seq_len: 16\n  vocab_size: 256\n  seed: 7\n";
  y += "  pipeline_parallel: " + std::to_string(pipeline) + "\n";
  y += "  tensor_parallel: " + std::to_string(tensor) + "\n";
  y += arch;
  if (bf16_checkpointing) y += "  activation_checkpointing: true\nbf16:\n  enabled: true\n";
  y += "data:\n  train: shakespeare\n  seed: 11\n";
  y += "run:\n  eval_sequences: 24\n";
  return y;
}

zero::Config make_config(int stage, int pipeline, int micro, bool bf16_checkpointing = false, int tensor = 1,
                         const std::string& arch = "") {
  zero::LoadOptions o;
  o.extra_sections = gpt_sections();
  zero::Config cfg =
      zero::parse_config(yaml(stage, pipeline, micro, bf16_checkpointing, tensor, arch), "test_gpt_pipeline", o);
  cfg.resolve(gpt_data_parallel_size(read_gpt_settings(cfg), ctx().world_size()));
  return cfg;
}

struct Curve {
  std::vector<double> loss, norm;
  double val = 0;
  std::vector<int> sample;  // rank 0's
};

Curve train(GptTrainer& t) {
  Curve c;
  for (int s = 0; s < kSteps; ++s) {
    const GptTrainer::Step st = t.train_step();
    c.loss.push_back(st.loss);
    c.norm.push_back(st.result.grad_norm);
  }
  c.val = t.evaluate().loss;
  c.sample = t.sample({}, kSampleTokens, /*temperature=*/1.0f, 0, 5);
  return c;
}

void write_reference(const std::vector<Curve>& curves) {
  std::FILE* f = std::fopen(kReferenceFile, "w");
  REQUIRE(f != nullptr);
  for (const Curve& c : curves) {
    for (int s = 0; s < kSteps; ++s) std::fprintf(f, "%.17g %.17g\n", c.loss[s], c.norm[s]);
    std::fprintf(f, "%.17g\n", c.val);
    for (int tok : c.sample) std::fprintf(f, "%d ", tok);
    std::fprintf(f, "\n");
  }
  std::fclose(f);
}

std::vector<Curve> read_reference() {
  std::ifstream in(kReferenceFile);
  INFO("the 1-rank reference " << kReferenceFile << " is written by test_gpt_pipeline_np1 (a ctest fixture)");
  REQUIRE(in.good());
  std::vector<Curve> curves(kVariants.size());
  for (Curve& c : curves) {
    c.loss.resize(kSteps);
    c.norm.resize(kSteps);
    for (int s = 0; s < kSteps; ++s) in >> c.loss[s] >> c.norm[s];
    in >> c.val;
    c.sample.resize(kSampleTokens);
    for (int& tok : c.sample) in >> tok;
  }
  REQUIRE(in.good());
  return curves;
}

bool close(double a, double b, double rel = 1e-4) { return std::abs(a - b) <= rel * std::abs(b); }

// What GptModel holds for a pipeline part of `blocks` blocks with `slots` micro-batches of B x T on the
// host (fp32) at tensor parallelism TP, from the model's description: per micro-batch the token
// ids and targets, each block's internals (ln1, res2, ln2 of width C; qkv 3, atty 1, fch 4,
// fch_gelu 4 widths of C / TP; 4 LayerNorm statistics per row and the attention's statistics
// over NH / TP heads; with activation checkpointing one block's worth in all, recomputed before
// each backward) and the residual stream at blocks + 1 boundaries; once, the head's buffers
// (ln_f, its statistics, the logits of Vp / TP ids, losses, and under TP the cross-entropy's
// row maxima and sums) on the last part and the backward's scratch (dres, dtmp of width C;
// dqkv 3, dfch 4 widths of C / TP; the attention's scratch).
std::size_t expected_activation_bytes(const Ops& ops, int B, int T, int C, int NH, int Vp, int blocks, int slots,
                                      bool head, bool checkpointing, int TP = 1) {
  const std::size_t N = static_cast<std::size_t>(B) * T, f = 4, CT = static_cast<std::size_t>(C / TP);
  const std::size_t block =
      N * (3 * static_cast<std::size_t>(C) + 12 * CT) * f + (4 * N + ops.attention_stats_floats(B, T, NH / TP)) * f;
  const std::size_t per_micro = 2 * N * 4 + (checkpointing ? 0 : static_cast<std::size_t>(blocks) * block) +
                                static_cast<std::size_t>(blocks + 1) * N * C * f;
  const std::size_t ce_stats = TP > 1 ? 3 * N * f : 0;
  const std::size_t head_bytes =
      head ? N * C * f + 2 * N * f + N * static_cast<std::size_t>(Vp / TP) * f + N * f + ce_stats : 0;
  const std::size_t scratch =
      N * f * (2 * static_cast<std::size_t>(C) + 7 * CT) + ops.attention_scratch_floats(B, T, NH / TP) * f;
  return static_cast<std::size_t>(slots) * per_micro + (checkpointing ? block : 0) + head_bytes + scratch;
}

}  // namespace

TEST_CASE(
    "pipeline parts train as the 1-rank run: losses, norms, validation and sampling at ZeRO stages 0-1, "
    "bf16 and activation checkpointing") {
  const int world = ctx().world_size();
  if (world == 1) {
    std::vector<Curve> curves;
    for (const Variant& v : kVariants) {
      const zero::Config cfg = make_config(v.stage, 1, 2, v.bf16_checkpointing);
      GptTrainer t(ctx(), cfg, read_gpt_settings(cfg));
      curves.push_back(train(t));
    }
    write_reference(curves);
    return;
  }
  const std::vector<Curve> ref = read_reference();
  // (TP, PP, micro-batch): m = 8 / (micro x data) micro-batches, at least P.
  struct Grid {
    int T, P, micro;
  };
  std::vector<Grid> grids = {{1, 2, world == 2 ? 2 : 1}};
  if (world == 4) {
    grids.push_back({1, 4, 2});
    grids.push_back({2, 2, 2});  // TP 2 x DP 1 x PP 2: 4 micro-batches of 2
  }
  for (std::size_t variant = 0; variant < kVariants.size(); ++variant)
    for (auto [T, P, micro] : grids) {
      const Variant& v = kVariants[variant];
      INFO("ZeRO stage " << v.stage << (v.bf16_checkpointing ? " bf16 + activation checkpointing" : "") << ", TP " << T
                         << " x DP " << world / (T * P) << " x PP " << P << ", micro-batch " << micro);
      const zero::Config cfg = make_config(v.stage, P, micro, v.bf16_checkpointing, T);
      GptTrainer t(ctx(), cfg, read_gpt_settings(cfg));
      REQUIRE(t.grid() ==
              "TP " + std::to_string(T) + " x DP " + std::to_string(world / (T * P)) + " x PP " + std::to_string(P));
      const Curve c = train(t);
      const Curve& r = ref[variant];
      // bf16: the 1-rank run rounds wte's gradient to bf16 at every micro-batch (its head's and
      // its embedding's parts together), the pipeline sums the two end parts' shares over the step
      // and rounds once: a difference of bf16 roundings (2^-8 relative) in one tensor's gradient.
      const double rel = v.bf16_checkpointing ? 1e-3 : 1e-4;
      for (int s = 0; s < kSteps; ++s) {
        INFO("step " << s + 1 << ": loss " << c.loss[s] << " vs " << r.loss[s] << ", norm " << c.norm[s] << " vs "
                     << r.norm[s]);
        REQUIRE(close(c.loss[s], r.loss[s], rel));
        REQUIRE(close(c.norm[s], r.norm[s], rel));
      }
      REQUIRE(r.loss.back() < r.loss.front() - 0.5);  // it learned: the comparison is not of noise
      // Tensor parallelism is really on: the tensor group carried the model's all-reduces.
      const zero::TrafficBytes tt = t.tensor_traffic();
      REQUIRE((tt.intra_node + tt.inter_node > 0) == (T > 1));
      REQUIRE(close(c.val, r.val, rel));
      // The same tokens from the same weights; bf16's slightly different weights may pick others.
      if (!ctx().is_root())
        REQUIRE(c.sample.empty());
      else if (v.bf16_checkpointing)
        REQUIRE(c.sample.size() == r.sample.size());
      else
        REQUIRE(c.sample == r.sample);

      // The 1F1B bound was reached and not exceeded, and the model holds exactly that much.
      const PipelineReport pr = t.pipeline_report();
      const int m = static_cast<int>(cfg.gradient_accumulation_steps);
      REQUIRE(pr.parts == P);
      REQUIRE(pr.tensor == T);
      REQUIRE(pr.describe().starts_with(t.grid() + ": part " + std::to_string(pr.part) + " of " + std::to_string(P) +
                                        " (blocks "));
      REQUIRE(pr.micro_batches == m);
      REQUIRE(pr.peak_in_flight == std::min(P - pr.part, m));
      REQUIRE(pr.slots == pr.peak_in_flight);
      REQUIRE(pr.bubble == Approx(static_cast<double>(P - 1) / (m + P - 1)));
      const GptConfig& mc = t.model_config();
      const auto ops = make_host_ops();
      // The host model computes in fp32 whatever the engine's dtype.
      REQUIRE(pr.activation_bytes == expected_activation_bytes(*ops, micro, mc.seq_len, mc.n_embd, mc.n_head,
                                                               mc.padded_vocab_size(), pr.end_layer - pr.first_layer,
                                                               pr.peak_in_flight, pr.part == P - 1,
                                                               v.bf16_checkpointing, T));
    }
}

TEST_CASE("bloom and llama pipelines train as data parallelism on the same ranks") {
  // bloom: the tied wte copy on the last part, ALiBi; llama: an untied head on the last part
  // only (no wte copy, nothing exchanged), grouped-query attention, SwiGLU.
  const int world = ctx().world_size();
  if (world == 1) return;
  for (const char* arch :
       {"  arch: bloom\n", "  arch: llama\n  n_kv_head: 1\n  ffn_hidden: 48\n  tie_word_embeddings: false\n"})
    for (int stage : {0, 1}) {
      const bool llama = arch[8] == 'l';
      INFO((llama ? "llama" : "bloom") << ", ZeRO stage " << stage << ", PP 2 x DP " << world / 2 << " vs DP "
                                       << world);
      const zero::Config dp_cfg = make_config(stage, 1, 1, false, 1, arch);
      GptTrainer dp(ctx(), dp_cfg, read_gpt_settings(dp_cfg));
      const Curve want = train(dp);
      const zero::Config pp_cfg = make_config(stage, 2, 1, false, 1, arch);
      GptTrainer pp(ctx(), pp_cfg, read_gpt_settings(pp_cfg));
      REQUIRE(pp.pipeline_report().tied == !llama);
      const Curve got = train(pp);
      double worst = 0;
      for (int s = 0; s < kSteps; ++s) {
        INFO("step " << s + 1 << ": loss " << got.loss[s] << " vs " << want.loss[s] << ", norm " << got.norm[s]
                     << " vs " << want.norm[s]);
        REQUIRE(close(got.loss[s], want.loss[s]));
        REQUIRE(close(got.norm[s], want.norm[s]));
        worst = std::max(worst, std::abs(got.loss[s] - want.loss[s]) / want.loss[s]);
      }
      REQUIRE(want.loss.back() < want.loss.front() - 0.5);
      REQUIRE(close(got.val, want.val));
      if (ctx().is_root())
        std::printf("  %s stage %d, PP 2 x DP %d vs DP %d: loss %.6f -> %.6f, largest deviation %.1e\n",
                    llama ? "llama" : "bloom", stage, world / 2, world, want.loss.front(), want.loss.back(), worst);
    }
}

TEST_CASE(
    "pipeline parallelism refuses ZeRO stages 2-3, more parts than blocks, and a grid the world or the "
    "model does not divide") {
  const int world = ctx().world_size();
  if (world == 1) return;
  for (int stage : {2, 3}) {
    const zero::Config cfg = make_config(stage, 2, 1);
    REQUIRE_THROWS_WITH(GptTrainer(ctx(), cfg, read_gpt_settings(cfg)),
                        Catch::Contains("zero_optimization.stage " + std::to_string(stage)) &&
                            Catch::Contains("ZeRO stages 0 and 1 only"));
    if (world == 4) {  // the same with tensor parallelism beside the pipeline
      const zero::Config tp = make_config(stage, 2, 2, false, 2);
      REQUIRE_THROWS_WITH(GptTrainer(ctx(), tp, read_gpt_settings(tp)),
                          Catch::Contains("zero_optimization.stage " + std::to_string(stage)) &&
                              Catch::Contains("ZeRO stages 0 and 1 only"));
    }
  }
  zero::LoadOptions o;
  o.extra_sections = gpt_sections();
  std::string y = yaml(1, 2, 1);
  y.replace(y.find("n_layer: 4"), 10, "n_layer: 1");
  const zero::Config one_block = zero::parse_config(y, "test_gpt_pipeline", o);
  REQUIRE_THROWS_WITH(read_gpt_settings(one_block),
                      Catch::Contains("pipeline_parallel") && Catch::Contains("every part needs at least one block"));
  REQUIRE_THROWS_WITH(part_split(3, 4, 0), Catch::Contains("4 parts for 3 blocks"));
  // TP x PP must divide the world: PP world + 1, or TP 2 x PP world.
  GptSettings s;
  s.pipeline_parallel = world + 1;
  REQUIRE_THROWS_WITH(gpt_data_parallel_size(s, world),
                      Catch::Contains(std::to_string(world) + " ranks cannot form groups") &&
                          Catch::Contains("pipeline_parallel = " + std::to_string(world + 1)));
  s.tensor_parallel = 2;
  s.pipeline_parallel = world;
  REQUIRE_THROWS_WITH(gpt_data_parallel_size(s, world),
                      Catch::Contains("tensor_parallel = 2 x pipeline_parallel = " + std::to_string(world)) &&
                          Catch::Contains("run a multiple of " + std::to_string(2 * world) + " ranks"));
  s.pipeline_parallel = world / 2;
  REQUIRE(gpt_data_parallel_size(s, world) == 1);
  // The tensor size must divide n_head (2 here) whatever the pipeline: named in the model section.
  std::string y4 = yaml(1, 2, 1, false, 4);
  REQUIRE_THROWS_WITH(read_gpt_settings(zero::parse_config(y4, "test_gpt_pipeline", o)),
                      Catch::Contains("tensor_parallel") && Catch::Contains("n_head"));
}

TEST_CASE("a pipelined run saves every pipeline part and resumes bit for bit") {
  const int world = ctx().world_size();
  if (world == 1) return;
  const std::string dir = zero::test::process_scratch_dir("gpt_pipeline") + "/ckpt";
  const zero::Config cfg = make_config(1, 2, 1);
  std::vector<double> straight, resumed;
  {
    GptTrainer t(ctx(), cfg, read_gpt_settings(cfg));
    for (int s = 0; s < 6; ++s) {
      const GptTrainer::Step st = t.train_step();
      straight.push_back(st.loss);
      straight.push_back(st.result.grad_norm);
    }
  }
  {
    GptTrainer first(ctx(), cfg, read_gpt_settings(cfg));
    for (int s = 0; s < 3; ++s) {
      const GptTrainer::Step st = first.train_step();
      resumed.push_back(st.loss);
      resumed.push_back(st.result.grad_norm);
    }
    first.save_checkpoint(dir);
  }
  GptTrainer second(ctx(), cfg, read_gpt_settings(cfg));
  REQUIRE(second.load_checkpoint(dir) == 3);
  for (int s = 0; s < 3; ++s) {
    const GptTrainer::Step st = second.train_step();
    resumed.push_back(st.loss);
    resumed.push_back(st.result.grad_norm);
  }
  REQUIRE(resumed == straight);
}
