// The configuration rules that need several keys at once (ConfigLoader::cross_checks): offload
// below its stage, PowerSGD above stage 1, fp16 and bf16 together, the accumulation dtype, the
// optimizer's and the scheduler's required keys, comm: nccl on the host backend.
#include <fmt/format.h>

#include <string>

#include "config/loader.hpp"
#include "runtime/strings.hpp"
#include "zero/config.hpp"
#include "zero/config_schema.hpp"

namespace zero {

// Rules that need several keys, each attempted on its own: one failing does not hide the next.
void ConfigLoader::cross_checks() {
  StrictSection& top = sections_.at("");
  auto check = [&](auto&& f) { attempt("", f); };
  const auto& z = cfg_.zero_optimization;
  for (const char* which : {"offload_optimizer", "offload_param"}) {
    check([&] {
      const auto& o = std::string(which) == "offload_param" ? z.offload_param.device : z.offload_optimizer.device;
      const auto& path =
          std::string(which) == "offload_param" ? z.offload_param.nvme_path : z.offload_optimizer.nvme_path;
      StrictSection* s = section(std::string("zero_optimization.") + which);
      if (s && o == OffloadDevice::nvme && path.empty()) {
        s->fail("device",
                "is nvme but nvme_path is not set; add nvme_path: <a directory on the "
                "NVMe drive> to this section, or use device: cpu");
      }
    });
  }
  StrictSection* zs = section("zero_optimization");
  // Only stage 3 partitions parameters, so only there is a parameter shard to move off the
  // GPU; an optimizer shard exists from stage 1 on.
  check([&] {
    if (zs && z.offload_param.device != OffloadDevice::none && z.stage < 3) {
      section("zero_optimization.offload_param")
          ->fail("device", fmt::format("= {} needs zero_optimization.stage 3, but stage is {} "
                                       "({}); parameter offload exists only at stage 3: set "
                                       "stage: 3 or offload_param.device: none",
                                       to_string(z.offload_param.device), z.stage, zs->where("stage")));
    }
  });
  check([&] {
    if (zs && z.offload_optimizer.device != OffloadDevice::none && z.stage == 0) {
      section("zero_optimization.offload_optimizer")
          ->fail("device", std::string("= ") + to_string(z.offload_optimizer.device) +
                               " needs zero_optimization.stage >= 1, but stage is 0 (" + zs->where("stage") +
                               "); set stage: 1 or higher, or offload_optimizer.device: none");
    }
  });
  // PowerSGD all-reduces low-rank factors of the whole gradient: stages 2 and 3 reduce-scatter
  // it, and the reduce-scatter of a product P Q^T does not exist (each rank would need all of
  // P and Q to form its slice, which is the all-reduce again).
  check([&] {
    const GradientCompressionConfig& g = cfg_.gradient_compression;
    if (g.type != CompressionType::powersgd) return;
    StrictSection* gs = section("gradient_compression");
    if (!gs) return;
    if (z.stage >= 2)
      gs->fail("type", fmt::format("= powersgd applies to zero_optimization.stage 0 and 1, but stage is {}{}: "
                                   "stages 2 and 3 reduce-scatter the gradient, and a low-rank product P Q^T "
                                   "cannot be reduce-scattered; use stage 0 or 1, or type: none",
                                   z.stage, zs ? " (" + zs->where("stage") + ")" : std::string()));
  });
  check([&] {
    if (cfg_.aio.block_size % 4096 != 0) {
      section("aio")->fail("block_size", fmt::format("= {} must be a multiple of 4096 (O_DIRECT transfers "
                                                     "are 4 KiB aligned)",
                                                     cfg_.aio.block_size));
    }
  });
  check([&] {
    if (cfg_.fp16.enabled && cfg_.bf16_enabled) {
      section("bf16")->fail("enabled", "is true and so is fp16.enabled (" + section("fp16")->where("enabled") +
                                           "); choose one compute precision: set one of them "
                                           "to false");
    }
  });
  // Gradients accumulate in fp32 or in the compute dtype; a third dtype would round every
  // micro-step's gradient twice.
  check([&] {
    const GradAccumDType g = cfg_.grad_accum_dtype;
    if (g == GradAccumDType::automatic || g == GradAccumDType::fp32) return;
    const DType want = g == GradAccumDType::fp16 ? DType::f16 : DType::bf16;
    StrictSection* d = section("data_types");
    if (want == cfg_.compute_dtype() || !d) return;
    d->fail("grad_accum_dtype",
            fmt::format("= {} but the compute dtype is {}; gradients accumulate in fp32 or in the compute "
                        "dtype: set it to fp32, or remove it",
                        to_string(g), dtype_name(cfg_.compute_dtype())));
  });
  // communication_data_type: the 16-bit compute dtype rounds fp32-accumulated gradients before
  // the stage 0/1 reduction; what the reductions cannot send is said in a note, as before the key
  // was honoured. fp32 next to the automatic accumulation dtype waits for resolve().
  check([&] {
    const CommDataType c = cfg_.communication_data_type;
    if (c == CommDataType::automatic) return;
    const DType d = cfg_.compute_dtype();
    const std::string head = "communication_data_type = " + std::string(to_string(c)) + ": handled differently here: ";
    const std::string compute(dtype_name(d));
    if (c != CommDataType::fp32) {
      if ((c == CommDataType::bf16) == (d == DType::bf16) && d != DType::f32) return;
      cfg_.notes.push_back(head + "gradients are reduced in the compute dtype (" + compute +
                           ") or, accumulated in fp32 at stages 0 and 1, in fp32 or the compute dtype; "
                           "only the compute dtype can be chosen");
      return;
    }
    if (d == DType::f32) return;
    if (cfg_.zero_optimization.stage >= 2) {
      cfg_.notes.push_back(head + "stages 2 and 3 reduce each micro-step's gradient in the compute dtype (" + compute +
                           "); stages 0 and 1 reduce in fp32 with data_types.grad_accum_dtype: fp32");
    } else if (cfg_.grad_accum_dtype != GradAccumDType::automatic && cfg_.grad_accum_dtype != GradAccumDType::fp32) {
      cfg_.notes.push_back(head + "gradients accumulate in " + compute +
                           " (data_types.grad_accum_dtype) and are reduced in it; set grad_accum_dtype: fp32 to "
                           "reduce in fp32");
    }
  });
  check([&] {
    StrictSection* o = top.has("optimizer") ? section("optimizer") : nullptr;
    if (o && !o->has("type")) {
      o->fail("type",
              "is missing; the optimizer section needs type: AdamW, Adam, SGD, Lamb, Lion, Adafactor, Muon, "
              "OneBitAdam or OneBitLamb");
    }
  });
  optimizer_checks();
  // The gradient audit compares exact sums: a lossy reduction differs from it by design.
  check([&] {
    StrictSection* ds = section("debug");
    if (!ds || cfg_.audit_interval == 0) return;
    std::string why;
    if (cfg_.gradient_compression.type != CompressionType::none)
      why = "gradient_compression (PowerSGD) reduces low-rank factors";
    else if (z.zero_quantized_gradients)
      why = "zero_quantized_gradients (qgZ) reduces quantized gradients";
    else if (compressed_momentum(cfg_.optimizer.type))
      why = std::string(to_string(cfg_.optimizer.type)) + " exchanges compressed momenta";
    if (!why.empty())
      ds->fail("audit_interval", fmt::format("= {} checks the reduced gradients against exact sums, but {}, which "
                                             "differ from them by design: set audit_interval: 0",
                                             cfg_.audit_interval, why));
  });
  check([&] { adam_mode_note(); });
  check([&] { scheduler_checks(top); });
  // The host backend always communicates over MPI, so comm: nccl next to backend: host would
  // be a setting with no effect: an error, not ignored.
  check([&] {
    if (top.has("comm") && cfg_.backend == BackendKind::host && cfg_.comm == CommKind::nccl) {
      const std::string how = top.has("backend") ? "set at " + top.where("backend") : "the default";
      top.fail("comm", "= nccl applies to backend: cuda, but backend is host (" + how +
                           "); the host backend always communicates over MPI: remove comm, or "
                           "set backend: cuda");
    }
  });
}

// The optimizer's hyper-parameters that constrain each other. Only keys read without error are
// compared (a failed one already has its message).
void ConfigLoader::optimizer_checks() {
  // OneBitAdam and OneBitLamb replace the gradient reduction with their compressed momentum
  // exchange, from each rank's whole local gradient to the rank that owns the slice: stages 1 and
  // 2, no other change to the reduction, and offloaded state on the host backend only.
  if (StrictSection* opt = section("optimizer");
      opt && !failed_.count("optimizer.type") && compressed_momentum(cfg_.optimizer.type)) {
    const auto& z = cfg_.zero_optimization;
    std::string why;
    if (z.stage == 0 || z.stage == 3)
      why = fmt::format(
          "runs at zero_optimization.stage 1 or 2 (stage is {}): its exchange starts from each rank's whole "
          "local gradient, which stage 3 does not keep, and ends at the rank that owns each slice, which stage 0 "
          "does not have",
          z.stage);
    else if (z.offload_optimizer.device != OffloadDevice::none && cfg_.backend == BackendKind::cuda)
      why = fmt::format(
          "with offload_optimizer.device {} runs on backend: host only: on cuda its compressed exchange works in "
          "device memory, from the gradients there, while offloaded state is stepped by the host kernels, and the "
          "two are not joined; use backend: host, or remove offload_optimizer",
          to_string(z.offload_optimizer.device));
    else if (cfg_.gradient_compression.type != CompressionType::none)
      why = "compresses the exchange itself: remove gradient_compression";
    else if (z.zero_quantized_gradients)
      why = "compresses the exchange itself: set zero_quantized_gradients: false";
    else if (z.mics_shard_size != -1)
      why = "exchanges over the whole data-parallel group: remove mics_shard_size";
    if (!why.empty())
      attempt("", [&] { opt->fail("type", fmt::format("= {} {}", to_string(cfg_.optimizer.type), why)); });
  }
  StrictSection* p = section("optimizer.params");
  if (!p || failed_.count("optimizer.type")) return;
  const OptimizerConfig& o = cfg_.optimizer;
  const auto given = [&](const char* key) {
    return p->has(key) && !failed_.count(std::string("optimizer.params.") + key);
  };
  auto check = [&](auto&& f) { attempt("", f); };
  // DeepSpeed's FusedLamb clamps the trust ratio into [min_coeff, max_coeff]; crossed bounds
  // would make the clamp's result depend on its order of tests.
  check([&] {
    if ((o.type != OptimizerType::lamb && o.type != OptimizerType::onebit_lamb) || o.min_coeff <= o.max_coeff) return;
    if (given("min_coeff"))
      p->fail("min_coeff", fmt::format("= {} is more than max_coeff = {}; the trust ratio is clamped into "
                                       "[min_coeff, max_coeff]: lower min_coeff or raise max_coeff",
                                       shortest_text(o.min_coeff), shortest_text(o.max_coeff)));
    if (given("max_coeff"))
      p->fail("max_coeff", fmt::format("= {} is less than min_coeff = {}; the trust ratio is clamped into "
                                       "[min_coeff, max_coeff]: raise max_coeff or lower min_coeff",
                                       shortest_text(o.max_coeff), shortest_text(o.min_coeff)));
  });
  if (o.type == OptimizerType::onebit_lamb) {
    // DeepSpeed's OneBitLamb takes bias_correction but never corrects: true would promise an
    // update this optimizer does not make.
    check([&] {
      if (given("bias_correction") && o.bias_correction)
        p->fail("bias_correction",
                "= true, but OneBitLamb moves without bias correction, as DeepSpeed's (which "
                "ignores the key): set false, or remove it");
    });
    check([&] {
      if (o.factor_min > o.factor_max)
        p->fail(given("factor_min") ? "factor_min" : "factor_max",
                fmt::format("factor_min = {} is more than factor_max = {}; the factor is clamped into [factor_min, "
                            "factor_max]: lower factor_min or raise factor_max",
                            shortest_text(o.factor_min), shortest_text(o.factor_max)));
    });
  }
  if (o.type == OptimizerType::adafactor) {
    // Hugging Face's Adafactor: warmup_init changes the relative step size, so it needs one; and
    // a relative step replaces lr ("Cannot combine manual lr and relative_step=True options").
    check([&] {
      if (o.warmup_init && !o.relative_step)
        p->fail("warmup_init",
                "= true needs relative_step: true (it warms up the relative step size, 1e-6 t); "
                "set relative_step: true, or remove warmup_init");
    });
    check([&] {
      if (o.relative_step && given("lr"))
        p->fail("lr", "is given and relative_step is true (" + p->where("relative_step") +
                          "): the relative step size min(1e-2, 1/sqrt(t)) replaces lr, as in Hugging Face's "
                          "Adafactor; remove lr, or set relative_step: false");
    });
    check([&] {
      StrictSection& top = sections_.at("");
      if (o.relative_step && top.has("scheduler"))
        p->fail("relative_step", "= true replaces the learning rate, so the scheduler (" + top.where("scheduler") +
                                     ") would have no effect; remove the scheduler section, or set "
                                     "relative_step: false");
    });
  }
  check([&] {
    if (o.type == OptimizerType::sgd && given("nesterov") && o.nesterov)
      p->fail("nesterov", "= true: Nesterov momentum is not implemented for SGD; set nesterov: false, or remove it");
  });
}

// DeepSpeed's type Adam decays decoupled unless adam_w_mode says otherwise, and its AdamW
// ignores adam_w_mode: libzero follows both rules and says so where the choice matters.
void ConfigLoader::adam_mode_note() {
  const OptimizerConfig& o = cfg_.optimizer;
  StrictSection* p = section("optimizer.params");
  const bool given = p && p->has("adam_w_mode");
  if (o.type == OptimizerType::adam && !given && o.weight_decay != 0.0) {
    cfg_.notes.push_back(
        "optimizer.type: Adam decays decoupled (AdamW-style), as DeepSpeed's adam_w_mode "
        "defaults to true; set optimizer.params.adam_w_mode: false to add the decay to the "
        "gradient instead");
  }
  if (o.type == OptimizerType::adamw && given && !o.adam_w_mode) {
    cfg_.notes.push_back(
        "optimizer.params.adam_w_mode: false has no effect with type AdamW (as in DeepSpeed): "
        "the decay stays decoupled; use type: Adam for decay added to the gradient");
  }
}

void ConfigLoader::scheduler_checks(StrictSection& top) {
  StrictSection* s = top.has("scheduler") ? section("scheduler") : nullptr;
  if (!s || failed_.count("scheduler.type")) return;
  const auto& c = cfg_.scheduler;
  if (!s->has("type")) {
    s->fail("type",
            "is missing; the scheduler section needs type: WarmupLR, WarmupDecayLR, "
            "WarmupCosineLR or ManualLR (or remove the section for a constant optimizer lr)");
  }
  StrictSection* p = section("scheduler.params");
  if (!p || c.type == SchedulerType::warmup_lr || c.type == SchedulerType::manual_lr ||
      failed_.count("scheduler.params.total_num_steps"))
    return;
  const std::string type = c.type == SchedulerType::warmup_decay_lr ? "WarmupDecayLR" : "WarmupCosineLR";
  if (!p->has("total_num_steps")) {
    p->fail("total_num_steps", "is missing; " + type +
                                   " decays over total_num_steps optimizer steps, so it needs "
                                   "the run length");
  }
  if (c.total_num_steps < c.warmup_num_steps) {
    p->fail("total_num_steps", fmt::format("= {} is less than warmup_num_steps = {}: the run would end inside the "
                                           "warmup; raise total_num_steps or shorten the warmup",
                                           c.total_num_steps, c.warmup_num_steps));
  }
}

}  // namespace zero
