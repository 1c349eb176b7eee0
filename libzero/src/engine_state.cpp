// Checkpoint support: the engine state a checkpoint reads and restores.
//
// A checkpoint holds the fp32 master and the optimizer moments of each owned range, and the
// counters. The compute-dtype parameters are not saved: the optimizer always writes them as the
// master rounded to the compute dtype, so restoring recomputes them the same way and
// all-gathers the full copies the stage keeps, which makes a resumed run bit-identical.
#include <string>
#include <vector>

#include "engine_impl.hpp"
#include "optimizer_store.hpp"
#include "zero/error.hpp"

namespace zero {

EngineImpl::TrainingState EngineImpl::training_state() const {
  return TrainingState{step_, applied_, scaler_.state()};
}

void EngineImpl::check_between_steps(const char* what) const {
  ZERO_CHECK(micro_ == 0 && reduced_this_micro_ == 0 && pos_ == 0 && pending_.empty(),
             std::string(what) + ": called in the middle of a step (" + std::to_string(micro_) + " of " +
                 std::to_string(gas_) + " micro-steps done, " + std::to_string(reduced_this_micro_) +
                 " units reduced in the current one); call it right after step()");
  for (std::size_t i = 0; i < units_.size(); ++i)
    ZERO_CHECK(units_[i].refs == 0, std::string(what) + ": unit '" + layout_.unit(static_cast<int>(i)).name +
                                        "' is still held by a UnitParams handle; release it first");
}

int EngineImpl::optimizer_moments() const { return opt_->moments(); }

void EngineImpl::read_owned(int unit, int which, float* owned) {
  if (which == 0) opt_->read_master(unit, owned);
  else opt_->read_moment(unit, which - 1, owned);
}

void EngineImpl::write_owned(int unit, int which, const float* owned) {
  if (which == 0) opt_->write_master(unit, owned);
  else opt_->write_moment(unit, which - 1, owned);
}

void EngineImpl::begin_restore() {
  check_between_steps("load_checkpoint");
  // Until the restore completes, a failed load must not leave a half-loaded model trainable.
  initialized_ = false;
}

void EngineImpl::refresh_params_from_master() {
  drop_gathered();  // gathered stage-3 copies hold the old values
  std::vector<float> master;
  std::vector<char> rounded;
  for (int i = 0; i < layout_.num_units(); ++i) {
    Unit& u = units_[static_cast<std::size_t>(i)];
    master.resize(static_cast<std::size_t>(u.own_len));
    rounded.resize(static_cast<std::size_t>(u.own_len) * esize());
    opt_->read_master(i, master.data());
    // The host conversion rounds to nearest even, as the optimizer's param_out does.
    convert(master.data(), DType::f32, rounded.data(), dtype_, master.size());
    checkout_shard(i, false);
    backend_->from_host(own_params_out(u), rounded.data(), rounded.size());
    checkin_shard(i, true);
  }
  if (stage_ == 0) return;  // every rank owns (and has just written) the whole unit
  for (auto& u : units_)
    if (!u.sharded_params)
      comm_->all_gather(own_params_out(u), u.full_params.get(), static_cast<std::size_t>(u.slice), dtype_);
}

void EngineImpl::finish_restore(const TrainingState& s, bool restore_scaler) {
  refresh_params_from_master();
  step_ = s.step;
  applied_ = s.applied;
  if (restore_scaler) scaler_.set_state(s.scaler);
  initialized_ = true;
}

}  // namespace zero
