// DeepSpeed configs as users bring them (issue 14): the Hugging Face "auto" ZeRO-2 and ZeRO-3
// files, a DeepSpeedExamples-style file, DeepSpeed's older spellings, and the policy for keys
// libzero has no member for: silent, a note at start, or an error that says why.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "test_data.hpp"
#include "zero/config.hpp"
#include "zero/error.hpp"
#include "zero/optim.hpp"

using Catch::Matchers::Contains;
using zero::Config;
using zero::DType;
using zero::GradAccumDType;
using zero::LoadOptions;

namespace {

std::string data(const std::string& name) { return zero::test::data_path(name); }

Config parse(const std::string& text, const LoadOptions& opts = {}) {
  return zero::parse_config(text, "ds.json", opts);
}

const Config::AutoValue* auto_of(const Config& c, const std::string& path) {
  for (const auto& a : c.autos)
    if (a.path == path) return &a;
  return nullptr;
}

bool has_note(const Config& c, const std::string& part) {
  for (const auto& n : c.notes)
    if (n.find(part) != std::string::npos) return true;
  return false;
}

// The notes other than the one every DeepSpeed JSON file without gradient_clipping gets (its
// default there is DeepSpeed's 1.0; tested on its own below).
std::vector<std::string> notes_of(const Config& c) {
  std::vector<std::string> out;
  for (const auto& n : c.notes)
    if (!n.starts_with("gradient_clipping: not set")) out.push_back(n);
  return out;
}

}  // namespace

TEST_CASE("Hugging Face ZeRO-2 auto config: the application's values fill \"auto\"", "[config][deepspeed]") {
  LoadOptions o;
  o.auto_values = {{"optimizer.params.lr", "3e-5"},
                   {"optimizer.params.betas", "[0.9, 0.98]"},
                   {"optimizer.params.weight_decay", "0.1"},
                   {"scheduler.params.warmup_num_steps", "500"},
                   {"gradient_clipping", "1.0"},
                   {"zero_optimization.reduce_bucket_size", "589824"},
                   {"bf16.enabled", "true"},
                   {"train_micro_batch_size_per_gpu", "4"},
                   {"gradient_accumulation_steps", "2"}};
  Config c = zero::load_config(data("hf_zero2_auto.json"), o);
  CHECK(c.optimizer.lr == 3e-5);
  CHECK(c.optimizer.beta1 == 0.9);
  CHECK(c.optimizer.beta2 == 0.98);
  CHECK(c.optimizer.eps == 1e-8);  // not passed: DeepSpeed's default
  CHECK(c.optimizer.weight_decay == 0.1);
  CHECK(c.scheduler.warmup_min_lr == 0.0);
  CHECK(c.scheduler.warmup_max_lr == 3e-5);  // follows the lr
  CHECK(c.scheduler.warmup_num_steps == 500);
  CHECK(c.gradient_clipping == 1.0);
  CHECK(c.zero_optimization.reduce_bucket_size == 589824);
  CHECK(c.zero_optimization.allgather_bucket_size == 200000000);
  CHECK(c.bf16_enabled);
  CHECK_FALSE(c.fp16.enabled);
  CHECK(c.zero_optimization.offload_optimizer.device == zero::OffloadDevice::cpu);

  REQUIRE(auto_of(c, "optimizer.params.lr"));
  CHECK(auto_of(c, "optimizer.params.lr")->value == "3e-05");
  CHECK(auto_of(c, "optimizer.params.lr")->source == "the application");
  CHECK(auto_of(c, "optimizer.params.eps")->source == "DeepSpeed default");
  CHECK(auto_of(c, "scheduler.params.warmup_max_lr")->source == "optimizer.params.lr");
  CHECK(auto_of(c, "train_batch_size")->value == "derived");
  // Only "auto" notes: allgather_partitions, round_robin_gradients and wall_clock_breakdown
  // are silent.
  for (const auto& n : c.notes) CHECK(n.find("\"auto\" ->") != std::string::npos);

  c.resolve(2);
  CHECK(c.train_batch_size == 16);
  CHECK(auto_of(c, "train_batch_size")->value == "16");
  CHECK(auto_of(c, "train_batch_size")->source == "derived for world size 2");
  const std::string block = c.auto_block();
  CHECK(block.find("optimizer.params.lr = 3e-05 (the application)") != std::string::npos);
  CHECK(block.find("train_batch_size = 16 (derived for world size 2)") != std::string::npos);

  // An application value is validated like the file's.
  LoadOptions bad;
  bad.auto_values = {{"optimizer.params.lr", "fast"}};
  REQUIRE_THROWS_WITH(zero::load_config(data("hf_zero2_auto.json"), bad),
                      Contains("auto_values[optimizer.params.lr]") && Contains("expected a number"));
}

TEST_CASE("Hugging Face ZeRO-3 auto config: DeepSpeed's defaults as the fallback", "[config][deepspeed]") {
  LoadOptions o;
  o.total_num_steps = 3000;
  Config c = zero::load_config(data("hf_zero3_auto.json"), o);
  const auto& z = c.zero_optimization;
  CHECK(z.stage == 3);
  CHECK(z.offload_param.device == zero::OffloadDevice::cpu);
  CHECK(z.reduce_bucket_size == 500000000);
  CHECK(z.stage3_prefetch_bucket_size == 50000000);
  CHECK(z.stage3_param_persistence_threshold == 100000);
  CHECK(c.scheduler.type == zero::SchedulerType::warmup_decay_lr);
  CHECK(c.scheduler.total_num_steps == 3000);
  CHECK(auto_of(c, "scheduler.params.total_num_steps")->source == "the run length the application gave");
  CHECK(c.optimizer.lr == 1e-3);
  CHECK(c.scheduler.warmup_max_lr == 1e-3);
  CHECK_FALSE(c.bf16_enabled);
  CHECK(auto_of(c, "zero_optimization.stage3_prefetch_bucket_size")->value == "50000000");
  // stage3_gather_16bit_weights_on_model_save, zero_allow_untested_optimizer: silent.
  for (const auto& n : c.notes) CHECK(n.find("\"auto\" ->") != std::string::npos);
  c.resolve(8);
  CHECK(c.train_batch_size == 8);
}

TEST_CASE("a DeepSpeedExamples-style config loads unchanged", "[config][deepspeed]") {
  Config c = zero::load_config(data("examples_stage2_fp16.json"));
  CHECK(c.train_batch_size == 64);
  CHECK(c.train_micro_batch_size_per_gpu == 8);
  CHECK(c.optimizer.type == zero::OptimizerType::adam);
  CHECK(c.optimizer.beta1 == 0.8);
  CHECK(c.optimizer.weight_decay == 3e-7);
  CHECK(c.fp16.enabled);
  CHECK(c.fp16.initial_scale_power == 15);
  CHECK(c.fp16.loss_scale_window == 500);
  CHECK(c.zero_optimization.stage == 2);
  CHECK(c.zero_optimization.allgather_bucket_size == 50000000);
  // Every DeepSpeed-only key there is at its inert value; the one note says that type Adam
  // decays decoupled, as DeepSpeed's adam_w_mode default does.
  CHECK(c.optimizer.decoupled_decay());
  REQUIRE(c.notes.size() == 1);
  CHECK_THAT(c.notes[0], Contains("optimizer.type: Adam decays decoupled"));
  CHECK(c.autos.empty());
  c.resolve(4);
  CHECK(c.gradient_accumulation_steps == 2);
}

// The shape of DeepSpeedExamples' BERT pre-training configs (bing_bert): Lamb without bias
// correction and with a narrowed trust-ratio range.
TEST_CASE("a DeepSpeedExamples BERT Lamb config loads unchanged", "[config][deepspeed]") {
  Config c = zero::load_config(data("examples_bert_lamb.json"));
  CHECK(c.optimizer.type == zero::OptimizerType::lamb);
  CHECK(c.optimizer.lr == 11e-3);
  CHECK(c.optimizer.weight_decay == 0.01);
  CHECK_FALSE(c.optimizer.bias_correction);
  CHECK(c.optimizer.max_coeff == 0.3);
  CHECK(c.optimizer.min_coeff == 0.01);
  CHECK(c.optimizer.beta1 == 0.9);
  CHECK(c.optimizer.beta2 == 0.999);
  CHECK(c.optimizer.eps == 1e-8);
  CHECK(c.fp16.enabled);
  CHECK(c.gradient_clipping == 1.0);
  CHECK(c.notes.empty());
  c.resolve(4);
  CHECK(c.gradient_accumulation_steps == 16);
}

// DeepSpeed's 1-bit optimizers name their transport in their params; with an implemented type
// those keys are a note, not an error.
TEST_CASE("DeepSpeed's transport keys cuda_aware and comm_backend_name are noted", "[config][deepspeed]") {
  const Config c = parse(R"({"optimizer": {"type": "Adam", "params": {"lr": 1e-4, "weight_decay": 0,
                               "cuda_aware": true, "comm_backend_name": "nccl"}}})");
  CHECK(has_note(c, "optimizer.params.cuda_aware = true: handled differently here"));
  CHECK(has_note(c, "optimizer.params.comm_backend_name = nccl: handled differently here"));
  CHECK_FALSE(has_note(parse("optimizer: {type: Adam, params: {weight_decay: 0, cuda_aware: false}}\n"), "cuda_aware"));
  // DeepSpeed's 1-bit Adam config loads: its transport keys are noted, freeze_step read.
  const Config onebit = parse(R"({"optimizer": {"type": "OneBitAdam", "params": {"lr": 1e-4, "freeze_step": 400,
                                 "cuda_aware": false, "comm_backend_name": "nccl"}},
                                 "zero_optimization": {"stage": 1}})");
  CHECK(onebit.optimizer.type == zero::OptimizerType::onebit_adam);
  CHECK(onebit.optimizer.freeze_step == 400);
  CHECK(has_note(onebit, "optimizer.params.comm_backend_name = nccl: handled differently here"));
  // DeepSpeed's 1-bit LAMB config (its documentation's example) loads: every key read, the
  // transport keys noted.
  const Config lamb = parse(R"({"optimizer": {"type": "OneBitLamb", "params": {"lr": 1e-3, "weight_decay": 0.01,
                                 "bias_correction": false, "max_coeff": 0.3, "min_coeff": 0.01, "freeze_step": 1000,
                                 "cuda_aware": false, "comm_backend_name": "nccl", "coeff_beta": 0.9,
                                 "factor_max": 4.0, "factor_min": 0.5, "factor_threshold": 0.1}},
                                 "zero_optimization": {"stage": 1}})");
  CHECK(lamb.optimizer.type == zero::OptimizerType::onebit_lamb);
  CHECK(lamb.optimizer.freeze_step == 1000);
  CHECK(lamb.optimizer.max_coeff == 0.3);
  CHECK(lamb.optimizer.coeff_beta == 0.9);
  CHECK(lamb.optimizer.factor_max == 4.0);
  CHECK(lamb.optimizer.factor_min == 0.5);
  CHECK(lamb.optimizer.factor_threshold == 0.1);
  CHECK(has_note(lamb, "optimizer.params.comm_backend_name = nccl: handled differently here"));
  CHECK(parse("optimizer: {type: onebitlamb}\nzero_optimization: {stage: 2}\n").optimizer.type ==
        zero::OptimizerType::onebit_lamb);
  // It moves without bias correction, as DeepSpeed's (which ignores the key): true is refused.
  REQUIRE_THROWS_WITH(parse("optimizer: {type: OneBitLamb, params: {bias_correction: true}}\n"
                            "zero_optimization: {stage: 1}\n"),
                      Contains("optimizer.params.bias_correction = true") && Contains("without bias correction"));
  REQUIRE_THROWS_WITH(parse("optimizer: {type: OneBitLamb, params: {factor_min: 5}}\nzero_optimization: {stage: 1}\n"),
                      Contains("factor_min = 5 is more than factor_max = 4"));
  REQUIRE_THROWS_WITH(parse("optimizer: {type: Lamb, params: {coeff_beta: 0.9}}\n"),
                      Contains("optimizer.params.coeff_beta") && Contains("applies to OneBitLamb, not Lamb"));
  // Stage 3 (and 0) and offload on backend: cuda are refused as OneBitAdam's, naming the key.
  REQUIRE_THROWS_WITH(parse("optimizer: {type: OneBitLamb}\nzero_optimization: {stage: 3}\n"),
                      Contains("optimizer.type = OneBitLamb runs at zero_optimization.stage 1 or 2 (stage is 3)"));
  const std::string nvme = "offload_optimizer: {device: nvme, nvme_path: /local_nvme}}\n";
  CHECK(parse("optimizer: {type: OneBitLamb}\nzero_optimization: {stage: 1, " + nvme)
            .zero_optimization.offload_optimizer.device == zero::OffloadDevice::nvme);
  REQUIRE_THROWS_WITH(parse("backend: cuda\noptimizer: {type: OneBitLamb}\nzero_optimization: {stage: 1, " + nvme),
                      Contains("optimizer.type = OneBitLamb with offload_optimizer.device nvme runs on backend: "
                               "host only"));
  REQUIRE_THROWS_WITH(parse("optimizer: {type: OneBitAdam, params: {bias_correction: false}}\n"),
                      Contains("without bias correction"));
  REQUIRE_THROWS_WITH(parse("optimizer: {type: Adam, params: {freeze_step: 10}}\n"),
                      Contains("optimizer.params.freeze_step") && Contains("OneBitAdam"));
  // Where its exchange does not compose, it says why.
  REQUIRE_THROWS_WITH(parse("optimizer: {type: OneBitAdam}\nzero_optimization: {stage: 3}\n"),
                      Contains("optimizer.type = OneBitAdam runs at zero_optimization.stage 1 or 2 (stage is 3)"));
  CHECK(parse("optimizer: {type: OneBitAdam}\nzero_optimization: {stage: 2, offload_optimizer: {device: cpu}}\n")
            .zero_optimization.offload_optimizer.device == zero::OffloadDevice::cpu);
  REQUIRE_THROWS_WITH(parse("backend: cuda\noptimizer: {type: OneBitAdam}\nzero_optimization: {stage: 2, "
                            "offload_optimizer: {device: cpu}}\n"),
                      Contains("backend: host only") && Contains("device memory") && Contains("use backend: host"));
  REQUIRE_THROWS_WITH(parse("optimizer: {type: OneBitAdam}\nzero_optimization: {stage: 1}\ngradient_compression: "
                            "{type: powersgd}\n"),
                      Contains("remove gradient_compression"));
}

TEST_CASE("DeepSpeed's older and alternative spellings", "[config][deepspeed]") {
  Config c = zero::load_config(data("ds_older_forms.json"));
  CHECK(c.train_micro_batch_size_per_gpu == 2);  // quoted numbers, as DeepSpeed accepts them
  CHECK(c.gradient_accumulation_steps == 8);
  CHECK(c.bf16_enabled);  // bfloat16
  const auto& z = c.zero_optimization;
  CHECK(z.stage3_max_live_parameters == 300000000);  // without the stage3_ prefix
  CHECK(z.stage3_max_reuse_distance == 300000000);
  CHECK(z.stage3_prefetch_bucket_size == 0);  // 0, as DeepSpeed takes it
  CHECK(z.stage3_param_persistence_threshold == 10000);
  CHECK(c.aio.intra_op_parallelism == 2);  // aio.thread_count
  CHECK(c.aio.block_size == 262144);
  CHECK(z.zero_hpz_partition_size == 8);  // ZeRO++ hpZ, taken as DeepSpeed takes it
  // Handled differently here: a note naming the key.
  CHECK(has_note(c, "communication_data_type = fp32"));
  // No gradient_clipping in the file: DeepSpeed's default since 0.19.3, said in a note.
  CHECK(c.gradient_clipping == 1.0);
  CHECK(has_note(c, "gradient_clipping: not set, DeepSpeed's default 1 is used"));
  CHECK(c.notes.size() == 2);

  CHECK(parse("zero_optimization: true\n").zero_optimization.stage == 1);
  CHECK(parse("zero_optimization: false\n").zero_optimization.stage == 0);
  REQUIRE_THROWS_WITH(parse("zero_optimization:\n  stage: 3\n  max_live_parameters: 1\n"
                            "  stage3_max_live_parameters: 2\n"),
                      Contains("stage3_max_live_parameters") && Contains("same setting"));
  REQUIRE_THROWS_WITH(parse("bf16: {enabled: true}\nbfloat16: {enabled: true}\n"),
                      Contains("bfloat16") && Contains("same section"));
}

TEST_CASE("type Adam decays decoupled unless adam_w_mode is false, as in DeepSpeed", "[config][deepspeed]") {
  const Config plain = parse("optimizer: {type: Adam, params: {lr: 0.001, weight_decay: 0.1}}\n");
  CHECK(plain.optimizer.decoupled_decay());
  REQUIRE(notes_of(plain).size() == 1);
  CHECK_THAT(notes_of(plain)[0], Contains("optimizer.type: Adam decays decoupled") && Contains("adam_w_mode: false"));
  // The JSON form a DeepSpeed user brings, and the hyper-parameters the update receives.
  const Config json = parse("{\"optimizer\": {\"type\": \"Adam\", \"params\": {\"weight_decay\": 0.1}}}\n");
  CHECK(zero::adam_hyper(json.optimizer, 1e-3, 1, 1.0f).decoupled);
  const Config l2 = parse("optimizer: {type: Adam, params: {weight_decay: 0.1, adam_w_mode: false}}\n");
  CHECK_FALSE(l2.optimizer.decoupled_decay());
  CHECK_FALSE(zero::adam_hyper(l2.optimizer, 1e-3, 1, 1.0f).decoupled);
  CHECK(notes_of(l2).empty());
  const Config adamw = parse("optimizer: {type: AdamW, params: {adam_w_mode: false}}\n");
  CHECK(zero::adam_hyper(adamw.optimizer, 1e-3, 1, 1.0f).decoupled);
  // No decay, no difference, no note.
  CHECK(notes_of(parse("optimizer: {type: Adam, params: {lr: 0.001}}\n")).empty());
  // Not an SGD key.
  REQUIRE_THROWS_WITH(parse("optimizer: {type: SGD, params: {adam_w_mode: true}}\n"),
                      Contains("optimizer.params.adam_w_mode") && Contains("not SGD"));
}

TEST_CASE("DeepSpeed keys that would change the result are errors that say why", "[config][deepspeed]") {
  // DeepSpeed's 0/1 Adam and Adagrad are not implemented.
  REQUIRE_THROWS_WITH(parse("optimizer: {type: ZeroOneAdam}\n"),
                      Contains("optimizer.type = ZeroOneAdam") && Contains("0/1 Adam is not implemented"));
  REQUIRE_THROWS_WITH(parse("optimizer: {type: Adagrad}\n"),
                      Contains("optimizer.type = Adagrad") && Contains("does not implement"));
  // SGD's Nesterov momentum is not implemented; false (PyTorch's default) loads.
  REQUIRE_THROWS_WITH(
      parse("optimizer: {type: SGD, params: {momentum: 0.9, nesterov: true}}\n"),
      Contains("optimizer.params.nesterov = true") && Contains("Nesterov momentum is not implemented for SGD"));
  CHECK_FALSE(parse("optimizer: {type: SGD, params: {momentum: 0.9, nesterov: false}}\n").optimizer.nesterov);
  // adam_w_mode as DeepSpeed reads it: type Adam decays decoupled unless adam_w_mode is false;
  // AdamW always decouples. Given explicitly it is silent where it takes effect.
  CHECK(notes_of(parse("optimizer: {type: AdamW, params: {adam_w_mode: true}}\n")).empty());
  CHECK(notes_of(parse("optimizer: {type: Adam, params: {adam_w_mode: true}}\n")).empty());
  CHECK(notes_of(parse("optimizer: {type: Adam, params: {adam_w_mode: false}}\n")).empty());
  CHECK(has_note(parse("optimizer: {type: AdamW, params: {adam_w_mode: false}}\n"),
                 "optimizer.params.adam_w_mode: false has no effect with type AdamW"));
  REQUIRE_THROWS_WITH(parse("curriculum_learning: {enabled: true, curriculum_type: seqlen}\n"),
                      Contains("curriculum_learning") && Contains("changes the data"));
  CHECK_NOTHROW(parse("curriculum_learning: {enabled: false}\n"));
  REQUIRE_THROWS_WITH(parse("sparse_attention: {mode: fixed, block: 16}\n"), Contains("sparse_attention"));
  REQUIRE_THROWS_WITH(parse("tensor_parallel: {autotp_size: 2}\n"),
                      Contains("tensor_parallel.autotp_size = 2") && Contains("tensor parallelism"));
  REQUIRE_THROWS_WITH(parse("zero_optimization: {stage: 3, aio: {block_size: 1048576}}\n"),
                      Contains("zero_optimization.aio") && Contains("top level"));
}

TEST_CASE("every problem of a file is reported in one error", "[config][deepspeed]") {
  try {
    zero::load_config(data("ds_many_problems.yaml"));
    FAIL("expected an error");
  } catch (const zero::Error& e) {
    const std::string m = e.what();
    INFO(m);
    CHECK(m.find("4 problems") != std::string::npos);
    CHECK(m.find("ds_many_problems.yaml:5") != std::string::npos);
    CHECK(m.find("did you mean 'zero_optimization.reduce_bucket_size'?") != std::string::npos);
    CHECK(m.find("zero_optimization.aio") != std::string::npos);
    CHECK(m.find("optimizer.params.lr = -1") != std::string::npos);
    CHECK(m.find("curriculum_learning") != std::string::npos);
  }
}

TEST_CASE("data_types.grad_accum_dtype: fp32 or the compute dtype; auto follows the backend", "[config]") {
  auto resolved = [](const std::string& text) {
    Config c = parse(text);
    c.resolve(1);
    return c;
  };
  // Given: fp32 under any compute dtype, or the compute dtype itself.
  CHECK(resolved("bf16: {enabled: true}\ndata_types: {grad_accum_dtype: fp32}\n").grad_dtype() == DType::f32);
  CHECK(resolved("fp16: {enabled: true}\ndata_types: {grad_accum_dtype: fp32}\n").grad_dtype() == DType::f32);
  CHECK(resolved("data_types: {grad_accum_dtype: fp32}\n").grad_dtype() == DType::f32);
  CHECK(resolved("bf16: {enabled: true}\ndata_types: {grad_accum_dtype: bf16}\n").grad_dtype() == DType::bf16);
  CHECK(resolved("fp16: {enabled: true}\ndata_types: {grad_accum_dtype: fp16}\n").grad_dtype() == DType::f16);
  // Another 16-bit dtype would round every micro-step's gradient twice: an error that says why.
  REQUIRE_THROWS_WITH(parse("bf16: {enabled: true}\ndata_types: {grad_accum_dtype: fp16}\n"),
                      Contains("data_types.grad_accum_dtype") && Contains("= fp16 but the compute dtype is bf16") &&
                          Contains("set it to fp32"));
  REQUIRE_THROWS_WITH(parse("data_types: {grad_accum_dtype: bf16}\n"),
                      Contains("= bf16 but the compute dtype is fp32"));
  REQUIRE_THROWS_WITH(parse("data_types: {grad_accum_dtype: fp64}\n"), Contains("one of auto, fp32, fp16, bf16"));
  // auto (or absent): fp32 on the CUDA backend with accumulation over 16-bit compute, and said so.
  const Config cuda = resolved("backend: cuda\nbf16: {enabled: true}\ngradient_accumulation_steps: 32\n");
  CHECK(cuda.grad_dtype() == DType::f32);
  CHECK(cuda.grad_accum_dtype == GradAccumDType::fp32);
  CHECK(has_note(cuda,
                 "data_types.grad_accum_dtype: fp32 (the CUDA backend's default with "
                 "gradient_accumulation_steps 32 > 1 and bf16 compute"));
  CHECK(resolved("backend: cuda\nfp16: {enabled: true}\ngradient_accumulation_steps: 2\n").grad_dtype() == DType::f32);
  CHECK(resolved("backend: cuda\nbf16: {enabled: true}\ndata_types: {grad_accum_dtype: auto}\n"
                 "gradient_accumulation_steps: 2\n")
            .grad_dtype() == DType::f32);
  // ... but not without accumulation, nor with fp32 compute, nor on the host backend, nor where given.
  const Config one = resolved("backend: cuda\nbf16: {enabled: true}\ngradient_accumulation_steps: 1\n");
  CHECK(one.grad_dtype() == DType::bf16);
  CHECK_FALSE(has_note(one, "grad_accum_dtype"));
  CHECK(resolved("backend: cuda\ngradient_accumulation_steps: 8\n").grad_dtype() == DType::f32);
  CHECK(resolved("bf16: {enabled: true}\ngradient_accumulation_steps: 8\n").grad_dtype() == DType::bf16);
  CHECK(resolved("backend: cuda\nbf16: {enabled: true}\ngradient_accumulation_steps: 8\n"
                 "data_types: {grad_accum_dtype: bf16}\n")
            .grad_dtype() == DType::bf16);
  // A derived accumulation count counts too (train_batch_size 64 over micro-batches of 8).
  CHECK(resolved("backend: cuda\nbf16: {enabled: true}\ntrain_batch_size: 64\n"
                 "train_micro_batch_size_per_gpu: 8\n")
            .grad_dtype() == DType::f32);
  // The resolved choice is written out and loads back as given.
  const Config again = parse(cuda.to_yaml());
  CHECK(again.grad_accum_dtype == GradAccumDType::fp32);
}

TEST_CASE("a DeepSpeed key that changes nothing here gets a note: sequence_parallel_size", "[config][deepspeed]") {
  const Config c = parse("{\"sequence_parallel_size\": 4, \"zero_optimization\": {\"stage\": 2}}");
  CHECK(has_note(c, "sequence_parallel_size = 4"));
  CHECK(has_note(c, "no sequence parallelism"));
  CHECK(notes_of(parse("{\"sequence_parallel_size\": 1}")).empty());  // the value without it: silent
}

TEST_CASE("a DeepSpeed JSON file's unknown top-level key is ignored with a note unless it is a near miss",
          "[config][deepspeed]") {
  const std::string json =
      "{\n  \"train_micro_batch_size_per_gpu\": 2,\n  \"cuda_visible_devices\": \"0,1\",\n"
      "  \"zero_optimization\": {\"stage\": 2}\n}\n";
  SECTION("a key DeepSpeed ignores: loaded, with a note that names the line") {
    const Config c = zero::parse_config(json, "ds_config.json");
    CHECK(c.train_micro_batch_size_per_gpu == 2);
    CHECK(c.zero_optimization.stage == 2);
    CHECK(has_note(c, "ds_config.json:3: unknown key 'cuda_visible_devices' ignored"));
  }
  SECTION("a near miss of a known key stays an error with did-you-mean") {
    REQUIRE_THROWS_WITH(zero::parse_config("{\"gradient_cliping\": 1.0}", "ds_config.json"),
                        Contains("unknown key 'gradient_cliping'") && Contains("did you mean 'gradient_clipping'?"));
  }
  SECTION("inside a section it stays an error, as DeepSpeed's own models refuse it") {
    REQUIRE_THROWS_WITH(zero::parse_config("{\"zero_optimization\": {\"stage\": 2, \"my_flag\": true}}", "ds.json"),
                        Contains("unknown key 'zero_optimization.my_flag'"));
  }
  SECTION("a YAML file stays strict") {
    REQUIRE_THROWS_WITH(zero::parse_config(json, "run.yaml"), Contains("unknown key 'cuda_visible_devices'"));
  }
  SECTION("a --set override stays strict") {
    LoadOptions o;
    o.overrides = {"my_setting=3"};
    REQUIRE_THROWS_WITH(zero::parse_config("{}", "ds_config.json", o), Contains("unknown key 'my_setting'"));
  }
}

// Issue 36, finding 8: keys DeepSpeed reads set to null as not set (an Optional field, or a
// .get(key, default) whose default is None; DeepSpeed 0.19's runtime/config.py, zero/config.py,
// zero/offload_config.py, precision_config.py, swap_tensor/aio_config.py, engine.py) load with
// their default and a note; they were refused before.
namespace {

struct NullCase {
  const char* text;  // a ds.json; or, starting with '@', a file in the test data
  const char* note;
  std::function<bool(Config&)> holds;
};

const NullCase kNullCases[] = {
    {R"({"train_batch_size": null, "train_micro_batch_size_per_gpu": 4})",
     "train_batch_size: null, the default (derived from the other two and the world size) is used",
     [](Config& c) {
       c.resolve(2);
       return c.train_batch_size == 8 && c.gradient_accumulation_steps == 1;
     }},
    {R"({"train_micro_batch_size_per_gpu": null, "train_batch_size": 16})",
     "train_micro_batch_size_per_gpu: null, the default (derived",
     [](Config& c) {
       c.resolve(2);
       return c.train_micro_batch_size_per_gpu == 8;
     }},
    {R"({"gradient_accumulation_steps": null, "train_batch_size": 16, "train_micro_batch_size_per_gpu": 4})",
     "gradient_accumulation_steps: null, the default (derived",
     [](Config& c) {
       c.resolve(2);
       return c.gradient_accumulation_steps == 2;
     }},
    {R"({"steps_per_print": null})", "steps_per_print: null, the default 10 is used",
     [](Config& c) { return c.steps_per_print == 10; }},
    {R"({"bf16": null})", "bf16: null, the defaults of its keys are used", [](Config& c) { return !c.bf16_enabled; }},
    {R"({"aio": null})", "aio: null, the defaults of its keys are used",
     [](Config& c) { return c.aio.block_size == 1048576 && c.aio.queue_depth == 8; }},
    {R"({"zero_optimization": {"stage": 3, "overlap_comm": null}})",
     "zero_optimization.overlap_comm: null, the default true is used",
     [](Config& c) { return c.zero_optimization.overlap_comm; }},
    {R"({"zero_optimization": {"stage": 2, "offload_optimizer": null}})",
     "zero_optimization.offload_optimizer: null, the defaults of its keys are used",
     [](Config& c) { return c.zero_optimization.offload_optimizer.device == zero::OffloadDevice::none; }},
    {R"({"zero_optimization": {"stage": 3, "offload_param": null}})",
     "zero_optimization.offload_param: null, the defaults of its keys are used",
     [](Config& c) { return c.zero_optimization.offload_param.device == zero::OffloadDevice::none; }},
    {R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "nvme_path": null}}})",
     "zero_optimization.offload_optimizer.nvme_path: null, the default (empty) is used",
     [](Config& c) {
       const auto& o = c.zero_optimization.offload_optimizer;
       return o.device == zero::OffloadDevice::cpu && o.nvme_path.empty();
     }},
    {R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu", "nvme_path": null}}})",
     "zero_optimization.offload_param.nvme_path: null, the default (empty) is used",
     [](Config& c) {
       const auto& o = c.zero_optimization.offload_param;
       return o.device == zero::OffloadDevice::cpu && o.nvme_path.empty();
     }},
    // OpenRLHF writes "data_types": {"grad_accum_dtype": null} into every ds config it builds.
    {"@openrlhf_ds_config.json", "data_types.grad_accum_dtype: null, the default auto is used",
     [](Config& c) {
       c.resolve(8);
       return c.grad_accum_dtype == GradAccumDType::bf16 && c.gradient_accumulation_steps == 4 && c.bf16_enabled;
     }},
    {R"({"optimizer": {"type": "AdamW", "params": null}})", "optimizer.params: null, the defaults of its keys are used",
     [](Config& c) { return c.optimizer.type == zero::OptimizerType::adamw && c.optimizer.lr == 1e-3; }},
};

std::string error_of(const std::string& text, const std::string& origin = "ds.json") {
  try {
    zero::parse_config(text, origin);
  } catch (const zero::Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("null means the default where DeepSpeed reads it so, with a note", "[config][deepspeed]") {
  const NullCase& k = kNullCases[GENERATE(range(std::size_t(0), std::size(kNullCases)))];
  INFO(k.text);
  Config c = k.text[0] == '@' ? zero::load_config(data(k.text + 1)) : parse(k.text);
  CHECK(has_note(c, k.note));
  CHECK(has_note(c, "(as DeepSpeed reads it)"));
  CHECK(k.holds(c));
}

TEST_CASE("a YAML null (~ or no value) reads as a JSON null does", "[config]") {
  for (const char* text : {"steps_per_print: ~\n", "steps_per_print: null\n", "steps_per_print:\n"}) {
    const Config c = zero::parse_config(text, "run.yaml");
    CHECK(c.steps_per_print == 10);
    CHECK(has_note(c, "steps_per_print: null, the default 10 is used"));
  }
  const Config c = zero::parse_config("zero_optimization:\n  stage: 3\n  offload_param: ~\n", "run.yaml");
  CHECK(has_note(c, "zero_optimization.offload_param: null, the defaults of its keys are used"));
  // bfloat16 is read where bf16 is null, as DeepSpeed does.
  CHECK(parse(R"({"bf16": null, "bfloat16": {"enabled": true}})").bf16_enabled);
}

TEST_CASE("optimizer.type: null is one error, not a cascade of unknown keys", "[config][deepspeed]") {
  const std::string m = error_of(R"({"train_micro_batch_size_per_gpu": 1,
    "optimizer": {"type": null, "params": {"lr": 1e-4, "betas": [0.9, 0.95], "eps": 1e-8,
                                           "weight_decay": 0.1, "amsgrad": false, "torch_adam": true}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}}})");
  INFO(m);
  CHECK_THAT(m, Contains("ds.json:2: optimizer.type has no value (null)") &&
                    Contains("DeepSpeed then takes no optimizer from the file") &&
                    Contains("write one of AdamW, Adam, SGD") &&
                    Contains("remove the optimizer section for the default AdamW"));
  CHECK(m.find("problems") == std::string::npos);  // the one error, alone
  CHECK(m.find("unknown key") == std::string::npos);
  // The same for the scheduler's type.
  const std::string s = error_of(R"({"scheduler": {"type": null, "params": {"warmup_max_lr": 0.1}}})");
  INFO(s);
  CHECK_THAT(s, Contains("scheduler.type has no value (null)") && Contains("WarmupLR, WarmupDecayLR"));
  CHECK(s.find("unknown key") == std::string::npos);
  CHECK(s.find("problems") == std::string::npos);
}

TEST_CASE("sparse_gradients: null is unset, as DeepSpeed reads None", "[config][deepspeed]") {
  const Config c = parse(R"({"sparse_gradients": null})");
  CHECK(notes_of(c).empty());
  REQUIRE_THROWS_WITH(parse(R"({"sparse_gradients": true})"),
                      Contains("sparse_gradients = true") && Contains("not implemented"));
}

TEST_CASE("a key DeepSpeed refuses as null stays an error that says to remove it", "[config][deepspeed]") {
  // DeepSpeed compares None > 0.0 for gradient_clipping, validates stage as an int enum and
  // fp16 as a mapping, and reads amp's keys from None: every one fails there too.
  CHECK_THAT(error_of(R"({"gradient_clipping": null})"),
             Contains("gradient_clipping has no value (null)") && Contains("remove the key for the default 1"));
  CHECK_THAT(error_of(R"({"zero_optimization": {"stage": null}})"),
             Contains("zero_optimization.stage has no value (null)") && Contains("remove the key for the default 0"));
  CHECK_THAT(error_of(R"({"fp16": null})"),
             Contains("fp16 has no value (null)") && Contains("remove the key for the defaults"));
  CHECK_THAT(error_of(R"({"amp": null})"),
             Contains("amp has no value (null)") && Contains("remove the key for the default"));
  // adam_w_mode: null is false to DeepSpeed (L2 decay with type Adam), not its default true.
  CHECK_THAT(
      error_of(R"({"optimizer": {"type": "Adam", "params": {"adam_w_mode": null}}})"),
      Contains("optimizer.params.adam_w_mode has no value (null)") && Contains("remove the key for the default true"));
}

TEST_CASE("gradient_clipping: a DeepSpeed JSON file gets DeepSpeed's default 1.0, a YAML file 0",
          "[config][deepspeed]") {
  const Config json = zero::parse_config(R"({"train_micro_batch_size_per_gpu": 2})", "ds_config.json");
  CHECK(json.gradient_clipping == 1.0);
  CHECK(has_note(json, "gradient_clipping: not set, DeepSpeed's default 1 is used (DeepSpeed 0.19.3 and later"));
  const Config off = zero::parse_config(R"({"gradient_clipping": 0})", "ds_config.json");
  CHECK(off.gradient_clipping == 0.0);
  CHECK(off.notes.empty());
  const Config fallback = zero::parse_config(R"({"gradient_clipping": "auto"})", "ds_config.json");
  CHECK(fallback.gradient_clipping == 1.0);
  CHECK(has_note(fallback, "gradient_clipping: \"auto\" -> 1 (DeepSpeed default)"));
  const Config yaml = zero::parse_config("train_micro_batch_size_per_gpu: 2\n", "run.yaml");
  CHECK(yaml.gradient_clipping == 0.0);
  CHECK(yaml.notes.empty());
  // Written out, the value travels with the config (a checkpoint's YAML keeps 1).
  CHECK(zero::parse_config(json.to_yaml(), "again.yaml").gradient_clipping == 1.0);
}

// communication_data_type: the compute dtype rounds fp32-accumulated gradients before the
// stage 0/1 reduction (engine/reduce.hpp); auto keeps the accumulation dtype; what libzero
// cannot send is a note, not silence.
TEST_CASE("communication_data_type chooses the stage 0/1 reduction's dtype", "[config][deepspeed]") {
  using zero::CommDataType;
  auto resolved = [](const std::string& text) {
    Config c = parse(text);
    c.resolve(2);
    return c;
  };
  const std::string bf16_fp32_accum =
      R"({"bf16": {"enabled": true}, "data_types": {"grad_accum_dtype": "fp32"}, "zero_optimization": {"stage": 1})";
  // The default: fp32 accumulation reduces in fp32.
  const Config dflt = resolved(bf16_fp32_accum + "}");
  CHECK(dflt.communication_data_type == CommDataType::automatic);
  CHECK(dflt.comm_dtype() == DType::f32);
  CHECK_FALSE(has_note(dflt, "communication_data_type"));
  for (const char* v : {"null", "\"auto\""}) {
    INFO(v);
    CHECK(resolved(bf16_fp32_accum + ", \"communication_data_type\": " + v + "}").comm_dtype() == DType::f32);
  }
  // The compute dtype: rounded once, no note.
  const Config bf16 = resolved(bf16_fp32_accum + R"(, "communication_data_type": "bf16"})");
  CHECK(bf16.communication_data_type == CommDataType::bf16);
  CHECK(bf16.comm_dtype() == DType::bf16);
  CHECK_FALSE(has_note(bf16, "communication_data_type"));
  CHECK(resolved(R"({"fp16": {"enabled": true}, "data_types": {"grad_accum_dtype": "fp32"}, )"
                 R"("communication_data_type": "fp16"})")
            .comm_dtype() == DType::f16);
  // fp32 where the reduction is fp32 already: nothing to say.
  CHECK_FALSE(has_note(resolved(bf16_fp32_accum + R"(, "communication_data_type": "fp32"})"), "communication"));
  // Where gradients accumulate in bf16 the reduction is bf16 already: bf16 is inert, fp32 noted.
  const Config accum16 = resolved(R"({"bf16": {"enabled": true}, "communication_data_type": "bf16"})");
  CHECK(accum16.comm_dtype() == DType::bf16);
  CHECK_FALSE(has_note(accum16, "communication_data_type"));
  CHECK(has_note(resolved(R"({"bf16": {"enabled": true}, "communication_data_type": "fp32"})"),
                 "communication_data_type = fp32: handled differently here: gradients accumulate in bf16 "
                 "(data_types.grad_accum_dtype: auto)"));
  CHECK(has_note(parse(R"({"bf16": {"enabled": true}, "zero_optimization": {"stage": 2}, )"
                       R"("communication_data_type": "fp32"})"),
                 "communication_data_type = fp32: handled differently here: stages 2 and 3"));
  // A 16-bit dtype other than the compute dtype cannot be sent: a note, and the reduction keeps
  // its dtype.
  const Config other = resolved(bf16_fp32_accum + R"(, "communication_data_type": "fp16"})");
  CHECK(has_note(other, "communication_data_type = fp16: handled differently here"));
  CHECK(other.comm_dtype() == DType::f32);
  CHECK(has_note(parse(R"({"communication_data_type": "bf16"})"), "communication_data_type = bf16"));
  REQUIRE_THROWS_WITH(parse(R"({"communication_data_type": "int8"})"), Contains("communication_data_type"));
  // to_yaml writes it, and loading that gives the same setting.
  CHECK(zero::parse_config(bf16.to_yaml(), "again").communication_data_type == CommDataType::bf16);
}
