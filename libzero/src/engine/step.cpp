// The optimizer step, as step() reads: wait for the gradients, their global norm, overflow
// agreement, clipping, the update of every owned slice, the all-gather of the updated slices,
// then the loss-scale update and the reset for the next step.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>

#include <xxhash.h>

#include "engine/engine_impl.hpp"
#include "zero/error.hpp"

namespace zero {

// The stored gradients are the sum over gas micro-steps and world ranks (the collectives sum),
// each scaled by the loss scale: the average's 1/(gas x world), or the part of it that
// gradient_average leaves to libzero, joins the fp32 gradient scale here.
double EngineImpl::grad_denominator() const {
  const GradientAverage a = cfg_.gradient_average;
  const double steps = a == GradientAverage::steps_and_ranks ? gas_ : 1;
  // Local gradients are one rank's: the optimizer's exchange averages over the ranks.
  const double ranks = a == GradientAverage::none || local_gradients() ? 1 : dp_world_;
  return scaler_.scale() * steps * ranks;
}

bool EngineImpl::local_gradients() const { return !powersgd_ && optim_->local_gradients(applied_ + 1); }

void EngineImpl::follow_optimizer() {
  if (!powersgd_) reducer_.set_deferred(local_gradients());
}

// The norm of local gradients: each rank's whole gradient, the mean of their squared norms over
// the ranks (every rank then takes the same clip and overflow decision).
double EngineImpl::local_grad_sumsq() {
  backend_->stats_begin();
  const DType gt = reducer_.grad_dtype();
  for (int i = 0; i < layout_.num_units(); ++i)
    backend_->stats_add(reducer_.full(i), gt, static_cast<std::size_t>(shape(i).padded));
  const double mine = backend_->stats_finish();
  const CommSiteScope site("step() gradient norm");
  return all_ranks().all_reduce_scalar(mine, ReduceOp::sum) / dp_world_;
}

GradNorm EngineImpl::grad_norm() { return pre_step_norm("grad_norm()"); }

// Computed once per step, by grad_norm() or else by step().
GradNorm EngineImpl::pre_step_norm(const char* what) {
  check_step_ready(what);
  if (!sumsq_) {
    if (powersgd_) reduce_powersgd();
    reducer_.wait_all();
    reducer_.all_reduce_replicas();  // MiCS: the groups' sums into the data-parallel sum
    if (audit_step() && !local_gradients()) audit_check();
    sumsq_ = local_gradients() ? local_grad_sumsq() : global_grad_sumsq();
  }
  const bool overflow = !std::isfinite(*sumsq_);
  return GradNorm{overflow ? *sumsq_ : std::sqrt(*sumsq_) / grad_denominator(), overflow};
}

// PowerSGD reduces the padded full gradients in place (through a host copy on CUDA).
void EngineImpl::reduce_powersgd() {
  std::vector<void*> fulls;
  for (int i = 0; i < layout_.num_units(); ++i) fulls.push_back(reducer_.full(i));
  powersgd_->reduce(*backend_, fulls, step_, scaler_.scale());
}

StepResult EngineImpl::step(const StepOptions& opts) {
  const GradNorm norm = pre_step_norm("step()");
  sumsq_.reset();
  const bool overflow = norm.overflow;

  StepResult r;
  r.loss_scale = scaler_.scale();
  r.grad_norm = norm.norm;
  r.overflow = overflow;
  r.lr = next_lr();
  ZERO_CHECK(!std::isnan(r.lr),
             "step(): scheduler.type is ManualLR but the loop has not set a learning rate; call "
             "Engine::set_lr(lr) before the first step()");
  if (opts.clip_coefficient) {
    const double c = *opts.clip_coefficient;
    ZERO_CHECK(std::isfinite(c) && c >= 0.0,
               fmt::format("step(): StepOptions::clip_coefficient {} is not a finite number >= 0", c));
  }
  check_ranks_agree(r.lr, opts);
  ZERO_CHECK(opts.skip || !opts.skip_counts,
             "step(): StepOptions::skip_counts applies to a skipped step; set skip too");
  if (!overflow && opts.skip && opts.skip_counts) ++applied_;  // llm.c's count: t and the schedule move on
  if (!overflow && !opts.skip) {
    const double clip = opts.clip_coefficient ? *opts.clip_coefficient : clip_coefficient(r.grad_norm);
    const float grad_scale = static_cast<float>(clip / grad_denominator());
    ++applied_;
    update_owned_slices(StepHyper{r.lr, applied_, grad_scale});
    all_gather_updated();
  }
  // Gathered stage-3 units hold the old values (or were kept for reuse): drop them.
  gatherer_.drop_all("step()");
  reducer_.clear();
  follow_optimizer();  // applied_ counts this step now: the next one's gradients
  micro_ = 0;
  r.step = ++step_;
  r.skipped = overflow || opts.skip;
  const double old_scale = scaler_.scale();
  scaler_.update(overflow);  // throws when overflowing at the minimum scale
  // qgZ's error feedback is in loss-scaled units: follow a new scale; a skipped step's error
  // (of gradients thrown away; not finite after an overflow) is dropped.
  reducer_.adjust_error_feedback(r.skipped, scaler_.scale() / old_scale);
  return r;
}

bool EngineImpl::loop_sets_lr() const {
  return cfg_.scheduler.type == SchedulerType::none || cfg_.scheduler.type == SchedulerType::manual_lr;
}

void EngineImpl::set_lr(double lr) {
  ZERO_CHECK(loop_sets_lr(), fmt::format("set_lr: scheduler.type is {}, which sets the learning rate itself; use "
                                         "scheduler.type: ManualLR (or no scheduler) to set it from the loop",
                                         to_string(cfg_.scheduler.type)));
  ZERO_CHECK(std::isfinite(lr) && lr >= 0.0,
             fmt::format("set_lr: the learning rate {} is not a finite number >= 0", lr));
  loop_lr_ = lr;
}

double EngineImpl::next_lr() const {
  if (loop_lr_) return *loop_lr_;
  if (cfg_.scheduler.type == SchedulerType::manual_lr) return std::nan("");
  return lr_at(cfg_, applied_);
}

// What the loop decides for a step must be the same on every rank: a rank stepping at another
// rate, or skipping alone, would train a different model (or wait in an all-gather the others
// never start). One pair of scalar reductions compares a fingerprint of the decisions (their
// bit patterns).
void EngineImpl::check_ranks_agree(double lr, const StepOptions& opts) {
  if (dp_world_ == 1) return;
  const double decisions[3] = {lr, opts.skip ? (opts.skip_counts ? 2.0 : 1.0) : 0.0,
                               opts.clip_coefficient.value_or(-1.0)};
  const double fp = static_cast<double>(XXH3_64bits(decisions, sizeof decisions) >> 12);  // exact in a double
  const double hi = all_ranks().all_reduce_scalar(fp, ReduceOp::max);
  const double lo = -all_ranks().all_reduce_scalar(-fp, ReduceOp::max);
  ZERO_CHECK(lo == hi,
             fmt::format("step(): the ranks disagree on the learning rate, the skip or the clip "
                         "coefficient (this rank: lr {}, skip {}, clip coefficient {}); give "
                         "Engine::set_lr and StepOptions the same values on every rank (decide from "
                         "grad_norm(), which every rank shares)",
                         lr, opts.skip,
                         opts.clip_coefficient ? fmt::format("{}", *opts.clip_coefficient) : "from the config"));
}

void EngineImpl::check_step_ready(const char* what) const {
  ZERO_CHECK(initialized_, fmt::format("{}: parameters are not initialised; call Engine::init_params first", what));
  check_training(what);
  if (micro_ == gas_) return;
  std::string missing;
  for (int i = 0; i < layout_.num_units(); ++i)
    if (reducer_.times_reduced(i) == micro_) missing += (missing.empty() ? "" : ", ") + layout_.unit(i).name;
  ZERO_THROW(
      fmt::format("{} called before every unit was reduced: {} of {} micro-steps "
                  "(gradient_accumulation_steps) are complete; units not yet reduced in the current micro-step: {}",
                  what, micro_, gas_, missing));
}

// Global squared norm of the stored gradients. Stage 0 holds identical full gradients on every
// rank; otherwise the owned slices add up over the partition group. With MiCS every group holds
// the same slices (world / N copies of each): the sum over one group counts each element once,
// and the maximum over the replica group makes every group take the same norm (and the same
// overflow decision) bit for bit, whatever the replica all-reduce's rounding. Under model parallelism the parts of the
// model add up over the model group, a parameter replicated across the tensor group counted on its tensor rank 0 only,
// a copy marked norm_counted_elsewhere (a tied weight in two pipeline parts) only where it is not marked. An inf/nan
// on any rank makes the sum non-finite everywhere, so every rank agrees to skip.
double EngineImpl::global_grad_sumsq() {
  backend_->stats_begin();
  // The gradients the optimizer reads are in the accumulation dtype (data_types.grad_accum_dtype).
  const DType gt = reducer_.grad_dtype();
  const std::size_t ge = dtype_size(gt);
  for (int i = 0; i < layout_.num_units(); ++i) {
    const UnitShape& s = shape(i);
    const char* g = static_cast<const char*>(reducer_.owned(i));
    // The owned range, less the elements another rank of the model group counts: replicated
    // parameters off tensor rank 0, and copies held in another pipeline part too.
    std::int64_t pos = s.own_begin;
    const std::int64_t end = s.own_begin + s.own_len;
    if (model_comm_ != nullptr)
      for (const ParamInfo& p : layout_.unit(i).params) {  // in offset order
        const std::int64_t b = std::max(pos, p.offset), e = std::min(end, p.offset + p.numel);
        const bool elsewhere = (p.replicated && tensor_rank_ != 0) || p.norm_counted_elsewhere;
        if (!elsewhere || b >= e) continue;
        if (b > pos)
          backend_->stats_add(g + static_cast<std::size_t>(pos - s.own_begin) * ge, gt,
                              static_cast<std::size_t>(b - pos));
        pos = e;
      }
    if (pos < end)
      backend_->stats_add(g + static_cast<std::size_t>(pos - s.own_begin) * ge, gt,
                          static_cast<std::size_t>(end - pos));
  }
  double sumsq = backend_->stats_finish();
  const CommSiteScope site("step() gradient norm");
  if (stage_ > 0) sumsq = comm_.all_reduce_scalar(sumsq, ReduceOp::sum);
  if (model_comm_ != nullptr) sumsq = model_comm_->all_reduce_scalar(sumsq, ReduceOp::sum);
  if (mics_.replica) sumsq = mics_.replica->all_reduce_scalar(sumsq, ReduceOp::max);
  return sumsq;
}

double EngineImpl::clip_coefficient(double norm) const {
  if (cfg_.gradient_clipping <= 0.0) return 1.0;
  return std::min(1.0, cfg_.gradient_clipping / (norm + 1e-6));
}

// Every owned range, sub-group by sub-group as the optimizer store visits them, once per pass of
// the optimizer (its statistics combined between passes). Offloaded state is stepped by the host
// kernels; device backends then stage asynchronously (OffloadStaging): every owned gradient range
// starts its copy to pinned host memory now, sub-group-sized chunks in visiting order, so the
// host steps sub-group k while k+1 is still arriving. The staging buffers hold the whole owned
// range, so every pass of a multi-pass optimizer (Lamb, Adafactor, Muon) reads the gradients
// copied once; the last pass writes the parameters, which go back sub-group by sub-group.
// Parameter slices on NVMe are checked out one unit at a time (sub-groups come in unit order)
// and written back when the optimizer moves on; staging, whose ranges are declared up front,
// does not serve them (the CUDA backend refuses offload_param; the host backend imitating a
// device, ZERO_HOST_STAGING, steps them in place).
void EngineImpl::update_owned_slices(const StepHyper& h) {
  const bool params_on_nvme = cfg_.zero_optimization.offload_param.device != OffloadDevice::none;
  OffloadStaging* async_staging = opt_->on_host() && !params_on_nvme ? backend_->offload_staging() : nullptr;
  if (async_staging) {
    async_staging->begin(dtype_size(reducer_.grad_dtype()), esize(),
                         static_cast<std::size_t>(std::max<std::int64_t>(1, cfg_.zero_optimization.sub_group_size)));
    for (int i = 0; i < layout_.num_units(); ++i)
      async_staging->add(reducer_.owned(i), params_.owned(i), static_cast<std::size_t>(shape(i).own_len));
  }
  const bool local = !powersgd_ && optim_->local_gradients(h.step);  // h.step: this update, counted
  optim_->begin_step(h);
  const int passes = optim_->passes();
  auto visit = [&](int pass, bool last) {
    int checked_out = -1;
    opt_->for_each([&](int unit, std::int64_t begin, std::int64_t len, float* master, float* const* state) {
      if (unit != checked_out) {
        if (checked_out >= 0) params_.checkin(checked_out, last);
        params_.checkout(unit, true);
        checked_out = unit;
      }
      update_range(pass, unit, begin, len, master, state, async_staging);
    });
    if (checked_out >= 0) params_.checkin(checked_out, last);
  };
  if (optim_->wants_capture()) visit(-1, false);
  if (local) {
    std::vector<const void*> fulls;
    for (int i = 0; i < layout_.num_units(); ++i) fulls.push_back(reducer_.full(i));
    const CommSiteScope site("step() optimizer exchange");
    // Backend memory, as update_range hands the runs; offloaded state is host memory, where the
    // exchange runs too (the 1-bit optimizers offload on the host backend only: engine_setup.cpp).
    Backend* device = opt_->on_host() || backend_->host_accessible() ? nullptr : backend_.get();
    optim_->exchange(fulls, reducer_.grad_dtype(), device);
  }
  for (int pass = 0; pass < passes; ++pass) {
    const bool last = pass + 1 == passes;
    visit(pass, last);
    if (!last) {
      const CommSiteScope site("step() optimizer statistics");
      optim_->end_pass(pass);
    }
  }
  if (async_staging) async_staging->finish();  // the all-gather and the next forward wait on it
}

// One sub-group [begin, begin + len) of unit's owned range in pass `pass`: on the backend, or on
// the host (in place where the host can address backend memory, else through staging copies),
// cut into the optimizer's runs: parameters that agree on weight decay (Layout::set_decay; the
// runs without it get weight_decay 0), or for per-tensor optimizers each parameter's part in
// each partition slice, padding left out. The parameters are written in the last pass only.
void EngineImpl::update_range(int pass, int unit, std::int64_t begin, std::int64_t len, float* master,
                              float* const* state, OffloadStaging* async_staging) {
  const bool on_host = opt_->on_host();
  const bool last = pass + 1 == optim_->passes();
  // Gradients in the accumulation dtype, parameters in the compute dtype.
  const DType gt = reducer_.grad_dtype();
  const std::size_t ges = dtype_size(gt);
  const std::size_t n = static_cast<std::size_t>(len), bytes = n * esize(), grad_bytes = n * ges;
  const std::size_t r = static_cast<std::size_t>(unit), b = static_cast<std::size_t>(begin);
  const char* g = static_cast<const char*>(reducer_.owned(unit)) + b * ges;
  char* p = static_cast<char*>(params_.owned(unit)) + b * esize();
  // Where this path reads the gradient and writes the parameter.
  const bool copied = on_host && !async_staging && !backend_->host_accessible();
  if (on_host && async_staging) {
    g = static_cast<const char*>(async_staging->host_grads(r, b, n));
    p = static_cast<char*>(async_staging->host_params(r, b));
  } else if (copied) {
    if (staging_buf_.size() < grad_bytes + bytes) staging_buf_.resize(grad_bytes + bytes);
    backend_->to_host(staging_buf_.data(), static_cast<const void*>(g), grad_bytes);
    g = staging_buf_.data();
    p = staging_buf_.data() + grad_bytes;
  }
  char* const p_out = p;
  // Host memory (offloaded state, or the host backend's own) is stepped by the host kernels.
  Backend* device = on_host || backend_->host_accessible() ? nullptr : backend_.get();
  const UnitShape& us = shape(unit);
  auto step = [&](std::int64_t at, std::int64_t count, bool decay, const ParamInfo* param, int tensor,
                  std::int64_t param_at, int slice) {
    const std::size_t o = static_cast<std::size_t>(at - begin);
    OptimRun run;
    run.unit = unit;
    run.param = param;
    run.tensor = tensor;
    run.at = param_at;
    run.own_at = at;
    run.n = count;
    run.slice = slice;
    run.decay = decay;
    run.master = master + o;
    for (int k = 0; k < kMaxMoments; ++k) run.state[k] = state[k] ? state[k] + o : nullptr;
    run.grad = g + o * ges;
    run.grad_type = gt;
    run.param_out = last ? p + o * esize() : nullptr;
    run.param_type = dtype_;
    optim_->run(pass, run, device);
  };
  if (!optim_->per_tensor()) {
    for_each_decay_run(layout_.unit(unit), us, begin, len, [&](std::int64_t at, std::int64_t count, bool decay) {
      step(at, count, decay, nullptr, -1, 0, 0);
    });
  } else {
    const int first = unit_at(tensor_first_, unit);
    const auto& params = layout_.unit(unit).params;
    const std::int64_t lo = us.own_begin + begin, hi = lo + len;  // positions in the padded unit
    for (std::size_t k = 0; k < params.size(); ++k) {
      const ParamInfo& pi = params[k];
      std::int64_t from = std::max(lo, pi.offset);
      const std::int64_t to = std::min(hi, pi.offset + pi.numel);
      while (from < to) {  // cut at slice boundaries (stage 0 holds every slice)
        const int slice = static_cast<int>(from / us.slice);
        const std::int64_t end = std::min(to, static_cast<std::int64_t>(slice + 1) * us.slice);
        step(from - us.own_begin, end - from, pi.decay, &pi, first + static_cast<int>(k), from - pi.offset, slice);
        from = end;
      }
    }
  }
  if (!last) return;
  if (on_host && async_staging)
    async_staging->params_ready(r, b, n);
  else if (copied)
    backend_->from_host(static_cast<char*>(params_.owned(unit)) + b * esize(), p_out, bytes);
}

// Every rank updated only its slice of a full parameter buffer: all-gather the slices,
// allgather_bucket_size elements at a time. Each bucket is one communicator group (one NCCL
// launch), closed before its waits. Sharded units stay sharded: gather() rebuilds them.
void EngineImpl::all_gather_updated() {
  if (stage_ == 0) return;
  std::vector<Work> works;
  std::int64_t bucket = 0;
  std::optional<CommGroup> group;
  group.emplace(comm_);
  for (int i = 0; i < layout_.num_units(); ++i) {
    const UnitShape& u = shape(i);
    if (u.sharded_params) continue;
    const CommSiteScope site("step() all_gather of updated params", &layout_.unit(i).name);
    works.push_back(
        comm_.all_gather_async(params_.owned(i), params_.full(i), static_cast<std::size_t>(u.slice), dtype_));
    bucket += u.padded;
    if (bucket >= cfg_.zero_optimization.allgather_bucket_size) {
      group->end();
      for (auto& w : works) w.wait();
      works.clear();
      bucket = 0;
      group.emplace(comm_);
    }
  }
  group->end();
  for (auto& w : works) w.wait();
}

}  // namespace zero
