// Checkpoint support (zero/engine_state.hpp): the engine state a checkpoint reads and restores.
//
// A checkpoint holds the fp32 master and the optimizer moments of each owned range, and the
// counters. The compute-dtype parameters are not saved: the optimizer always writes them as the
// master rounded to the compute dtype, so restoring recomputes them the same way and
// all-gathers the full copies the stage keeps, which makes a resumed run bit-identical.
#include "zero/engine_state.hpp"

#include <fmt/format.h>

#include <string>
#include <vector>

#include "engine/engine_impl.hpp"
#include "zero/error.hpp"

namespace zero {

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

EngineState::EngineState(Engine& engine) : impl_(engine.impl_.get()) {}

int EngineState::rank() const { return impl_->rank_; }
int EngineState::world_size() const { return impl_->world_; }
int EngineState::stage() const { return impl_->stage_; }
DType EngineState::compute_dtype() const { return impl_->dtype_; }
const Layout& EngineState::layout() const { return impl_->layout_; }
const Config& EngineState::config() const { return impl_->cfg_; }
bool EngineState::writes_shards() const { return impl_->dp_comm_.rank() < impl_->world_; }
Communicator& EngineState::host_comm() const { return impl_->dp_comm_; }
bool EngineState::model_parallel() const { return impl_->model_comm_ != nullptr; }
ProcessGroups* EngineState::groups() const { return impl_->groups_; }
Communicator& EngineState::world_comm() const { return impl_->ctx_.comm(); }
bool EngineState::initialized() const { return impl_->initialized_; }
std::int64_t EngineState::slice(int unit) const { return impl_->shape(unit).slice; }
OwnedRange EngineState::owned_range(int unit) const {
  const UnitShape& s = impl_->shape(unit);
  return OwnedRange{s.own_begin, s.own_len};
}
int EngineState::optimizer_moments() const { return impl_->opt_->moments(); }
bool EngineState::loss_scale_dynamic() const { return impl_->scaler_.dynamic(); }
TrainingState EngineState::training_state() const {
  return TrainingState{impl_->step_, impl_->applied_, impl_->scaler_.state(), impl_->loop_lr_};
}
std::int64_t EngineState::unit_all_gathers() const { return impl_->gatherer_.all_gathers(); }

void EngineState::check_between_steps(const char* what) const {
  const EngineImpl& e = *impl_;
  ZERO_CHECK(e.micro_ == 0 && !e.reducer_.mid_micro_step() && !e.gatherer_.mid_micro_step(),
             fmt::format("{}: called in the middle of a step ({} of {} micro-steps done, {} units reduced in the "
                         "current one); call it right after step()",
                         what, e.micro_, e.gas_, e.reducer_.reduced_this_micro()));
  const int held = e.gatherer_.held_unit();
  ZERO_CHECK(held < 0, std::string(what) + ": unit '" + (held < 0 ? std::string() : e.layout_.unit(held).name) +
                           "' is still held by a UnitParams handle; release it first");
}

void EngineState::read_owned(int unit, int which, float* owned) const {
  if (which == 0)
    impl_->opt_->read_master(unit, owned);
  else
    impl_->opt_->read_moment(unit, which - 1, owned);
}

void EngineState::write_owned(int unit, int which, const float* owned) {
  if (which == 0)
    impl_->opt_->write_master(unit, owned);
  else
    impl_->opt_->write_moment(unit, which - 1, owned);
}

std::string EngineState::rank_state_kind() const {
  if (impl_->powersgd_) return "powersgd";
  return impl_->qgz_ ? "qgz" : impl_->optim_->rank_state_kind();
}

std::string EngineState::rank_state_layout() const {
  const QuantizedReduceScatter* q = impl_->qgz_.get();
  if (!q) return *impl_->optim_->rank_state_kind() ? impl_->optim_->name() : "";
  return fmt::format("{} nodes x {} ranks, block {}", q->nodes(), q->ranks_per_node(), q->block());
}

std::vector<float> EngineState::rank_state() const {
  if (impl_->powersgd_) return impl_->powersgd_->state();
  if (!impl_->qgz_) return impl_->optim_->rank_state();
  return impl_->reducer_.error_feedback();
}

std::size_t EngineState::rank_state_size() const {
  if (impl_->powersgd_) return impl_->powersgd_->state_size();
  if (!impl_->qgz_) return impl_->optim_->rank_state_size();
  return impl_->reducer_.error_feedback_size();
}

void EngineState::set_rank_state(const std::vector<float>& s) {
  ZERO_CHECK(!rank_state_kind().empty() || s.empty(),
             "set_rank_state: the engine keeps no per-rank state (no gradient_compression, no "
             "zero_quantized_gradients, no 1-bit optimizer)");
  if (impl_->powersgd_) {
    impl_->powersgd_->set_state(s);  // empty: reset
    return;
  }
  if (!impl_->qgz_) {
    impl_->optim_->set_rank_state(s);
    return;
  }
  impl_->reducer_.set_error_feedback(s);
}

std::map<std::string, std::vector<double>> EngineState::tensor_records() const {
  return impl_->optim_->tensor_records();
}

void EngineState::set_tensor_records(const std::map<std::string, std::vector<double>>& r) {
  impl_->optim_->restore_tensor_records(r);
}

void EngineState::begin_restore() {
  check_between_steps("load_checkpoint");
  // Until the restore completes, a failed load must not leave a half-loaded model trainable.
  impl_->initialized_ = false;
}

void EngineState::finish_restore(const TrainingState& s, bool restore_scaler) {
  impl_->refresh_params_from_master();
  impl_->step_ = s.step;
  impl_->applied_ = s.applied;
  impl_->optim_->restored();
  impl_->follow_optimizer();
  if (restore_scaler) impl_->scaler_.set_state(s.scaler);
  if (impl_->loop_sets_lr()) impl_->loop_lr_ = s.lr;
  impl_->initialized_ = true;
}

}  // namespace zero
