// The training loop's calls per unit: gather, grads, reduce, and eval mode. Each checks the
// call against the micro-step schedule (so misuse is an error naming the unit, never a hang)
// and hands the work to the role that owns it.
#include <fmt/format.h>

#include <string>

#include "engine/engine_impl.hpp"
#include "zero/comm.hpp"
#include "zero/error.hpp"

namespace zero {

void EngineImpl::check_unit(int unit, const char* what) const {
  ZERO_CHECK(unit >= 0 && unit < layout_.num_units(),
             fmt::format("{}: unknown unit id {} (the layout has {} units, ids 0..{})", what, unit, layout_.num_units(),
                         layout_.num_units() - 1));
  ZERO_CHECK(initialized_, std::string(what) + ": parameters are not initialised; call Engine::init_params first");
}

void EngineImpl::set_eval(bool on) {
  ZERO_CHECK(!on || (micro_ == 0 && reducer_.reduced_this_micro() == 0 && !gatherer_.mid_micro_step()),
             "set_eval(true) in the middle of a training micro-step; evaluate between steps");
  ZERO_CHECK(on || !holding_model_,
             "set_eval(false) while a GatheredModel (Engine::gather_all) holds the model; release it first");
  eval_mode_ = on;
}

UnitParams EngineImpl::gather(int unit) {
  check_unit(unit, "gather");
  // Prefetch may run into the next micro-step only when one follows within this step: after the
  // last one, step() rewrites the slices and a gather started now would be thrown away.
  const bool next_micro_follows = micro_ + 1 < gas_;
  ParamGatherer::Lease l = gatherer_.acquire(unit, stage3_training(), next_micro_follows);
  return UnitParams(this, unit, l.data, l.token);
}

GatheredModel EngineImpl::gather_all() {
  ZERO_CHECK(initialized_, "gather_all: parameters are not initialised; call Engine::init_params first");
  ZERO_CHECK(!holding_model_, "gather_all: the model is already held by a GatheredModel; release it first");
  const bool was_eval = eval_mode_;
  set_eval(true);  // refuses the middle of a micro-step
  if (stage_ == 3) {
    gatherer_.hold_all();
  } else {
    // Nothing to gather, but gather_all is collective at every stage: one rank calling it alone
    // (to sample on rank 0) is the same bug here as at stage 3, where the all-gathers catch it,
    // and would pass until the run switched stage. A barrier lets the collective check name it.
    const CommSiteScope site("gather_all", nullptr, true);
    host_comm_.barrier();
  }
  holding_model_ = true;
  return GatheredModel(this, was_eval);
}

void EngineImpl::release_all(bool was_eval) {
  gatherer_.release_all();
  holding_model_ = false;
  eval_mode_ = was_eval;
}

void EngineImpl::check_training(const char* what) const {
  // A GatheredModel puts the engine in eval mode for its lifetime: name the handle, not the mode
  // the loop may never have set itself.
  ZERO_CHECK(!holding_model_,
             fmt::format("{}: a GatheredModel from Engine::gather_all() is still alive, and the engine stays in eval "
                         "mode while it is; release it (GatheredModel::release(), or end its scope) before training",
                         what));
  ZERO_CHECK(
      !eval_mode_,
      fmt::format("{}: the engine is in eval mode (set_eval(true)); call set_eval(false) before training", what));
}

void EngineImpl::release(int unit, std::uint64_t token) { gatherer_.release(unit, token, stage3_training()); }

UnitGrads EngineImpl::grads(int unit) {
  check_unit(unit, "grads");
  check_training("grads()");
  const UnitInfo& ui = layout_.unit(unit);
  ZERO_CHECK(reducer_.times_reduced(unit) == micro_,
             "grads(): unit '" + ui.name + "' was already reduced in this micro-step; ask for grads before reduce()");
  ZERO_CHECK(
      micro_ < gas_,
      fmt::format("grads(): all {} micro-steps of gradient_accumulation_steps are done; call step() first", gas_));
  return UnitGrads(&ui, reducer_.grads(unit), dtype_);
}

void EngineImpl::reduce(int unit) {
  check_unit(unit, "reduce");
  check_training("reduce()");
  const std::string& name = layout_.unit(unit).name;
  ZERO_CHECK(micro_ < gas_, fmt::format("reduce(): unit '{}' reduced after all {} micro-steps of "
                                        "gradient_accumulation_steps; call step() first",
                                        name, gas_));
  ZERO_CHECK(reducer_.times_reduced(unit) == micro_,
             fmt::format("reduce(): unit '{}' was reduced twice in micro-step {}; call reduce() once per unit per "
                         "micro-step",
                         name, micro_ + 1));
  const bool boundary = micro_ == gas_ - 1;
  if (audit_step()) audit_add(unit);
  if (!reducer_.ready(unit, boundary)) return;
  // Every unit is reduced: the micro-step is complete.
  if (stage_ == 3) gatherer_.finish_micro_step();
  ++micro_;
}

}  // namespace zero
