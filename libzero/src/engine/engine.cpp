// zero::Engine's calls, forwarded to EngineImpl, and EngineImpl's whole-model operations outside
// the loop: init_params, full_master / full_params, the memory and traffic reports. Construction
// is in engine/engine_setup.cpp, the loop in engine/loop.cpp, the step in engine/step.cpp.
#include "zero/engine.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine_impl.hpp"
#include "runtime/log.hpp"
#include "zero/error.hpp"

namespace zero {

namespace {

// The first initial value of `unit` the run cannot hold, described; empty when every value fits.
// Not finite (NaN, an infinity), or beyond the parameter dtype's range: 3e38 is an fp32 value
// but rounds to infinity in fp16, and would train on infinities from step 1.
std::string first_unfit_value(const UnitInfo& unit, const std::vector<float>& full, DType dtype) {
  for (const auto& p : unit.params)
    for (std::int64_t k = 0; k < p.numel; ++k) {
      const float v = full[static_cast<std::size_t>(p.offset + k)];
      const bool finite = std::isfinite(v);
      // Past fp16's largest value (65504) the rounding decides; below it every dtype holds v.
      if (finite && (dtype == DType::f32 || std::fabs(v) <= 65504.0f || std::isfinite(round_to(dtype, v)))) continue;
      const std::string where =
          fmt::format("parameter '{}' of unit '{}' has the initial value {} at index {}", p.name, unit.name, v, k);
      return finite ? fmt::format(
                          "{}, which the run's {} parameters cannot hold (it rounds to infinity); give "
                          "values within their range or train in fp32",
                          where, dtype_name(dtype))
                    : fmt::format(
                          "{}, which is not finite; fix the initialiser, or the weights it reads "
                          "(model.init_from)",
                          where);
    }
  return {};
}

}  // namespace

void EngineImpl::init_params(const std::function<void(const ParamInfo&, std::span<float>)>& init) {
  std::vector<float> full;
  std::vector<char> staged;
  for (int i = 0; i < layout_.num_units(); ++i) {
    const UnitShape& u = shape(i);
    full.assign(static_cast<std::size_t>(u.padded), 0.0f);
    for (const auto& p : layout_.unit(i).params)
      init(p, std::span<float>(full.data() + p.offset, static_cast<std::size_t>(p.numel)));
    // Every rank must start from the same values; a rank-dependent initialiser would train
    // silently different models. One scalar all-reduce per unit checks it.
    const CommSiteScope site("init_params", &layout_.unit(i).name);
    // Before the comparison, which would read a NaN as a difference between ranks.
    const std::string unfit = first_unfit_value(layout_.unit(i), full, dtype_);
    const double unfit_ranks = all_ranks().all_reduce_scalar(unfit.empty() ? 0.0 : 1.0, ReduceOp::sum);
    if (unfit_ranks > 0)
      ZERO_THROW("init_params: " + (unfit.empty() ? fmt::format("unit '{}' got initial values that are not finite or "
                                                                "out of range on {} other rank(s); their messages "
                                                                "name the parameter",
                                                                layout_.unit(i).name, unfit_ranks)
                                                  : unfit));
    double sum = 0.0;
    for (std::size_t k = 0; k < full.size(); ++k)
      sum += static_cast<double>(full[k]) * static_cast<double>((k % 7) + 1);
    double lo = -all_ranks().all_reduce_scalar(-sum, ReduceOp::max);
    double hi = all_ranks().all_reduce_scalar(sum, ReduceOp::max);
    ZERO_CHECK(lo == hi, "init_params: unit '" + layout_.unit(i).name +
                             "' got different initial values on different ranks; seed the initialiser "
                             "identically on every rank");
    opt_->write_master(i, full.data() + u.own_begin);
    // Round on the host, then copy to wherever the backend keeps parameters.
    std::size_t n = static_cast<std::size_t>(u.param_elements());
    staged.resize(n * esize());
    convert(full.data() + (u.sharded_params ? u.own_begin : 0), DType::f32, staged.data(), dtype_, n);
    params_.checkout(i, false);
    backend_->from_host(u.sharded_params ? params_.shard(i) : params_.full(i), staged.data(), staged.size());
    params_.checkin(i, true);
  }
  initialized_ = true;
}

MemoryReport EngineImpl::memory() const {
  MemoryReport r;
  params_.report(r);
  reducer_.report(r);
  // PowerSGD's error buffers, Q and factor staging: buffers of the gradients' communication.
  if (powersgd_) r.comm_buffers += static_cast<std::int64_t>(powersgd_->buffer_bytes());
  opt_->report(r);
  r.optimizer_buffers = optim_->buffer_bytes();
  r.gathered = gatherer_.peak_bytes();
  r.secondary = gatherer_.secondary_bytes();
  if (const OffloadStaging* staging = backend_->offload_staging()) r.offload_staging = staging->host_bytes();
  r.offload_staging += static_cast<std::int64_t>(staging_buf_.size());
  return r;
}

TrafficBytes EngineImpl::traffic() const {
  TrafficBytes t = dp_comm_.traffic();  // device communicators' collectives count there too
  if (mics_.shard) {
    t += mics_.shard->traffic();
    t += mics_.replica->traffic();
  }
  if (hpz_comm_) t += hpz_comm_->traffic();
  if (qgz_) t += qgz_->traffic();
  if (model_comm_) t += model_comm_->traffic();
  return t;
}

std::vector<float> EngineImpl::full_master(int unit) {
  check_unit(unit, "full_master");
  const CommSiteScope site("full_master", &layout_.unit(unit).name);
  const UnitShape& u = shape(unit);
  std::vector<float> full(static_cast<std::size_t>(u.padded));
  opt_->read_master(unit, full.data() + u.own_begin);
  // `full` is host memory: gather it over the host (MPI) communicator, whatever the backend's
  // communicator is (NCCL takes device buffers only).
  if (stage_ > 0)
    host_comm_.all_gather(full.data() + u.own_begin, full.data(), static_cast<std::size_t>(u.slice), DType::f32);
  full.resize(static_cast<std::size_t>(u.numel));
  return full;
}

std::vector<float> EngineImpl::full_params(int unit) {
  check_unit(unit, "full_params");
  const CommSiteScope site("full_params", &layout_.unit(unit).name);
  const UnitShape& u = shape(unit);
  std::vector<float> full(static_cast<std::size_t>(u.padded));
  std::vector<char> host(static_cast<std::size_t>(u.padded) * esize());
  if (u.sharded_params) {
    Buffer gathered = backend_->alloc(host.size());
    params_.checkout(unit, true);
    comm_.all_gather(params_.shard(unit), gathered.get(), static_cast<std::size_t>(u.slice), dtype_);
    params_.checkin(unit, false);
    backend_->to_host(host.data(), gathered.get(), host.size());
  } else {
    backend_->to_host(host.data(), params_.full(unit), host.size());
  }
  convert(host.data(), dtype_, full.data(), DType::f32, full.size());
  full.resize(static_cast<std::size_t>(u.numel));
  return full;
}

std::string MemoryReport::to_string() const {
  // Two decimals: scripts compare the stages' model state against the ZeRO formula to 1%.
  auto b = [](std::int64_t n) { return format_bytes(static_cast<std::uint64_t>(n), 2); };
  const std::string qgz = qgz_buffers ? fmt::format(" (qgZ {})", b(qgz_buffers)) : "";
  std::string s =
      fmt::format("model state {} (params {}, grads {}, master {}, optimizer {}); buffers: comm {}{}, gathered {}",
                  b(model_state()), b(params), b(grads), b(master), b(optimizer), b(comm_buffers), qgz, b(gathered));
  if (secondary) s += fmt::format(", hpZ secondary {}", b(secondary));
  if (error_feedback) s += fmt::format(", qgZ error feedback {}", b(error_feedback));
  if (optimizer_buffers) s += fmt::format(", optimizer buffers {}", b(optimizer_buffers));
  if (offloaded_host) s += fmt::format("; offloaded to host {}", b(offloaded_host));
  if (offloaded_nvme) s += fmt::format("; on nvme {}", b(offloaded_nvme));
  if (offload_staging) s += fmt::format("; offload staging {}", b(offload_staging));
  return s;
}

// ---------------------------------------------------------------- Engine

Engine::Engine(Context& ctx, const Config& cfg, Layout layout)
    : impl_(std::make_unique<EngineImpl>(ctx, cfg, std::move(layout), nullptr)) {}
Engine::Engine(Context& ctx, const Config& cfg, Layout layout, ProcessGroups& groups)
    : impl_(std::make_unique<EngineImpl>(ctx, cfg, std::move(layout), &groups)) {}
Engine::~Engine() = default;
Engine::Engine(Engine&&) noexcept = default;
Engine& Engine::operator=(Engine&&) noexcept = default;

void Engine::init_params(const std::function<void(const ParamInfo&, std::span<float>)>& init) {
  impl_->init_params(init);
}
UnitParams Engine::gather(int unit) { return impl_->gather(unit); }
GatheredModel Engine::gather_all() { return impl_->gather_all(); }
TrafficBytes Engine::traffic() const { return impl_->traffic(); }
UnitGrads Engine::grads(int unit) { return impl_->grads(unit); }
void Engine::reduce(int unit) { impl_->reduce(unit); }
StepResult Engine::step() { return impl_->step({}); }
StepResult Engine::step(const StepOptions& opts) { return impl_->step(opts); }
GradNorm Engine::grad_norm() { return impl_->grad_norm(); }
void Engine::set_lr(double lr) { impl_->set_lr(lr); }
double Engine::lr() const { return impl_->next_lr(); }
Backend& engine_backend(Engine& e) { return e.impl_->backend(); }

void Engine::set_stream(void* stream) { impl_->backend().set_compute_stream(stream); }
void* Engine::stream() const { return impl_->backend().compute_stream(); }
std::unique_ptr<Communicator> Engine::device_comm(Communicator& group) { return impl_->backend().group_comm(group); }
void Engine::set_eval(bool on) { impl_->set_eval(on); }
bool Engine::eval() const { return impl_->eval(); }
float Engine::loss_scale() const { return impl_->loss_scale(); }
const Layout& Engine::layout() const { return impl_->layout(); }
const Config& Engine::config() const { return impl_->config(); }
int Engine::micro_step() const { return impl_->micro_step(); }
std::int64_t Engine::global_step() const { return impl_->global_step(); }
MemoryReport Engine::memory() const { return impl_->memory(); }
std::vector<float> Engine::full_master(int unit) { return impl_->full_master(unit); }
std::vector<float> Engine::full_params(int unit) { return impl_->full_params(unit); }

}  // namespace zero
