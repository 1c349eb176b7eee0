// Engine: ZeRO stages 0-3 for a hand-written training loop, driven per unit: gather(u), grads(u),
// reduce(u), then step(). Usage: docs/training-loop.md; design: docs/architecture.md.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zero/comm.hpp"
#include "zero/config.hpp"
#include "zero/dtype.hpp"
#include "zero/layout.hpp"

// The loop, per micro-step, then per step (docs/training-loop.md says what each call checks):
//
//   forward:  for u in units: { auto p = engine.gather(u); ...use p[i]... }   // scoped handle
//   backward: for u in reverse: { auto p = engine.gather(u); auto g = engine.grads(u);
//                                 ...add (+=) this micro-batch's gradient into g[i]...;
//                                 engine.reduce(u); }
//   engine.set_lr(lr);                // optional: the loop's own schedule (set_lr below)
//   GradNorm n = engine.grad_norm();  // optional: the norm before the update (collective)
//   StepResult r = engine.step();     // or step({.skip = true}), step({.clip_coefficient = c})
//
// The backward always *adds* into grads(u) (compute dtype), its gradients multiplied by
// loss_scale(), so a parameter used twice (tied embeddings) simply accumulates; the engine hands
// out zeroed storage when it must. Across micro-steps gradients sum in
// data_types.grad_accum_dtype; with fp32 each micro-step's grads(u) is zeroed storage that
// reduce(u) adds into fp32 storage. step() divides the sum over ranks and micro-steps as
// gradient_average says (docs/training-loop.md, Averaging); what each stage keeps per rank is in
// the same page's table.
//
// Threads: one thread at a time drives an engine (it is not thread-safe), but it need not be the
// thread that built it. With backend: cuda every call makes the engine's device current on the
// calling thread first (CUDA threads otherwise start on device 0), and leaves it current.

namespace zero {

class Context;
class Backend;
class ProcessGroups;
class EngineImpl;

// A view of one parameter's (or its gradient's) elements in the compute dtype.
struct TensorRef {
  void* data = nullptr;
  DType dtype = DType::f32;
  std::int64_t numel = 0;
  const ParamInfo* info = nullptr;

  float* f32() const;  // data as float*; throws unless dtype is fp32
  float get(std::int64_t i) const { return load_as_f32(data, static_cast<std::size_t>(i), dtype); }
  void set(std::int64_t i, float v) const { store_from_f32(data, static_cast<std::size_t>(i), dtype, v); }
  // data[i] += v, rounded once to the compute dtype.
  void add(std::int64_t i, float v) const { set(i, get(i) + v); }
};

// The full parameters of one unit, valid while the handle lives (stage 3 releases on destruction).
class UnitParams {
 public:
  UnitParams() = default;
  UnitParams(UnitParams&& o) noexcept;
  UnitParams& operator=(UnitParams&& o) noexcept;
  UnitParams(const UnitParams&) = delete;
  UnitParams& operator=(const UnitParams&) = delete;
  ~UnitParams();

  TensorRef operator[](int param) const;
  TensorRef operator[](std::string_view name) const;
  int unit() const { return unit_; }
  void* data() const { return data_; }  // the unit's flat storage (compute dtype)
  void release();                       // early release; the handle becomes empty

 private:
  friend class EngineImpl;
  UnitParams(EngineImpl* e, int unit, void* data, std::uint64_t token)
      : engine_(e), unit_(unit), data_(data), token_(token) {}
  EngineImpl* engine_ = nullptr;
  int unit_ = -1;
  void* data_ = nullptr;
  std::uint64_t token_ = 0;
};

// Where the backward adds one unit's gradients (compute dtype, same layout as UnitParams).
class UnitGrads {
 public:
  TensorRef operator[](int param) const;
  TensorRef operator[](std::string_view name) const;
  void* data() const { return data_; }

 private:
  friend class EngineImpl;
  UnitGrads(const UnitInfo* u, void* data, DType t) : unit_(u), data_(data), dtype_(t) {}
  const UnitInfo* unit_ = nullptr;
  void* data_ = nullptr;
  DType dtype_ = DType::f32;
};

// Every unit's full parameters, held on this rank while the handle lives (Engine::gather_all).
// Destroying it is local: no collective, so each rank releases when it is done.
class GatheredModel {
 public:
  GatheredModel() = default;
  GatheredModel(GatheredModel&& o) noexcept : engine_(o.engine_), was_eval_(o.was_eval_) { o.engine_ = nullptr; }
  GatheredModel& operator=(GatheredModel&& o) noexcept;
  GatheredModel(const GatheredModel&) = delete;
  GatheredModel& operator=(const GatheredModel&) = delete;
  ~GatheredModel() { release(); }
  void release();  // early release; the engine leaves eval mode unless it was in it before
  bool held() const { return engine_ != nullptr; }

 private:
  friend class EngineImpl;
  GatheredModel(EngineImpl* e, bool was_eval) : engine_(e), was_eval_(was_eval) {}
  EngineImpl* engine_ = nullptr;
  bool was_eval_ = false;
};

struct StepResult {
  std::int64_t step = 0;    // optimizer steps taken so far, skipped ones included
  bool skipped = false;     // no update anywhere: an overflow, or the loop asked (StepOptions::skip)
  bool overflow = false;    // an inf/nan in the gradients on some rank
  double grad_norm = 0.0;   // global L2 norm of the unscaled, averaged gradient (before clipping)
  double loss_scale = 1.0;  // scale used for this step's gradients
  double lr = 0.0;          // learning rate applied
};

// The gradient of the step about to be taken, as step() will see it (Engine::grad_norm).
struct GradNorm {
  double norm = 0.0;      // global L2 norm of the unscaled, averaged gradient; inf/nan on overflow
  bool overflow = false;  // an inf/nan on some rank: step() will skip whatever it is told
};

// What the loop tells step() (Engine::step(const StepOptions&)). Every rank must pass the same.
struct StepOptions {
  // No update: parameters, master weights and optimizer moments stay bit for bit, and so do
  // Adam's step count and the schedule's position; the step counter (global_step,
  // StepResult::step) advances and the gradients are discarded, as with DeepSpeed's fp16
  // overflow skip. The loss scaler sees the step as it was (it halves only on an overflow).
  bool skip = false;
  // With skip: the step still counts for the optimizer and the schedule, as llm.c's loop counts a
  // step whose update it skips: Adam's step count and the scheduler's position advance (the next
  // update uses t + 1 and the next rate); parameters and moments stay as they are.
  bool skip_counts = false;
  // Multiplies the averaged gradient instead of gradient_clipping's min(1, clip / (norm + 1e-6)),
  // for the loop's own clipping. Finite and >= 0.
  std::optional<double> clip_coefficient = std::nullopt;
};

// Bytes per rank by category. model_state() is what the ZeRO formula counts.
struct MemoryReport {
  std::int64_t params = 0;     // compute-dtype parameters kept between steps
  std::int64_t grads = 0;      // gradient storage kept between reduce and step (accumulation dtype)
  std::int64_t master = 0;     // fp32 master weights
  std::int64_t optimizer = 0;  // optimizer moments (Adam: m and v; SGD: momentum)
  // The two below count what their pools have held at most, freed buffers kept for reuse
  // included: the memory taken from the backend, not only the bytes in use at once.
  std::int64_t comm_buffers = 0;    // reduce/gather staging buffers
  std::int64_t qgz_buffers = 0;     // of comm_buffers: qgZ's packed messages and partial sums
  std::int64_t gathered = 0;        // full units gathered at stage 3
  std::int64_t secondary = 0;       // hpZ's secondary shards (zero_hpz_partition_size > 1)
  std::int64_t error_feedback = 0;  // qgZ's fp32 error-feedback buffers (zero_quantized_gradients)
  // The optimizer's own buffers beside its per-element state: OneBitAdam's and OneBitLamb's
  // exchange (errors, shared momentum, messages) and OneBitLamb's values per tensor.
  std::int64_t optimizer_buffers = 0;
  std::int64_t offloaded_host = 0;  // optimizer state held in host memory by the offload engine
  std::int64_t offloaded_nvme = 0;  // bytes kept on NVMe
  // Host memory that stages offloaded optimizer steps on a device backend (pinned): each owned
  // range's gradients and updated parameters, all of them at once, so that every pass of a
  // multi-pass optimizer reads the gradients copied once; or, where that staging cannot serve
  // (parameters offloaded), one sub-group's copy. Taken by the first step.
  std::int64_t offload_staging = 0;
  std::int64_t model_state() const { return params + grads + master + optimizer; }
  std::string to_string() const;
};

class Engine {
 public:
  // cfg must be resolved for ctx.world_size() (Config::resolve). The layout is fixed from here on.
  Engine(Context& ctx, const Config& cfg, Layout layout);
  // Under model parallelism (zero/groups.hpp): `layout` is this rank's part of the model; the
  // engine shards, reduces and steps over groups.data() (cfg resolved for groups.data_size()),
  // and the global gradient norm, clipping and the fp16 overflow decision span groups.model():
  // each rank's own parameters summed over it, replicated ones (Layout::set_replicated) counted
  // once, so every rank clips and skips alike. `groups` must outlive the engine. Either backend
  // (a CUDA backend's device communicator spans groups.data()); checkpoints hold one shard set
  // per grid position and resume on any grid (zero/checkpoint.hpp).
  // qgZ (zero_quantized_gradients) and PowerSGD refuse it so far, with a clear error.
  Engine(Context& ctx, const Config& cfg, Layout layout, ProcessGroups& groups);
  ~Engine();
  Engine(Engine&&) noexcept;
  Engine& operator=(Engine&&) noexcept;

  // Sets the initial parameters. init(param, values) fills the full fp32 values of one parameter
  // (param.unit and param.name say which) and must give the same values on every rank (seed
  // your generator identically).
  void init_params(const std::function<void(const ParamInfo&, std::span<float>)>& init);

  // Collective at stage 3: every rank gathers the same units in the same order (training and
  // eval alike); the collective check names the ranks' calls when they differ. Local at 0-2.
  UnitParams gather(int unit);
  UnitParams gather(std::string_view unit_name) { return gather(layout().find_unit(unit_name)); }
  // Collective (every rank calls it, between steps): gathers every unit's full parameters once
  // and holds them while the handle lives, in eval mode. Meanwhile gather() reads them locally
  // and issues no collective, so one rank alone may run forward passes (sampling or evaluating
  // on rank 0) while the others wait at their next collective. Costs the whole model in the
  // compute dtype at stage 3; at stages 0-2 the parameters are whole already and nothing moves
  // but a barrier, so a rank calling it alone is a collective mismatch at every stage.
  GatheredModel gather_all();
  // Local: where the backward adds unit's gradient (docs/training-loop.md, Averaging: what step()
  // divides the sum by).
  UnitGrads grads(int unit);
  // u's gradient is ready: this micro-step's backward has added all of it into grads(u). Queues
  // it for the reduction, collective once a bucket fills: every micro-step at stages 2 and 3, at
  // the step's last micro-step at stages 0 and 1 (under gradient_compression the step reduces
  // instead). Every rank reduces the same units in the same order; a micro-step's last unit
  // flushes what is pending.
  void reduce(int unit);
  // Collective at every stage (gradient norm, overflow agreement, updated slices).
  StepResult step();
  StepResult step(const StepOptions& opts);
  // Collective, after the last reduce() of a step and before step(): the global gradient norm
  // and the overflow flag, exactly what step() then reports (it reuses them). For the loop's
  // own decisions: skip an outlier step, clip its own way (StepOptions).
  GradNorm grad_norm();

  // The loop's own learning rate. set_lr(lr) sets the rate of the next step() and of every later
  // one until it is set again (as a PyTorch param group's lr): a schedule computed by the loop
  // calls it before each step(). Allowed when the config has no scheduler (it then replaces
  // optimizer.params.lr) or scheduler.type: ManualLR (then step() requires it); under a DeepSpeed
  // schedule (WarmupLR, ...) the schedule owns the rate and set_lr is an error. The rate reaches
  // the optimizer exactly as a schedule's does, on every backend, and StepResult::lr reports it.
  // Give every rank the same rate. save_checkpoint keeps it and load_checkpoint restores it.
  void set_lr(double lr);
  // The rate the next step() applies: the loop's, else the schedule's (NaN under ManualLR before
  // the first set_lr).
  double lr() const;

  // Forward-only passes (validation, sampling) between steps: gathers are neither recorded nor
  // checked against the training order and do not prefetch; grads() and reduce() are errors.
  void set_eval(bool on);
  bool eval() const;

  // CUDA backend: the stream the loop's kernels run on (a cudaStream_t; null = the legacy
  // default stream). Collectives wait for work enqueued on it and Work::wait() orders it.
  // The host backend has no streams and accepts only null.
  void set_stream(void* stream);
  void* stream() const;
  // Collective over `group`'s ranks (a host communicator over some of the job's ranks, e.g.
  // ProcessGroups::pipeline()): a communicator of the same ranks for buffers in the backend's
  // memory, for the loop's own transfers (a pipeline's activations). With backend: cuda one of
  // the backend's kind (NCCL, or MPI-staged for comm: mpi) on the engine's streams, so
  // Work::wait() orders stream() as the engine's own collectives do; its traffic is counted on
  // `group`. On the host backend null: `group` itself moves host memory. It must not outlive
  // the engine.
  std::unique_ptr<Communicator> device_comm(Communicator& group);

  float loss_scale() const;  // multiply the loss (the backward's seed gradient) by this
  const Layout& layout() const;
  const Config& config() const;
  int micro_step() const;  // micro-steps completed since the last step()
  std::int64_t global_step() const;
  MemoryReport memory() const;
  // Bytes this rank has sent in the engine's collectives so far, inside its node and across
  // nodes (zero/comm.hpp's ring model), over every communicator the engine uses.
  TrafficBytes traffic() const;

  // Collective: the full fp32 master value of one unit (padding excluded) on every rank.
  std::vector<float> full_master(int unit);
  // Collective: the full compute-dtype params of one unit widened to fp32, on every rank.
  std::vector<float> full_params(int unit);

 private:
  friend class EngineState;                   // zero/engine_state.hpp: the state checkpoints read and restore
  friend Backend& engine_backend(Engine& e);  // internal, for the backends' tests
  std::unique_ptr<EngineImpl> impl_;
};

}  // namespace zero
