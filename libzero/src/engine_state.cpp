// Checkpoint support (zero/engine_state.hpp): the engine state a checkpoint reads and restores.
//
// A checkpoint holds the fp32 master and the optimizer moments of each owned range, and the
// counters. The compute-dtype parameters are not saved: the optimizer always writes them as the
// master rounded to the compute dtype, so restoring recomputes them the same way and
// all-gathers the full copies the stage keeps, which makes a resumed run bit-identical.
#include "zero/engine_state.hpp"

#include <string>
#include <vector>

#include "engine_impl.hpp"
#include "zero/error.hpp"

namespace zero {

TrainingState EngineImpl::training_state() const { return TrainingState{step_, applied_, scaler_.state()}; }

void EngineImpl::check_between_steps(const char* what) const {
  ZERO_CHECK(micro_ == 0 && !reducer_.mid_micro_step() && !gatherer_.mid_micro_step(),
             std::string(what) + ": called in the middle of a step (" + std::to_string(micro_) + " of " +
                 std::to_string(gas_) + " micro-steps done, " + std::to_string(reducer_.reduced_this_micro()) +
                 " units reduced in the current one); call it right after step()");
  const int held = gatherer_.held_unit();
  ZERO_CHECK(held < 0, std::string(what) + ": unit '" + (held < 0 ? std::string() : layout_.unit(held).name) +
                           "' is still held by a UnitParams handle; release it first");
}

void EngineImpl::read_owned(int unit, int which, float* owned) const {
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
  gatherer_.drop_all("load_checkpoint");  // gathered stage-3 copies hold the old values
  std::vector<float> master;
  std::vector<char> rounded;
  for (int i = 0; i < layout_.num_units(); ++i) {
    const UnitShape& u = shape(i);
    master.resize(static_cast<std::size_t>(u.own_len));
    rounded.resize(static_cast<std::size_t>(u.own_len) * esize());
    opt_->read_master(i, master.data());
    // The host conversion rounds to nearest even, as the optimizer's param_out does.
    convert(master.data(), DType::f32, rounded.data(), dtype_, master.size());
    params_.checkout(i, false);
    backend_->from_host(params_.owned(i), rounded.data(), rounded.size());
    params_.checkin(i, true);
  }
  all_gather_updated();  // stage 0: every rank owns (and has just written) the whole unit
}

void EngineImpl::finish_restore(const TrainingState& s, bool restore_scaler) {
  refresh_params_from_master();
  step_ = s.step;
  applied_ = s.applied;
  if (restore_scaler) scaler_.set_state(s.scaler);
  initialized_ = true;
}

// ---------------------------------------------------------------- EngineState

EngineState::EngineState(Engine& engine) : impl_(engine.impl_.get()) {}
int EngineState::rank() const { return impl_->rank(); }
int EngineState::world_size() const { return impl_->world_size(); }
int EngineState::stage() const { return impl_->stage(); }
DType EngineState::compute_dtype() const { return impl_->dtype(); }
const Layout& EngineState::layout() const { return impl_->layout(); }
const Config& EngineState::config() const { return impl_->config(); }
Communicator& EngineState::host_comm() const { return impl_->context().comm(); }
bool EngineState::initialized() const { return impl_->initialized(); }
std::int64_t EngineState::slice(int unit) const { return impl_->shape(unit).slice; }
OwnedRange EngineState::owned_range(int unit) const {
  const UnitShape& s = impl_->shape(unit);
  return OwnedRange{s.own_begin, s.own_len};
}
int EngineState::optimizer_moments() const { return impl_->optimizer_moments(); }
bool EngineState::loss_scale_dynamic() const { return impl_->loss_scale_dynamic(); }
TrainingState EngineState::training_state() const { return impl_->training_state(); }
std::int64_t EngineState::unit_all_gathers() const { return impl_->unit_all_gathers(); }
void EngineState::check_between_steps(const char* what) const { impl_->check_between_steps(what); }
void EngineState::read_owned(int unit, int which, float* owned) const { impl_->read_owned(unit, which, owned); }
void EngineState::write_owned(int unit, int which, const float* owned) { impl_->write_owned(unit, which, owned); }
void EngineState::begin_restore() { impl_->begin_restore(); }
void EngineState::finish_restore(const TrainingState& s, bool restore_scaler) { impl_->finish_restore(s, restore_scaler); }

}  // namespace zero
