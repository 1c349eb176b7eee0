// The optimizer step: global gradient norm, overflow agreement, loss-scale update, clipping,
// the update of every owned slice, and the re-gathering of updated parameters.
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>

#include "engine_impl.hpp"
#include "optimizer_store.hpp"
#include "zero/error.hpp"
#include "zero/offload/host_adam.hpp"

namespace zero {

StepResult EngineImpl::step() {
  ZERO_CHECK(initialized_, "step(): parameters are not initialised; call Engine::init_params first");
  ZERO_CHECK(!eval_mode_, "step(): the engine is in eval mode; call set_eval(false) before training");
  if (micro_ < gas_) {
    std::string missing;
    for (int i = 0; i < layout_.num_units(); ++i)
      if (units_[static_cast<std::size_t>(i)].reduced == micro_) missing += (missing.empty() ? "" : ", ") + layout_.unit(i).name;
    ZERO_THROW("step() called before every unit was reduced: " + std::to_string(micro_) + " of " +
               std::to_string(gas_) + " micro-steps (gradient_accumulation_steps) are complete; units not yet reduced "
               "in the current micro-step: " + missing);
  }
  wait_in_flight(0);

  // 1. Global squared norm of the stored gradients (scaled by loss_scale x accumulation x world:
  //    the collectives sum, and the average's 1/world joins the fp32 gradient scale below).
  backend_->stats_begin();
  for (auto& u : units_) backend_->stats_add(own_grads(u), dtype_, static_cast<std::size_t>(u.own_len));
  double sumsq = backend_->stats_finish();
  // Stage 0 holds identical full gradients on every rank; otherwise slices add up. An inf/nan
  // on any rank makes the sum non-finite everywhere, so every rank agrees to skip.
  if (stage_ > 0) sumsq = comm_->all_reduce_scalar(sumsq, ReduceOp::sum);
  double scale = scaler_.scale();
  bool overflow = !std::isfinite(sumsq);
  double denom = scale * gas_ * comm_->size();
  double norm = overflow ? sumsq : std::sqrt(sumsq) / denom;

  StepResult r;
  r.loss_scale = scale;
  r.grad_norm = norm;
  r.lr = cfg_.lr_at(applied_);

  if (!overflow) {
    double clip = 1.0;
    if (cfg_.gradient_clipping > 0.0) {
      double c = cfg_.gradient_clipping / (norm + 1e-6);
      if (c < 1.0) clip = c;
    }
    float grad_scale = static_cast<float>(clip / denom);
    const auto& o = cfg_.optimizer;
    ++applied_;
    offload::AdamHyper adam{static_cast<float>(r.lr), static_cast<float>(o.beta1), static_cast<float>(o.beta2),
                            static_cast<float>(o.eps), static_cast<float>(o.weight_decay),
                            o.type == OptimizerType::adamw, applied_, grad_scale};
    offload::SgdHyper sgd{static_cast<float>(r.lr), static_cast<float>(o.momentum), static_cast<float>(o.weight_decay),
                          grad_scale, applied_ == 1};
    const bool sgd_type = o.type == OptimizerType::sgd;
    // Offloaded state is stepped by the host AdamW; where backend memory is not host memory,
    // each sub-group's gradients are staged to the host and its parameters copied back.
    const bool host_step = opt_->on_host();
    const bool staged = host_step && !backend_->host_accessible();
    // Device backends stage asynchronously (OffloadStaging): every owned gradient range starts
    // its copy to pinned host memory now, sub-group-sized chunks in visiting order, so the host
    // steps sub-group k while k+1 is still arriving; updated parameters go back the same way.
    OffloadStaging* async_stage = staged ? backend_->offload_staging() : nullptr;
    if (async_stage) {
      async_stage->begin(esize(), static_cast<std::size_t>(std::max<std::int64_t>(1, cfg_.zero_optimization.sub_group_size)));
      for (auto& u : units_) async_stage->add(own_grads(u), own_params_out(u), static_cast<std::size_t>(u.own_len));
    }
    // Parameter slices on NVMe are checked out one unit at a time (sub-groups come in unit
    // order) and written back when the optimizer moves on.
    int shard_unit = -1;
    opt_->for_each([&](int unit, std::int64_t begin, std::int64_t len, float* master, float* m1, float* m2) {
      Unit& u = units_[static_cast<std::size_t>(unit)];
      if (param_swap_ && unit != shard_unit) {
        if (shard_unit >= 0) checkin_shard(shard_unit, true);
        checkout_shard(unit, true);
        shard_unit = unit;
      }
      const std::size_t n = static_cast<std::size_t>(len), bytes = n * esize();
      const char* g = static_cast<const char*>(own_grads(u)) + static_cast<std::size_t>(begin) * esize();
      char* p = static_cast<char*>(own_params_out(u)) + static_cast<std::size_t>(begin) * esize();
      if (!host_step) {
        if (sgd_type) backend_->sgd(master, m1, g, dtype_, p, dtype_, n, sgd);
        else backend_->adam(master, m1, m2, g, dtype_, p, dtype_, n, adam);
        return;
      }
      if (async_stage) {
        const std::size_t ru = static_cast<std::size_t>(unit), b = static_cast<std::size_t>(begin);
        const void* gh = async_stage->host_grads(ru, b, n);
        void* ph = async_stage->host_params(ru, b);
        if (sgd_type) offload::sgd_step(master, m1, gh, dtype_, ph, dtype_, n, sgd);
        else offload::adam_step(master, m1, m2, gh, dtype_, ph, dtype_, n, adam);
        async_stage->params_ready(ru, b, n);
        return;
      }
      const void* gh = g;
      void* ph = p;
      if (staged) {
        if (stage_buf_.size() < 2 * bytes) stage_buf_.resize(2 * bytes);
        backend_->to_host(stage_buf_.data(), g, bytes);
        gh = stage_buf_.data();
        ph = stage_buf_.data() + bytes;
      }
      if (sgd_type) offload::sgd_step(master, m1, gh, dtype_, ph, dtype_, n, sgd);
      else offload::adam_step(master, m1, m2, gh, dtype_, ph, dtype_, n, adam);
      if (staged) backend_->from_host(p, ph, bytes);
    });
    if (shard_unit >= 0) checkin_shard(shard_unit, true);
    if (async_stage) async_stage->finish();  // the all-gather below and the next forward wait on it

    // 2. Every rank updated only its slice of a full parameter buffer: all-gather the slices,
    //    allgather_bucket_size elements at a time.
    //    Each bucket is one communicator group (one NCCL launch), closed before its waits.
    if (stage_ >= 1) {
      std::vector<Work> works;
      std::int64_t bucket = 0;
      std::optional<CommGroup> group;
      group.emplace(*comm_);
      for (auto& u : units_) {
        if (u.sharded_params) continue;
        works.push_back(comm_->all_gather_async(own_params_out(u), u.full_params.get(), static_cast<std::size_t>(u.slice), dtype_));
        bucket += u.padded;
        if (bucket >= cfg_.zero_optimization.allgather_bucket_size) {
          group->end();
          for (auto& w : works) w.wait();
          works.clear();
          bucket = 0;
          group.emplace(*comm_);
        }
      }
      group->end();
      for (auto& w : works) w.wait();
    }
  }
  // Gathered stage-3 units hold the old values (or were kept for reuse): drop them.
  drop_gathered();
  for (auto& u : units_) {
    if (stage_ <= 1)
      backend_->zero(u.full_grads.get(), static_cast<std::size_t>(u.padded) * esize());
    else
      backend_->zero(u.grad_slice.get(), static_cast<std::size_t>(u.slice) * esize());
    u.reduced = 0;
  }
  micro_ = 0;
  ++step_;
  r.step = step_;
  r.skipped = overflow;
  scaler_.update(overflow);  // throws when overflowing at the minimum scale
  return r;
}

}  // namespace zero
