// The strict config loader: DeepSpeed files load as is, every bad input class fails with a
// message that names the key, the place and what was expected, "auto" is resolved visibly,
// the lr schedules match DeepSpeed's formulas, and to_yaml() round-trips.
#include <sys/stat.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "test_data.hpp"
#include "zero/config.hpp"
#include "zero/config_schema.hpp"
#include "zero/error.hpp"
#include "zero/optim.hpp"

using Catch::Contains;
using zero::Config;
using zero::LoadOptions;

namespace {

std::string data(const std::string& name) { return zero::test::data_path(name); }

Config parse(const std::string& text, const LoadOptions& opts = {}) {
  return zero::parse_config(text, "test.yaml", opts);
}

LoadOptions sets(std::vector<std::string> overrides) {
  LoadOptions o;
  o.overrides = std::move(overrides);
  return o;
}
LoadOptions sections(std::vector<std::string> names) {
  LoadOptions o;
  o.extra_sections = std::move(names);
  return o;
}
LoadOptions run_length(std::int64_t steps) {
  LoadOptions o;
  o.total_num_steps = steps;
  return o;
}

bool has_note(const Config& c, const std::string& part) {
  for (const auto& n : c.notes)
    if (n.find(part) != std::string::npos) return true;
  return false;
}

// A fresh directory under the system temp dir, removed at scope exit.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "zero-test-XXXXXX").string();
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::permissions(path, std::filesystem::perms::owner_all, ec);
    std::filesystem::remove_all(path, ec);
  }
};

}  // namespace

TEST_CASE("a DeepSpeed ds_config.json loads as is", "[config]") {
  Config c = zero::load_config(data("ds_config.json"));
  CHECK(c.train_batch_size == 32);
  CHECK(c.train_micro_batch_size_per_gpu == 4);
  CHECK(c.gradient_accumulation_steps == 2);
  CHECK(c.steps_per_print == 100);
  CHECK(c.gradient_clipping == 1.0);
  CHECK(c.optimizer.type == zero::OptimizerType::adamw);
  CHECK(c.optimizer.lr == 3e-4);
  CHECK(c.optimizer.beta1 == 0.9);
  CHECK(c.optimizer.beta2 == 0.95);
  CHECK(c.optimizer.eps == 1e-8);
  CHECK(c.optimizer.weight_decay == 0.1);
  CHECK(c.scheduler.type == zero::SchedulerType::warmup_decay_lr);
  CHECK(c.scheduler.warmup_min_lr == 0.0);
  CHECK(c.scheduler.warmup_max_lr == 3e-4);
  CHECK(c.scheduler.warmup_num_steps == 500);
  CHECK(c.scheduler.total_num_steps == 10000);
  CHECK(c.scheduler.warmup_type == zero::WarmupType::log);
  CHECK(c.fp16.enabled);
  CHECK(c.fp16.loss_scale == 0.0);
  CHECK(c.fp16.initial_scale_power == 16);
  CHECK(c.fp16.loss_scale_window == 1000);
  CHECK(c.fp16.hysteresis == 2);
  CHECK(c.fp16.min_loss_scale == 1.0);
  CHECK_FALSE(c.bf16_enabled);
  CHECK(c.compute_dtype() == zero::DType::f16);
  const auto& z = c.zero_optimization;
  CHECK(z.stage == 2);
  CHECK(z.allgather_bucket_size == 500000000);  // written 5e8
  CHECK(z.reduce_bucket_size == 200000000);     // written 2e8
  CHECK(z.overlap_comm);
  CHECK(z.reduce_scatter);
  CHECK(z.contiguous_gradients);
  CHECK(z.offload_optimizer.device == zero::OffloadDevice::cpu);
  CHECK(z.offload_optimizer.pin_memory);
  CHECK(z.offload_param.device == zero::OffloadDevice::none);
  CHECK(c.source == data("ds_config.json"));
  CHECK(c.notes.empty());

  c.resolve(4);  // 32 = 4 x 2 x 4
  CHECK(c.resolved);
  CHECK(c.train_batch_size == 32);
}

TEST_CASE("a tab-indented stage-3 NVMe JSON with auto values loads", "[config]") {
  Config c = zero::load_config(data("ds_config_stage3_nvme.json"));
  const auto& z = c.zero_optimization;
  CHECK(z.stage == 3);
  CHECK(z.overlap_comm);  // DeepSpeed's default at stage 3
  CHECK(z.stage3_prefetch_bucket_size == 50000000);
  CHECK(z.stage3_param_persistence_threshold == 100000);
  CHECK(z.stage3_max_live_parameters == 1000000000);
  CHECK(z.sub_group_size == 1000000000);
  CHECK(z.offload_optimizer.device == zero::OffloadDevice::nvme);
  CHECK(z.offload_optimizer.nvme_path == "/local_nvme");
  CHECK(z.offload_optimizer.buffer_count == 4);
  CHECK(z.offload_param.device == zero::OffloadDevice::nvme);
  CHECK(z.offload_param.buffer_size == 100000000);
  CHECK(z.offload_param.max_in_cpu == 1000000000);
  CHECK(c.aio.block_size == 1048576);
  CHECK(c.aio.queue_depth == 8);
  CHECK(c.aio.overlap_events);
  CHECK(c.bf16_enabled);
  CHECK(c.compute_dtype() == zero::DType::bf16);
  CHECK(c.optimizer.type == zero::OptimizerType::adam);  // "adam": case-insensitive
  CHECK(c.optimizer.weight_decay == 0.0);                // Adam's default
  CHECK(c.optimizer.lr == 1e-3);
  CHECK(c.train_micro_batch_size_per_gpu == 0);  // "auto" until resolve()
  CHECK(c.gradient_accumulation_steps == 4);
  CHECK(has_note(c, "optimizer.params.lr: \"auto\" -> 0.001"));
  CHECK(has_note(c, "optimizer.params.betas: \"auto\" -> [0.9, 0.999]"));
  CHECK(has_note(c, "zero_optimization.stage3_prefetch_bucket_size: \"auto\" -> 50000000"));
}

TEST_CASE("an unknown key names the key, file:line and the closest known key", "[config]") {
  REQUIRE_THROWS_AS(zero::load_config(data("config_typo.yaml")), zero::Error);
  REQUIRE_THROWS_WITH(zero::load_config(data("config_typo.yaml")), Contains("config_typo.yaml:4") &&
                                                                       Contains("unknown key 'zero_optimisation'") &&
                                                                       Contains("did you mean 'zero_optimization'?"));

  // Nested: the full key path and the suggestion's full path.
  REQUIRE_THROWS_WITH(parse("zero_optimization:\n  stage: 2\n  reduce_bucket_sise: 100\n"),
                      Contains("test.yaml:3") && Contains("unknown key 'zero_optimization.reduce_bucket_sise'") &&
                          Contains("did you mean 'zero_optimization.reduce_bucket_size'?"));
  REQUIRE_THROWS_WITH(parse("optimizer:\n  type: AdamW\n  params:\n    lr: 1e-3\n    bettas: [0.9, 0.99]\n"),
                      Contains("test.yaml:5") && Contains("'optimizer.params.bettas'") &&
                          Contains("did you mean 'optimizer.params.betas'?"));
  // Far from every known key: the known keys are listed instead of a guess.
  REQUIRE_THROWS_WITH(parse("aio:\n  xyzzy_plugh: 1\n"),
                      Contains("unknown key 'aio.xyzzy_plugh'") && Contains("block_size"));
  // DeepSpeed keys with no effect here load silently (issue 14's policy); a misspelling of one
  // still gets the did-you-mean.
  CHECK(parse("zero_optimization:\n  stage: 3\n  stage3_gather_16bit_weights_on_model_save: true\n").notes.empty());
  CHECK(parse("wall_clock_breakdown: false\n").notes.empty());
  REQUIRE_THROWS_WITH(parse("wall_clock_breakdwn: false\n"), Contains("unknown key 'wall_clock_breakdwn'") &&
                                                                 Contains("did you mean 'wall_clock_breakdown'?"));
  // A key given twice is not silently resolved to one of them.
  REQUIRE_THROWS_WITH(parse("steps_per_print: 1\nsteps_per_print: 2\n"),
                      Contains("steps_per_print") && Contains("appears twice") && Contains("lines 1 and 2"));
}

TEST_CASE("wrong types and ranges name the path, the value and what is expected", "[config]") {
  REQUIRE_THROWS_WITH(parse("zero_optimization:\n  stage: three\n"), Contains("test.yaml:2") &&
                                                                         Contains("zero_optimization.stage = three") &&
                                                                         Contains("expected an integer in 0..3"));
  REQUIRE_THROWS_WITH(parse("zero_optimization:\n  stage: 7\n"),
                      Contains("zero_optimization.stage = 7") && Contains("expected an integer in 0..3"));
  // 0 is a bucket size DeepSpeed accepts (one bucket per unit); below is an error.
  CHECK(parse("zero_optimization:\n  reduce_bucket_size: 0\n").zero_optimization.reduce_bucket_size == 0);
  REQUIRE_THROWS_WITH(parse("zero_optimization:\n  reduce_bucket_size: -1\n"),
                      Contains("zero_optimization.reduce_bucket_size = -1") && Contains("expected an integer >= 0"));
  REQUIRE_THROWS_WITH(parse("zero_optimization:\n  allgather_bucket_size: -5\n"), Contains("expected an integer >= 0"));
  REQUIRE_THROWS_WITH(parse("optimizer:\n  type: AdamW\n  params:\n    betas: [0.9, 1.0]\n"),
                      Contains("test.yaml:4") && Contains("optimizer.params.betas[1] = 1.0") && Contains("in [0, 1)"));
  REQUIRE_THROWS_WITH(parse("optimizer:\n  type: AdamW\n  params:\n    betas: [0.9]\n"),
                      Contains("optimizer.params.betas is a list of 1") && Contains("a list of 2 numbers"));
  REQUIRE_THROWS_WITH(parse("optimizer:\n  type: AdamW\n  params:\n    eps: 0\n"),
                      Contains("optimizer.params.eps = 0") && Contains("> 0"));
  REQUIRE_THROWS_WITH(parse("fp16:\n  enabled: maybe\n"),
                      Contains("fp16.enabled = maybe") && Contains("expected true or false"));
  REQUIRE_THROWS_WITH(parse("fp16: 1\n"), Contains("fp16 = 1") && Contains("expected a section"));
  // No value is null: the default where DeepSpeed reads null so (steps_per_print:, with a note;
  // test_config_deepspeed), else an error.
  REQUIRE_THROWS_WITH(parse("gradient_clipping:\n"),
                      Contains("gradient_clipping has no value") && Contains("remove the key for the default 0"));
  REQUIRE_THROWS_WITH(parse("optimizer:\n  type: ZeroOneAdam\n"),
                      Contains("optimizer.type = ZeroOneAdam") && Contains("0/1 Adam is not implemented") &&
                          Contains("one of AdamW, Adam, SGD, Lamb, Lion, Adafactor, Muon, OneBitAdam, OneBitLamb"));
  REQUIRE_THROWS_WITH(parse("scheduler:\n  type: WarmupLr\n"),
                      Contains("scheduler.type = WarmupLr") && Contains("did you mean WarmupLR?"));
  REQUIRE_THROWS_WITH(
      parse("zero_optimization:\n  offload_optimizer:\n    device: gpu\n"),
      Contains("zero_optimization.offload_optimizer.device = gpu") && Contains("one of none, cpu, nvme"));
  REQUIRE_THROWS_WITH(parse("aio:\n  block_size: 5000\n"), Contains("aio.block_size") && Contains("multiple of 4096"));
  // "auto" only where DeepSpeed accepts it.
  REQUIRE_THROWS_WITH(parse("zero_optimization:\n  stage: auto\n"),
                      Contains("zero_optimization.stage = auto") && Contains("not accepted"));
  // Options that do not apply to the chosen optimizer / scheduler.
  REQUIRE_THROWS_WITH(parse("optimizer:\n  type: SGD\n  params:\n    betas: [0.9, 0.99]\n"),
                      Contains("optimizer.params.betas") && Contains("not SGD"));
  REQUIRE_THROWS_WITH(parse("optimizer:\n  type: AdamW\n  params:\n    momentum: 0.9\n"),
                      Contains("optimizer.params.momentum") && Contains("applies to SGD and Muon, not AdamW") &&
                          Contains("AdamW's momentum is betas[0]"));
  REQUIRE_THROWS_WITH(parse("scheduler:\n  type: WarmupCosineLR\n  params:\n    total_num_steps: 100\n"
                            "    warmup_max_lr: 0.1\n"),
                      Contains("scheduler.params.warmup_max_lr") && Contains("WarmupCosineLR"));
  REQUIRE_THROWS_WITH(parse("scheduler:\n  type: WarmupDecayLR\n  params:\n    warmup_num_steps: 10\n"),
                      Contains("scheduler.params.total_num_steps") && Contains("missing"));
  REQUIRE_THROWS_WITH(parse("scheduler:\n  params:\n    warmup_num_steps: 10\n"),
                      Contains("scheduler.type") && Contains("missing"));
}

TEST_CASE("every optimizer type loads with its own defaults", "[config][optimizer]") {
  using zero::OptimizerType;
  // Any case, as DeepSpeed's names.
  CHECK(parse("optimizer: {type: lamb}\n").optimizer.type == OptimizerType::lamb);
  CHECK(parse("optimizer: {type: LION}\n").optimizer.type == OptimizerType::lion);
  CHECK(parse("optimizer: {type: adafactor}\n").optimizer.type == OptimizerType::adafactor);
  CHECK(parse("optimizer: {type: muon}\n").optimizer.type == OptimizerType::muon);

  const auto lamb = parse("optimizer: {type: Lamb}\n").optimizer;
  CHECK(lamb.lr == 1e-3);
  CHECK(lamb.beta1 == 0.9);
  CHECK(lamb.beta2 == 0.999);
  CHECK(lamb.eps == 1e-8);
  CHECK(lamb.weight_decay == 0.0);
  CHECK(lamb.bias_correction);
  CHECK(lamb.max_coeff == 10.0);
  CHECK(lamb.min_coeff == 0.01);

  const auto lion = parse("optimizer: {type: Lion}\n").optimizer;
  CHECK(lion.lr == 1e-3);
  CHECK(lion.beta1 == 0.9);
  CHECK(lion.beta2 == 0.99);
  CHECK(lion.weight_decay == 0.0);

  const auto adafactor = parse("optimizer: {type: Adafactor}\n").optimizer;
  CHECK(adafactor.lr == 1e-3);
  CHECK(adafactor.weight_decay == 0.0);
  CHECK(adafactor.eps1 == 1e-30);
  CHECK(adafactor.eps2 == 1e-3);
  CHECK(adafactor.clip_threshold == 1.0);
  CHECK(adafactor.decay_rate == -0.8);
  CHECK(adafactor.adafactor_beta1 == 0.0);
  CHECK_FALSE(adafactor.scale_parameter);
  CHECK_FALSE(adafactor.relative_step);
  CHECK_FALSE(adafactor.warmup_init);

  const auto muon = parse("optimizer: {type: Muon}\n").optimizer;
  CHECK(muon.lr == 1e-3);
  CHECK(muon.weight_decay == 0.1);
  CHECK(muon.momentum == 0.95);
  CHECK(muon.nesterov);
  CHECK(muon.ns_steps == 5);
  CHECK(muon.adjust_lr_fn == zero::MuonScale::original);
  CHECK(muon.beta1 == 0.9);
  CHECK(muon.beta2 == 0.999);
  CHECK(muon.eps == 1e-8);

  // The per-type defaults of the older types are unchanged.
  const auto sgd = parse("optimizer: {type: SGD}\n").optimizer;
  CHECK(sgd.momentum == 0.0);
  CHECK(sgd.weight_decay == 0.0);
  CHECK(parse("optimizer: {type: AdamW}\n").optimizer.beta2 == 0.999);
  CHECK(parse("optimizer: {type: Adam}\n").optimizer.weight_decay == 0.0);

  // Given values are read.
  const auto given = parse(
                         "optimizer:\n  type: Adafactor\n  params:\n    eps1: 1.0e-20\n    eps2: 0.01\n"
                         "    clip_threshold: 2\n    decay_rate: -0.5\n    beta1: 0.9\n    scale_parameter: true\n"
                         "    relative_step: true\n    warmup_init: true\n")
                         .optimizer;
  CHECK(given.eps1 == 1e-20);
  CHECK(given.eps2 == 0.01);
  CHECK(given.clip_threshold == 2.0);
  CHECK(given.decay_rate == -0.5);
  CHECK(given.adafactor_beta1 == 0.9);
  CHECK(given.scale_parameter);
  CHECK(given.relative_step);
  CHECK(given.warmup_init);
  const auto m = parse(
                     "optimizer:\n  type: Muon\n  params:\n    lr: 0.02\n    momentum: 0.9\n    nesterov: false\n"
                     "    ns_steps: 6\n    adjust_lr_fn: match_rms_adamw\n    betas: [0.9, 0.95]\n    eps: 1.0e-10\n")
                     .optimizer;
  CHECK(m.lr == 0.02);
  CHECK(m.momentum == 0.9);
  CHECK_FALSE(m.nesterov);
  CHECK(m.ns_steps == 6);
  CHECK(m.adjust_lr_fn == zero::MuonScale::match_rms_adamw);
  CHECK(m.beta2 == 0.95);
  CHECK(m.eps == 1e-10);
  const auto l = parse("optimizer: {type: Lion, params: {betas: [0.95, 0.98], weight_decay: 1.0}}\n").optimizer;
  CHECK(l.beta1 == 0.95);
  CHECK(l.beta2 == 0.98);
  CHECK(l.weight_decay == 1.0);
  CHECK_FALSE(parse("optimizer: {type: AdamW, params: {bias_correction: false}}\n").optimizer.bias_correction);
  // PyTorch's and Hugging Face's None for adjust_lr_fn and beta1: the default, with a note.
  const Config nulls = parse("optimizer: {type: Muon, params: {adjust_lr_fn: null}}\n");
  CHECK(nulls.optimizer.adjust_lr_fn == zero::MuonScale::original);
  CHECK(has_note(nulls, "optimizer.params.adjust_lr_fn: null"));
  CHECK(parse("optimizer: {type: Adafactor, params: {beta1: ~}}\n").optimizer.adafactor_beta1 == 0.0);
}

TEST_CASE("an optimizer key of another type is refused, naming the types it applies to", "[config][optimizer]") {
  struct Case {
    const char* yaml;
    const char* key;
    const char* why;
  };
  const Case cases[] = {
      {"{type: Adafactor, params: {betas: [0.9, 0.999]}}", "optimizer.params.betas",
       "applies to Adam, AdamW, Lamb, Lion, Muon, OneBitAdam and OneBitLamb, not Adafactor"},
      {"{type: SGD, params: {eps: 1.0e-8}}", "optimizer.params.eps",
       "applies to Adam, AdamW, Lamb, Muon, OneBitAdam and OneBitLamb, not SGD"},
      {"{type: Lion, params: {eps: 1.0e-8}}", "optimizer.params.eps", "not Lion"},
      {"{type: Lion, params: {bias_correction: false}}", "optimizer.params.bias_correction",
       "applies to Adam, AdamW, Lamb and OneBitLamb, not Lion"},
      {"{type: AdamW, params: {max_coeff: 5}}", "optimizer.params.max_coeff",
       "applies to Lamb and OneBitLamb, not AdamW"},
      {"{type: Adam, params: {min_coeff: 0.1}}", "optimizer.params.min_coeff",
       "applies to Lamb and OneBitLamb, not Adam"},
      {"{type: AdamW, params: {eps1: 1.0e-30}}", "optimizer.params.eps1", "applies to Adafactor, not AdamW"},
      {"{type: Lamb, params: {eps2: 0.001}}", "optimizer.params.eps2", "applies to Adafactor, not Lamb"},
      {"{type: Muon, params: {clip_threshold: 1}}", "optimizer.params.clip_threshold",
       "applies to Adafactor, not Muon"},
      {"{type: SGD, params: {decay_rate: -0.8}}", "optimizer.params.decay_rate", "applies to Adafactor, not SGD"},
      {"{type: AdamW, params: {beta1: 0.9}}", "optimizer.params.beta1", "applies to Adafactor, not AdamW"},
      {"{type: Lion, params: {scale_parameter: true}}", "optimizer.params.scale_parameter", "applies to Adafactor"},
      {"{type: Lion, params: {relative_step: true}}", "optimizer.params.relative_step", "applies to Adafactor"},
      {"{type: Lion, params: {warmup_init: false}}", "optimizer.params.warmup_init", "applies to Adafactor"},
      {"{type: Adafactor, params: {momentum: 0.9}}", "optimizer.params.momentum",
       "applies to SGD and Muon, not Adafactor"},
      {"{type: AdamW, params: {nesterov: true}}", "optimizer.params.nesterov", "applies to Muon and SGD, not AdamW"},
      {"{type: SGD, params: {ns_steps: 5}}", "optimizer.params.ns_steps", "applies to Muon, not SGD"},
      {"{type: Lamb, params: {adjust_lr_fn: original}}", "optimizer.params.adjust_lr_fn", "applies to Muon, not Lamb"},
      {"{type: Muon, params: {adam_w_mode: true}}", "optimizer.params.adam_w_mode",
       "applies to Adam and AdamW, not Muon"},
  };
  for (const auto& k : cases) {
    INFO(k.yaml);
    REQUIRE_THROWS_WITH(parse(std::string("optimizer: ") + k.yaml + "\n"), Contains(k.key) && Contains(k.why));
  }
}

TEST_CASE("optimizer hyper-parameters that constrain each other", "[config][optimizer]") {
  // Lamb's trust-ratio bounds.
  REQUIRE_THROWS_WITH(parse("optimizer: {type: Lamb, params: {min_coeff: 0.5, max_coeff: 0.3}}\n"),
                      Contains("optimizer.params.min_coeff = 0.5 is more than max_coeff = 0.3"));
  REQUIRE_THROWS_WITH(parse("optimizer: {type: Lamb, params: {max_coeff: 0.001}}\n"),
                      Contains("optimizer.params.max_coeff = 0.001 is less than min_coeff = 0.01"));
  CHECK(parse("optimizer: {type: Lamb, params: {min_coeff: 0.3, max_coeff: 0.3}}\n").optimizer.min_coeff == 0.3);
  REQUIRE_THROWS_WITH(parse("optimizer: {type: Lamb, params: {max_coeff: 0}}\n"),
                      Contains("optimizer.params.max_coeff = 0") && Contains("> 0"));
  // Adafactor: warmup_init warms up the relative step, so it needs one; a relative step replaces lr.
  REQUIRE_THROWS_WITH(parse("optimizer: {type: Adafactor, params: {warmup_init: true}}\n"),
                      Contains("optimizer.params.warmup_init = true needs relative_step: true"));
  CHECK(
      parse("optimizer: {type: Adafactor, params: {warmup_init: true, relative_step: true}}\n").optimizer.warmup_init);
  REQUIRE_THROWS_WITH(parse("optimizer: {type: Adafactor, params: {lr: 0.001, relative_step: true}}\n"),
                      Contains("optimizer.params.lr is given and relative_step is true"));
  REQUIRE_THROWS_WITH(parse("optimizer: {type: Adafactor, params: {relative_step: true}}\n"
                            "scheduler: {type: WarmupLR}\n"),
                      Contains("optimizer.params.relative_step = true replaces the learning rate") &&
                          Contains("remove the scheduler section"));
  // Ranges.
  REQUIRE_THROWS_WITH(parse("optimizer: {type: Adafactor, params: {clip_threshold: 0}}\n"),
                      Contains("optimizer.params.clip_threshold = 0") && Contains("> 0"));
  REQUIRE_THROWS_WITH(parse("optimizer: {type: Adafactor, params: {decay_rate: 0.8}}\n"),
                      Contains("optimizer.params.decay_rate = 0.8") && Contains("< 0"));
  REQUIRE_THROWS_WITH(parse("optimizer: {type: Adafactor, params: {beta1: 1}}\n"),
                      Contains("optimizer.params.beta1 = 1") && Contains("in [0, 1)"));
  REQUIRE_THROWS_WITH(parse("optimizer: {type: Muon, params: {ns_steps: 0}}\n"),
                      Contains("optimizer.params.ns_steps = 0") && Contains("1..100"));
  REQUIRE_THROWS_WITH(parse("optimizer: {type: Muon, params: {ns_steps: 101}}\n"),
                      Contains("optimizer.params.ns_steps = 101"));
  REQUIRE_THROWS_WITH(parse("optimizer: {type: Muon, params: {ns_steps: 5.5}}\n"),
                      Contains("optimizer.params.ns_steps = 5.5"));
  // adjust_lr_fn: PyTorch's two names, exactly.
  CHECK(parse("optimizer: {type: Muon, params: {adjust_lr_fn: original}}\n").optimizer.adjust_lr_fn ==
        zero::MuonScale::original);
  REQUIRE_THROWS_WITH(
      parse("optimizer: {type: Muon, params: {adjust_lr_fn: match_rms}}\n"),
      Contains("optimizer.params.adjust_lr_fn = match_rms") && Contains("one of original, match_rms_adamw"));
  // SGD: Nesterov momentum is not implemented; false loads.
  REQUIRE_THROWS_WITH(parse("optimizer: {type: SGD, params: {momentum: 0.9, nesterov: true}}\n"),
                      Contains("optimizer.params.nesterov = true") && Contains("not implemented for SGD"));
  CHECK(parse("optimizer: {type: SGD, params: {nesterov: false}}\n").optimizer.type == zero::OptimizerType::sgd);
  // A missing type names them all.
  REQUIRE_THROWS_WITH(parse("optimizer: {params: {lr: 0.1}}\n"),
                      Contains("optimizer.type is missing") &&
                          Contains("AdamW, Adam, SGD, Lamb, Lion, Adafactor, Muon, OneBitAdam or OneBitLamb"));
}

TEST_CASE("to_yaml round-trips each optimizer's hyper-parameters", "[config][optimizer]") {
  const char* configs[] = {
      "optimizer: {type: Lamb, params: {bias_correction: false, max_coeff: 0.3, min_coeff: 0.02}}\n",
      "optimizer: {type: Lion, params: {betas: [0.95, 0.98]}}\n",
      "optimizer: {type: Adafactor, params: {beta1: 0.9, relative_step: true, warmup_init: true, eps2: 0.01}}\n",
      "optimizer: {type: Muon, params: {nesterov: false, ns_steps: 3, adjust_lr_fn: match_rms_adamw}}\n",
      "optimizer: {type: SGD, params: {momentum: 0.9, nesterov: false}}\n",
  };
  for (const char* text : configs) {
    INFO(text);
    const Config a = parse(text);
    const std::string yaml = a.to_yaml();
    INFO(yaml);
    const Config b = parse(yaml);
    CHECK(b.to_yaml() == yaml);
    CHECK(b.optimizer.type == a.optimizer.type);
    CHECK(b.optimizer.bias_correction == a.optimizer.bias_correction);
    CHECK(b.optimizer.max_coeff == a.optimizer.max_coeff);
    CHECK(b.optimizer.min_coeff == a.optimizer.min_coeff);
    CHECK(b.optimizer.beta1 == a.optimizer.beta1);
    CHECK(b.optimizer.beta2 == a.optimizer.beta2);
    CHECK(b.optimizer.adafactor_beta1 == a.optimizer.adafactor_beta1);
    CHECK(b.optimizer.relative_step == a.optimizer.relative_step);
    CHECK(b.optimizer.warmup_init == a.optimizer.warmup_init);
    CHECK(b.optimizer.eps2 == a.optimizer.eps2);
    CHECK(b.optimizer.ns_steps == a.optimizer.ns_steps);
    CHECK(b.optimizer.adjust_lr_fn == a.optimizer.adjust_lr_fn);
    CHECK(b.optimizer.momentum == a.optimizer.momentum);
    if (a.optimizer.type == zero::OptimizerType::muon) CHECK(b.optimizer.nesterov == a.optimizer.nesterov);
  }
}

TEST_CASE("integers accept 5e8 and reject 5.5", "[config]") {
  Config c = parse(
      "zero_optimization:\n  reduce_bucket_size: 5e8\n  allgather_bucket_size: 2.5e3\n"
      "  sub_group_size: 1000000.0\n");
  CHECK(c.zero_optimization.reduce_bucket_size == 500000000);
  CHECK(c.zero_optimization.allgather_bucket_size == 2500);
  CHECK(c.zero_optimization.sub_group_size == 1000000);
  REQUIRE_THROWS_WITH(parse("zero_optimization:\n  reduce_bucket_size: 5.5\n"),
                      Contains("zero_optimization.reduce_bucket_size = 5.5") && Contains("expected an integer") &&
                          Contains("not a whole number"));
  REQUIRE_THROWS_WITH(parse("train_batch_size: 5.5\n"),
                      Contains("train_batch_size = 5.5") && Contains("not a whole number"));
  REQUIRE_THROWS_WITH(parse("train_batch_size: 1e30\n"), Contains("too large"));
}

TEST_CASE("batch triple resolution", "[config]") {
  auto resolved = [](const std::string& text, int world) {
    Config c = parse(text);
    c.resolve(world);
    return c;
  };
  Config c = resolved("train_batch_size: 64\ntrain_micro_batch_size_per_gpu: 4\n", 4);
  CHECK(c.gradient_accumulation_steps == 4);
  CHECK(has_note(c, "gradient_accumulation_steps derived"));
  c = resolved("train_batch_size: 64\ngradient_accumulation_steps: 2\n", 4);
  CHECK(c.train_micro_batch_size_per_gpu == 8);
  c = resolved("train_micro_batch_size_per_gpu: 3\ngradient_accumulation_steps: 5\n", 2);
  CHECK(c.train_batch_size == 30);
  c = resolved("train_batch_size: 24\n", 3);
  CHECK(c.gradient_accumulation_steps == 1);
  CHECK(c.train_micro_batch_size_per_gpu == 8);
  c = resolved("train_micro_batch_size_per_gpu: 6\n", 2);
  CHECK(c.gradient_accumulation_steps == 1);
  CHECK(c.train_batch_size == 12);
  c = resolved("{}", 5);
  CHECK(c.train_micro_batch_size_per_gpu == 1);
  CHECK(c.gradient_accumulation_steps == 1);
  CHECK(c.train_batch_size == 5);
  CHECK(has_note(c, "batch: train_batch_size 5 = train_micro_batch_size_per_gpu 1"));
  c = resolved(
      "train_batch_size: auto\ntrain_micro_batch_size_per_gpu: 2\n"
      "gradient_accumulation_steps: auto\n",
      4);
  CHECK(c.train_batch_size == 8);
  CHECK(c.gradient_accumulation_steps == 1);
  c = resolved("train_batch_size: 32\ntrain_micro_batch_size_per_gpu: 4\ngradient_accumulation_steps: 2\n", 4);
  CHECK(c.notes.empty());  // nothing derived, nothing to say

  // Inconsistent: all four numbers in the message.
  Config bad = parse(
      "train_batch_size: 30\ntrain_micro_batch_size_per_gpu: 4\n"
      "gradient_accumulation_steps: 2\n");
  REQUIRE_THROWS_WITH(bad.resolve(4), Contains("inconsistent batch sizes") && Contains("train_batch_size=30") &&
                                          Contains("train_micro_batch_size_per_gpu=4") &&
                                          Contains("gradient_accumulation_steps=2") && Contains("world size=4") &&
                                          Contains("(= 32)"));
  Config indivisible = parse("train_batch_size: 30\ntrain_micro_batch_size_per_gpu: 4\n");
  REQUIRE_THROWS_WITH(indivisible.resolve(4), Contains("do not divide") && Contains("train_batch_size=30") &&
                                                  Contains("train_micro_batch_size_per_gpu=4") &&
                                                  Contains("gradient_accumulation_steps=auto") &&
                                                  Contains("world size=4"));
  Config odd = parse("train_batch_size: 10\n");
  REQUIRE_THROWS_WITH(odd.resolve(3), Contains("train_batch_size=10") && Contains("world size=3"));
  Config any = parse("{}");
  REQUIRE_THROWS_WITH(any.resolve(0), Contains("world size 0"));
}

TEST_CASE("contradictions are errors at load", "[config]") {
  REQUIRE_THROWS_WITH(
      parse("fp16:\n  enabled: true\nbf16:\n  enabled: true\n"),
      Contains("bf16.enabled") && Contains("fp16.enabled (test.yaml:2)") && Contains("choose one compute precision"));
  REQUIRE_THROWS_WITH(parse("zero_optimization:\n  stage: 2\n  offload_optimizer:\n    device: nvme\n"),
                      Contains("test.yaml:4") && Contains("zero_optimization.offload_optimizer.device") &&
                          Contains("nvme_path is not set"));
  REQUIRE_THROWS_WITH(parse("zero_optimization:\n  stage: 3\n  offload_param:\n    device: nvme\n"),
                      Contains("zero_optimization.offload_param.device") && Contains("nvme_path is not set"));
  REQUIRE_THROWS_WITH(parse("zero_optimization:\n  stage: 2\n  offload_param:\n    device: cpu\n"),
                      Contains("test.yaml:4") && Contains("zero_optimization.offload_param.device") &&
                          Contains("needs zero_optimization.stage 3, but stage is 2 (test.yaml:2)"));
  REQUIRE_THROWS_WITH(parse("zero_optimization:\n  offload_optimizer:\n    device: cpu\n"),
                      Contains("zero_optimization.offload_optimizer.device") && Contains("stage is 0"));
  REQUIRE_THROWS_WITH(
      parse("scheduler:\n  type: WarmupCosineLR\n  params:\n    warmup_num_steps: 100\n"
            "    total_num_steps: 50\n"),
      Contains("scheduler.params.total_num_steps = 50") && Contains("less than warmup_num_steps = 100"));
  REQUIRE_NOTHROW(parse("fp16:\n  enabled: true\nbf16:\n  enabled: false\n"));
}

TEST_CASE("nvme_path is created if missing and must be writable at resolve()", "[config]") {
  TempDir dir;
  auto nvme = [](const std::string& path) {
    return parse(
        "zero_optimization:\n  stage: 3\n  offload_param:\n    device: nvme\n"
        "    nvme_path: " +
        path + "\n");
  };
  Config ok = nvme(dir.path.string());
  REQUIRE_NOTHROW(ok.resolve(1));
  CHECK(std::filesystem::is_empty(dir.path));  // the probe file is gone

  // Missing: created, as DeepSpeed does (parents too).
  Config missing = nvme((dir.path / "new" / "swap").string());
  REQUIRE_NOTHROW(missing.resolve(1));
  CHECK(std::filesystem::is_directory(dir.path / "new" / "swap"));
  // Cannot be created: a path through a regular file.
  if (std::filesystem::is_regular_file("/etc/hostname")) {
    Config impossible = nvme("/etc/hostname/swap");
    REQUIRE_THROWS_WITH(impossible.resolve(1),
                        Contains("zero_optimization.offload_param.nvme_path") && Contains("cannot be created"));
  }

  Config file = nvme("/etc/hostname");
  if (std::filesystem::is_regular_file("/etc/hostname")) {
    REQUIRE_THROWS_WITH(file.resolve(1), Contains("is not a directory"));
  }

  // Not writable: a read-only directory; root ignores permission bits, so it gets /proc,
  // where nobody can create a file.
  std::string ro = dir.path.string() + "/ro";
  REQUIRE(::mkdir(ro.c_str(), 0555) == 0);
  Config locked = parse(
      "zero_optimization:\n  stage: 1\n  offload_optimizer:\n    device: nvme\n"
      "    nvme_path: " +
      (::geteuid() == 0 ? std::string("/proc") : ro) + "\n");
  REQUIRE_THROWS_WITH(locked.resolve(1),
                      Contains("zero_optimization.offload_optimizer.nvme_path") && Contains("not writable"));
}

TEST_CASE("overrides apply after the file and are validated the same way", "[config]") {
  Config c = parse("zero_optimization:\n  stage: 1\noptimizer:\n  type: AdamW\n  params:\n    lr: 0.1\n",
                   sets({"zero_optimization.stage=3", "optimizer.params.betas = [0.9,0.95]",
                         "zero_optimization.offload_param.device=cpu"}));
  CHECK(c.zero_optimization.stage == 3);
  CHECK(c.zero_optimization.offload_param.device == zero::OffloadDevice::cpu);
  CHECK(c.optimizer.beta2 == 0.95);
  CHECK(c.optimizer.lr == 0.1);

  // Unknown path: same did-you-mean, naming the override.
  REQUIRE_THROWS_WITH(parse("{}", sets({"zero_optimisation.stage=3"})),
                      Contains("--set zero_optimisation.stage=3") && Contains("did you mean 'zero_optimization'?"));
  REQUIRE_THROWS_WITH(
      parse("zero_optimization:\n  stage: 1\n", sets({"zero_optimization.stag=3"})),
      Contains("--set zero_optimization.stag=3") && Contains("did you mean 'zero_optimization.stage'?"));
  // Bad value: the override, not the file line, is blamed.
  REQUIRE_THROWS_WITH(parse("zero_optimization:\n  stage: 1\n", sets({"zero_optimization.stage=9"})),
                      Contains("--set zero_optimization.stage=9: zero_optimization.stage = 9") && Contains("0..3"));
  REQUIRE_THROWS_WITH(parse("{}", sets({"zero_optimization.stage"})),
                      Contains("--set zero_optimization.stage") && Contains("key.path=value"));
  REQUIRE_THROWS_WITH(parse("{}", sets({"zero_optimization..stage=1"})), Contains("empty part"));
  REQUIRE_THROWS_WITH(parse("steps_per_print: 5\n", sets({"steps_per_print.x=1"})),
                      Contains("steps_per_print is a value, not a section"));
  REQUIRE_THROWS_WITH(parse("{}", sets({"optimizer.params.betas=[0.9,"})),
                      Contains("--set optimizer.params.betas=[0.9,") && Contains("not valid YAML"));
  // The override sees the final state: SGD then rejects the file's betas.
  REQUIRE_THROWS_WITH(
      parse("optimizer:\n  type: AdamW\n  params:\n    betas: [0.9, 0.99]\n", sets({"optimizer.type=SGD"})),
      Contains("test.yaml:4") && Contains("optimizer.params.betas") && Contains("not SGD"));
}

TEST_CASE("auto values are resolved visibly", "[config]") {
  Config c = parse(R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
    "fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"},
    "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto",
      "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": 2e-4, "betas": "auto", "eps": "auto",
                  "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto",
                  "warmup_max_lr": "auto", "warmup_num_steps": "auto", "warmup_type": "auto",
                  "total_num_steps": "auto"}}})",
                   run_length(5000));
  CHECK(c.gradient_clipping == 0.0);
  CHECK_FALSE(c.fp16.enabled);
  CHECK_FALSE(c.bf16_enabled);
  CHECK(c.zero_optimization.reduce_bucket_size == 500000000);
  CHECK(c.optimizer.weight_decay == 0.01);
  CHECK(c.scheduler.warmup_max_lr == 2e-4);  // follows optimizer lr
  CHECK(c.scheduler.warmup_num_steps == 1000);
  CHECK(c.scheduler.total_num_steps == 5000);
  for (const char* n :
       {"gradient_clipping: \"auto\" -> 0", "fp16.enabled: \"auto\" -> false", "bf16.enabled: \"auto\" -> false",
        "zero_optimization.reduce_bucket_size: \"auto\" -> 500000000",
        "zero_optimization.stage3_param_persistence_threshold: \"auto\" -> 100000",
        "optimizer.params.eps: \"auto\" -> 1e-08",
        "optimizer.params.weight_decay: \"auto\" -> 0.01 (default for AdamW)",
        "scheduler.params.warmup_min_lr: \"auto\" -> 0",
        "scheduler.params.warmup_max_lr: \"auto\" -> 2e-04 (optimizer.params.lr)",
        "scheduler.params.warmup_num_steps: \"auto\" -> 1000", "scheduler.params.warmup_type: \"auto\" -> log",
        "scheduler.params.total_num_steps: \"auto\" -> 5000"}) {
    INFO(n);
    std::string all;
    for (const auto& line : c.notes) all += line + "\n";
    INFO(all);
    CHECK(has_note(c, n));
  }
  c.resolve(2);
  CHECK(c.train_batch_size == 2);
  CHECK(has_note(c, "no batch size given"));

  // Without the run length, total_num_steps "auto" cannot be filled in.
  REQUIRE_THROWS_WITH(parse("scheduler:\n  type: WarmupCosineLR\n  params:\n    total_num_steps: auto\n"),
                      Contains("scheduler.params.total_num_steps") && Contains("run length"));
  // Weight decay defaults per optimizer when absent.
  CHECK(parse("optimizer:\n  type: SGD\n").optimizer.weight_decay == 0.0);
  CHECK(parse("optimizer:\n  type: adamw\n").optimizer.weight_decay == 0.01);
  CHECK(parse("{}").optimizer.weight_decay == 0.01);
}

TEST_CASE("lr schedules follow DeepSpeed's formulas", "[config]") {
  const double pi = std::acos(-1.0);
  SECTION("no scheduler: constant optimizer lr") {
    Config c = parse("optimizer:\n  type: AdamW\n  params:\n    lr: 0.02\n");
    for (int s : {0, 1, 100, 100000}) CHECK(lr_at(c, s) == Approx(0.02));
    REQUIRE_THROWS_WITH(lr_at(c, -1), Contains("negative"));
  }
  SECTION("WarmupLR log") {
    Config c = parse(
        "scheduler:\n  type: WarmupLR\n  params:\n    warmup_min_lr: 0.001\n"
        "    warmup_max_lr: 0.01\n    warmup_num_steps: 100\n");
    for (int s : {0, 1, 9, 50, 99}) {
      double expect = 0.001 + (0.01 - 0.001) * std::log(s + 1.0) / std::log(100.0);
      CHECK(lr_at(c, s) == Approx(expect).epsilon(1e-12));
    }
    CHECK(lr_at(c, 100) == Approx(0.01));
    CHECK(lr_at(c, 5000) == Approx(0.01));
  }
  SECTION("WarmupLR linear ignores optimizer lr") {
    Config c = parse(
        "optimizer:\n  type: Adam\n  params:\n    lr: 0.5\n"
        "scheduler:\n  type: WarmupLR\n  params:\n    warmup_max_lr: 0.004\n"
        "    warmup_num_steps: 40\n    warmup_type: linear\n");
    for (int s : {0, 10, 20, 39}) CHECK(lr_at(c, s) == Approx(0.004 * s / 40.0).margin(1e-15));
    CHECK(lr_at(c, 40) == Approx(0.004));
  }
  SECTION("WarmupDecayLR") {
    Config c = parse(
        "scheduler:\n  type: WarmupDecayLR\n  params:\n    warmup_max_lr: 0.003\n"
        "    warmup_num_steps: 10\n    total_num_steps: 110\n    warmup_type: linear\n");
    CHECK(lr_at(c, 5) == Approx(0.003 * 5 / 10.0));
    CHECK(lr_at(c, 10) == Approx(0.003));  // (110 - 10) / (110 - 10)
    CHECK(lr_at(c, 60) == Approx(0.003 * (110 - 60) / 100.0));
    CHECK(lr_at(c, 109) == Approx(0.003 * 1 / 100.0));
    CHECK(lr_at(c, 110) == Approx(0.0).margin(1e-15));
    CHECK(lr_at(c, 500) == Approx(0.0).margin(1e-15));
  }
  SECTION("WarmupCosineLR") {
    Config c = parse(
        "optimizer:\n  type: AdamW\n  params:\n    lr: 0.006\n"
        "scheduler:\n  type: WarmupCosineLR\n  params:\n    warmup_min_ratio: 0.1\n"
        "    cos_min_ratio: 0.05\n    warmup_num_steps: 20\n    total_num_steps: 220\n");
    auto ratio_warm = [](double s) { return 0.1 + 0.9 * std::log(s + 1.0) / std::log(20.0); };
    auto ratio_cos = [&](double s) {
      double p = std::min(1.0, (s - 20.0 + 1.0) / 200.0);
      return 0.05 + 0.95 * (1.0 + std::cos(pi * p)) / 2.0;
    };
    for (int s : {0, 3, 19}) CHECK(lr_at(c, s) == Approx(0.006 * ratio_warm(s)));
    for (int s : {20, 21, 119, 200, 219}) CHECK(lr_at(c, s) == Approx(0.006 * ratio_cos(s)));
    CHECK(lr_at(c, 219) == Approx(0.006 * 0.05));   // the cosine's end
    CHECK(lr_at(c, 1000) == Approx(0.006 * 0.05));  // stays there
  }
  SECTION("a warmup shorter than 2 steps is 2 steps, as in DeepSpeed") {
    Config c = parse(
        "scheduler:\n  type: WarmupLR\n  params:\n    warmup_max_lr: 0.01\n"
        "    warmup_num_steps: 0\n    warmup_type: linear\n");
    CHECK(lr_at(c, 0) == Approx(0.0).margin(1e-15));
    CHECK(lr_at(c, 1) == Approx(0.005));
    CHECK(lr_at(c, 2) == Approx(0.01));
  }
}

TEST_CASE("to_yaml round-trips every setting", "[config]") {
  LoadOptions opts;
  opts.extra_sections = {"model", "run"};
  Config a = zero::load_config(data("gpt_run.yaml"), opts);
  std::string y = a.to_yaml();
  Config b = zero::parse_config(y, "round-trip", opts);
  CHECK(b.to_yaml() == y);
  // Defaults are in the text too.
  CHECK(y.find("stage3_max_reuse_distance: 1000000000") != std::string::npos);
  CHECK(y.find("train_batch_size: auto") != std::string::npos);
  CHECK(y.find("n_embd: 768") != std::string::npos);

  TempDir nvme;
  const LoadOptions local_nvme = sets({"zero_optimization.offload_optimizer.nvme_path=" + nvme.path.string(),
                                       "zero_optimization.offload_param.nvme_path=" + nvme.path.string()});
  for (const char* file : {"ds_config.json", "ds_config_stage3_nvme.json"}) {
    Config c = zero::load_config(data(file), local_nvme);
    std::string t = c.to_yaml();
    INFO(t);
    CHECK(zero::parse_config(t, "round-trip").to_yaml() == t);
    c.resolve(4);
    std::string r = c.to_yaml();
    Config d = zero::parse_config(r, "round-trip");
    CHECK(d.to_yaml() == r);
    d.resolve(4);
    CHECK(d.train_batch_size == c.train_batch_size);
    CHECK(d.to_yaml() == r);
  }
  Config cos = parse(
      "optimizer:\n  type: SGD\n  params:\n    lr: 0.1\n    momentum: 0.9\n"
      "scheduler:\n  type: WarmupCosineLR\n  params:\n    total_num_steps: 3000\n"
      "    warmup_type: linear\n    cos_min_ratio: 0.125\n");
  std::string t = cos.to_yaml();
  Config cos2 = zero::parse_config(t, "round-trip");
  CHECK(cos2.to_yaml() == t);
  CHECK(cos2.optimizer.momentum == 0.9);
  CHECK(cos2.scheduler.cos_min_ratio == 0.125);
  CHECK(lr_at(cos2, 1234) == lr_at(cos, 1234));
}

TEST_CASE("ManualLR leaves the rate to the loop: no schedule parameters, no rate from lr_at", "[config]") {
  Config c = parse("optimizer:\n  type: AdamW\nscheduler:\n  type: ManualLR\n");
  CHECK(c.scheduler.type == zero::SchedulerType::manual_lr);
  const std::string y = c.to_yaml();
  CHECK(y.find("type: ManualLR") != std::string::npos);
  CHECK(zero::parse_config(y, "round-trip").to_yaml() == y);
  REQUIRE_THROWS_WITH(lr_at(c, 0), Contains("ManualLR") && Contains("Engine::set_lr"));
  REQUIRE_THROWS_WITH(parse("scheduler:\n  type: ManualLR\n  params:\n    total_num_steps: 100\n"),
                      Contains("scheduler.params.total_num_steps") && Contains("does not apply to ManualLR"));
  REQUIRE_THROWS_WITH(parse("scheduler:\n  type: manuallr\n"), Contains("ManualLR"));
}

TEST_CASE("extra sections are kept for the application and read with StrictSection", "[config]") {
  LoadOptions opts;
  opts.extra_sections = {"model", "data", "run"};
  opts.overrides = {"model.n_layer=4", "run.eval_every=50"};
  Config c = zero::load_config(data("gpt_run.yaml"), opts);
  REQUIRE(c.extra_sections.count("model") == 1);
  REQUIRE(c.extra_sections.count("run") == 1);
  CHECK(c.extra_sections.count("data") == 0);  // absent in the file

  zero::StrictSection model = zero::extra_section(c, "model");
  CHECK(model.get_int("n_layer", 12, 1, 1024) == 4);  // overridden
  CHECK(model.get_int("n_head", 1, 1, 1024) == 12);
  CHECK(model.get_int("n_embd", 1, 1, 1 << 20) == 768);
  CHECK(model.get_double("dropout", 0.0, zero::Range::closed(0, 1)) == 0.0);
  // The typo in the file: did-you-mean, with the file's own line number.
  REQUIRE_THROWS_WITH(model.finish(), Contains("gpt_run.yaml:14") && Contains("unknown key 'model.dropuot'") &&
                                          Contains("did you mean 'model.dropout'?"));

  // A key created by --set is blamed on the --set.
  zero::StrictSection run = zero::extra_section(c, "run");
  CHECK(run.get_int("steps", 0, 1, 1 << 30) == 1000);
  CHECK(run.where("steps").find("gpt_run.yaml:16") != std::string::npos);
  REQUIRE_THROWS_WITH(run.finish(), Contains("--set run.eval_every=50") && Contains("unknown key 'run.eval_every'"));

  // An absent section reads as empty, so defaults apply.
  zero::StrictSection d = zero::extra_section(c, "data");
  CHECK(d.get_string("train", "shard_*.bin") == "shard_*.bin");
  REQUIRE_NOTHROW(d.finish());

  // A file section not declared by the application is unknown to libzero, with a suggestion.
  REQUIRE_THROWS_WITH(
      zero::load_config(data("gpt_run.yaml"), sections({"modle", "run"})),
      Contains("gpt_run.yaml:10") && Contains("unknown key 'model'") && Contains("did you mean 'modle'?"));
  REQUIRE_THROWS_WITH(parse("{}", sections({"fp16"})), Contains("libzero reads that key itself"));
}

TEST_CASE("StrictSection on its own", "[config]") {
  YAML::Node n = zero::parse_yaml("a: 5e3\nb: 0.25\nc: yes\nd: text\ne: RED\nf:\n  g: 1\nh: [1, 2, 3]\n", "app.yaml");
  zero::StrictSection s(n, "app", "app.yaml");
  CHECK(s.get_int("a", 0, 0, 10000) == 5000);
  CHECK(s.get_double("b", 0, zero::Range::closed_open(0, 1)) == 0.25);
  CHECK(s.get_bool("c", false));
  CHECK(s.get_string("d", "") == "text");
  CHECK(s.get_choice("e", "green", {"red", "green"}, true) == "red");
  CHECK(s.get_doubles("h", {}, 0) == std::vector<double>{1, 2, 3});
  CHECK(s.get_int("missing", 42) == 42);
  CHECK_FALSE(s.sub("missing2"));
  auto f = s.sub("f");
  REQUIRE(f);
  CHECK(f->key_path() == "app.f");
  CHECK(f->get_int("g", 0) == 1);
  CHECK(f->where("g") == "app.yaml:7");
  CHECK(f->where("absent") == "app.yaml:6");
  REQUIRE_NOTHROW(f->finish());
  REQUIRE_THROWS_WITH(s.fail("a", "is too big for this model"),
                      Contains("app.yaml:1: app.a is too big for this model"));
  REQUIRE_NOTHROW(s.finish());

  zero::StrictSection t(n, "app", "app.yaml");
  t.get_int("a", 0);
  REQUIRE_THROWS_WITH(t.finish(), Contains("app.yaml:2") && Contains("unknown key 'app.b'") &&
                                      Contains("also unknown here: c, d, e, f, h"));
  REQUIRE_THROWS_WITH(zero::StrictSection(zero::parse_yaml("[1, 2]", "x"), "app", "x.yaml"),
                      Contains("app is a list of 2") && Contains("expected a section"));
  REQUIRE_THROWS_WITH(zero::parse_yaml("a: [1, 2\nb: 3\n", "broken.yaml"),
                      Contains("broken.yaml:") && Contains("not valid YAML or JSON"));
  REQUIRE_THROWS_WITH(zero::parse_yaml("a: 1\n---\nb: 2\n", "two.yaml"),
                      Contains("two.yaml") && Contains("2 YAML documents"));
  CHECK(zero::Range::closed_open(0, 1).describe() == "in [0, 1)");
  CHECK(zero::Range::above(0).describe() == "> 0");
}

TEST_CASE("a missing file and a syntax error say where", "[config]") {
  REQUIRE_THROWS_WITH(zero::load_config("/nonexistent/x.yaml"),
                      Contains("/nonexistent/x.yaml") && Contains("cannot open"));
  REQUIRE_THROWS_WITH(parse("zero_optimization:\n  stage: [1\n"),
                      Contains("test.yaml:") && Contains("not valid YAML or JSON"));
  REQUIRE_THROWS_WITH(parse("- 1\n- 2\n"), Contains("top level is a list") && Contains("expected a section"));
  CHECK(parse("").zero_optimization.stage == 0);  // an empty file is all defaults
}
