// bench_engine_overhead: what does the ZeRO engine cost a training step on the GPU? The GPT
// example's model (GptModel on CudaOps, bf16, gpt2-medium by default: 355M parameters, seq 1024)
// is trained on random tokens two ways, in one process:
//
//   bare    the same kernels with no engine: parameters, gradients, fp32 master weights and
//           Adam moments in plain device buffers; the gradient norm and the AdamW update are
//           the CUDA backend's own launchers (kernels.hpp) called directly, over the same weight
//           decay runs, one launch per run. With several ranks, one NCCL all-reduce of all
//           gradients after the backward (plain data parallelism, no overlap).
//   stage S zero::Engine at ZeRO stage S (0-3), overlap_comm on and off, driven exactly as
//           GptTrainer::run_micro_batch drives it: gather / grads / reduce per unit, then step().
//
// Both run one micro-step per optimizer step with gradient clipping at 1.0 and AdamW (fp32 master,
// bf16 parameters), so they launch the same model kernels and the same optimizer arithmetic; what
// differs is the engine's bookkeeping, copies and collectives. A step is timed on the host from
// the batch upload until the device is idle after the update (each step ends with a device
// synchronize, in both loops); the median over --steps after --warmup steps is reported, with
// its ratio to bare and to stage 0 at the same overlap setting. Goal (one GPU): stages 1 and 2 at
// most 3% over stage 0, stage 3 at most 10%.
//
// Memory: "mem" is the device memory the variant added on top of the model's activations
// (cudaMemGetInfo, the largest after any step, minus before the variant was built); "state" is
// the engine's MemoryReport (parameters, gradients, master, moments) plus its communication and
// gathered buffers, or the bare loop's buffers.
//
// Run: bench_engine_overhead [--preset gpt2-medium] [--micro-batch 8] [--steps 10]
//      mpirun -n <GPUs> bench_engine_overhead      (NCCL, one GPU per rank; rank 0 prints)
// Needs a CUDA device (exit 77 without one).
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "cuda/cuda_check.hpp"
#include "cuda/kernels.hpp"
#include "gpt/cuda/cuda_ops.hpp"
#include "cuda_probe.hpp"
#include "timing.hpp"
#include "gpt/gpt_config.hpp"
#include "gpt/gpt_model.hpp"
#include "engine/unit_shape.hpp"
#include "zero/comm.hpp"
#include "zero/config.hpp"
#include "zero/context.hpp"
#include "zero/dtype.hpp"
#include "zero/engine.hpp"
#include "zero/error.hpp"
#include "zero/optim.hpp"

using namespace zero;
using namespace zero::gpt;

namespace {

using zero::bench::median;
using zero::bench::now_s;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kClip = 1.0;

std::size_t device_used() {
  std::size_t free = 0, total = 0;
  ZERO_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return total - free;
}

struct Options {
  std::string preset = "gpt2-medium";
  int n_layer = 0, n_head = 0, n_embd = 0;
  int seq_len = 1024;
  int micro_batch = 8;
  bool checkpointing = false;
  std::vector<int> stages{0, 1, 2, 3};
  std::vector<std::string> overlap{"on", "off"};
  int steps = 10, warmup = 3;
  std::string comm = "nccl";
  double reduce_bucket = 0;  // 0: the config's default
};

Config make_config(const Options& o, int stage, bool overlap, int world) {
  std::string y;
  y += "backend: cuda\ncomm: " + o.comm + "\n";
  y += "train_micro_batch_size_per_gpu: " + std::to_string(o.micro_batch) + "\n";
  y += "gradient_accumulation_steps: 1\n";
  y += "gradient_clipping: 1.0\n";
  y += "bf16:\n  enabled: true\n";
  y += "optimizer:\n  type: AdamW\n  params:\n    lr: 1.0e-4\n    betas: [0.9, 0.95]\n    weight_decay: 0.1\n";
  y += "zero_optimization:\n  stage: " + std::to_string(stage) + "\n";
  y += "  overlap_comm: " + std::string(overlap ? "true" : "false") + "\n";
  if (o.reduce_bucket > 0)
    y += "  reduce_bucket_size: " + std::to_string(static_cast<std::int64_t>(o.reduce_bucket)) + "\n";
  Config cfg = parse_config(y, "bench_engine_overhead");
  cfg.resolve(world);
  return cfg;
}

// GPT-2 initial values of every unit (init_parameter), computed once on the host and shared by
// every variant: flat per unit, parameters back to back as the layout places them.
std::vector<std::vector<float>> initial_values(const GptConfig& c, const Layout& layout) {
  std::vector<std::vector<float>> units(static_cast<std::size_t>(layout.num_units()));
  std::atomic<int> next{0};
  auto work = [&] {
    for (int u = next++; u < layout.num_units(); u = next++) {
      const UnitInfo& ui = layout.unit(u);
      auto& v = units[static_cast<std::size_t>(u)];
      v.assign(static_cast<std::size_t>(ui.numel), 0.0f);
      for (const ParamInfo& p : ui.params)
        init_parameter(c, p.name, std::span<float>(v.data() + p.offset, static_cast<std::size_t>(p.numel)), 42);
    }
  };
  const unsigned n = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (unsigned i = 0; i < n; ++i) pool.emplace_back(work);
  for (auto& t : pool) t.join();
  return units;
}

// Pointer arrays into one unit's flat storage (Act elements of the Ops), reused step after step.
class UnitPtrs {
 public:
  Act* const* at(const UnitInfo& ui, void* base, std::size_t es) {
    ptrs_.resize(ui.params.size());
    for (std::size_t i = 0; i < ui.params.size(); ++i)
      ptrs_[i] = act_offset(static_cast<Act*>(base), static_cast<std::size_t>(ui.params[i].offset), es);
    return ptrs_.data();
  }

 private:
  std::vector<Act*> ptrs_;
};

struct Row {
  std::string name;
  int stage = -1;  // -1: bare
  bool overlap = false;
  double step = 0;
  double mem_gib = 0, state_gib = 0;
};

// Runs warmup + steps iterations of `one_step` (which must leave the device idle) and returns
// the step times and the largest device memory in use after any of them.
template <class F>
std::vector<double> run_steps(Context& ctx, const Options& o, std::size_t& max_used, F&& one_step) {
  std::vector<double> times;
  for (int i = 0; i < o.warmup + o.steps; ++i) {
    ctx.comm().barrier();
    const double t0 = now_s();
    one_step();
    ZERO_CUDA_CHECK(cudaDeviceSynchronize());
    const double t1 = now_s();
    max_used = std::max(max_used, device_used());
    if (i >= o.warmup) times.push_back(t1 - t0);
  }
  return times;
}

// ---------------------------------------------------------------- the bare loop

class BareLoop {
 public:
  BareLoop(Context& ctx, const GptConfig& c, const Layout& layout, const std::vector<std::vector<float>>& init,
           const Config& cfg, GptModel& model, Ops& ops)
      : ctx_(ctx), c_(c), layout_(layout), cfg_(cfg), model_(model) {
    stream_ = static_cast<cudaStream_t>(ops.stream());
    const std::vector<UnitShape> shapes =
        make_unit_shapes(layout, 0, 1, 0, cfg.zero_optimization.stage3_param_persistence_threshold);
    for (const UnitShape& s : shapes) {
      offset_.push_back(total_);
      total_ += static_cast<std::size_t>(s.padded);
    }
    ZERO_CUDA_CHECK(cudaMalloc(&params_, total_ * 2));
    ZERO_CUDA_CHECK(cudaMalloc(&grads_, total_ * 2));
    ZERO_CUDA_CHECK(cudaMalloc(&master_, total_ * 4));
    ZERO_CUDA_CHECK(cudaMalloc(&m_, total_ * 4));
    ZERO_CUDA_CHECK(cudaMalloc(&v_, total_ * 4));
    blocks_ = cuda::sumsq_blocks();
    ZERO_CUDA_CHECK(cudaMalloc(&partials_, (static_cast<std::size_t>(blocks_) + 1) * sizeof(double)));
    ZERO_CUDA_CHECK(cudaMallocHost(&sumsq_host_, sizeof(double)));
    ZERO_CUDA_CHECK(cudaMemset(grads_, 0, total_ * 2));
    ZERO_CUDA_CHECK(cudaMemset(m_, 0, total_ * 4));
    ZERO_CUDA_CHECK(cudaMemset(v_, 0, total_ * 4));
    // The initial values, padded as the engine pads them, and their bf16 rounding.
    std::vector<float> full;
    std::vector<std::uint16_t> half;
    for (int u = 0; u < layout.num_units(); ++u) {
      const std::size_t n = static_cast<std::size_t>(shapes[static_cast<std::size_t>(u)].padded);
      full.assign(n, 0.0f);
      std::copy(init[static_cast<std::size_t>(u)].begin(), init[static_cast<std::size_t>(u)].end(), full.begin());
      half.resize(n);
      convert(full.data(), DType::f32, half.data(), DType::bf16, n);
      ZERO_CUDA_CHECK(
          cudaMemcpy(master_ + offset_[static_cast<std::size_t>(u)], full.data(), n * 4, cudaMemcpyHostToDevice));
      ZERO_CUDA_CHECK(
          cudaMemcpy(params_ + 2 * offset_[static_cast<std::size_t>(u)], half.data(), n * 2, cudaMemcpyHostToDevice));
      // The weight decay runs of the whole unit, as the engine's step splits its owned range.
      const UnitShape& s = shapes[static_cast<std::size_t>(u)];
      for_each_decay_run(layout.unit(u), s, 0, s.own_len, [&](std::int64_t at, std::int64_t count, bool decay) {
        runs_.push_back({offset_[static_cast<std::size_t>(u)] + static_cast<std::size_t>(at),
                         static_cast<std::size_t>(count), decay});
      });
    }
    if (ctx.world_size() > 1) {
      ncclUniqueId id{};
      if (ctx.rank() == 0) ZERO_NCCL_CHECK(ncclGetUniqueId(&id));
      ctx.comm().broadcast(&id, sizeof id, 0);
      ZERO_NCCL_CHECK(ncclCommInitRank(&nccl_, ctx.world_size(), id, ctx.rank()));
    }
    ptrs_.resize(static_cast<std::size_t>(layout.num_units()));
    gptrs_.resize(static_cast<std::size_t>(layout.num_units()));
    ZERO_CUDA_CHECK(cudaDeviceSynchronize());
  }
  ~BareLoop() {
    cudaDeviceSynchronize();
    if (nccl_) ncclCommDestroy(nccl_);
    cudaFree(params_);
    cudaFree(grads_);
    cudaFree(master_);
    cudaFree(m_);
    cudaFree(v_);
    cudaFree(partials_);
    cudaFreeHost(sumsq_host_);
  }
  BareLoop(const BareLoop&) = delete;
  BareLoop& operator=(const BareLoop&) = delete;

  std::size_t state_bytes() const { return total_ * (2 + 2 + 4 + 4 + 4); }

  void step(const std::int32_t* inputs, const std::int32_t* targets, int B, int T) {
    model_.set_batch(inputs, targets, B, T);
    const int emb = embeddings_unit(), lnf = ln_f_unit(c_);
    const Act* const* pe = p(emb);
    model_.forward_embeddings(pe);
    for (int l = 0; l < c_.n_layer; ++l) model_.forward_block(l, p(block_unit(l)));
    model_.forward_head(p(lnf), pe);
    (void)model_.loss();
    Act* const* ge = g(emb);
    model_.backward_head(p(lnf), g(lnf), pe, ge, 1.0f);
    for (int l = c_.n_layer - 1; l >= 0; --l) model_.backward_block(l, p(block_unit(l)), g(block_unit(l)));
    model_.backward_embeddings(pe, ge);
    if (nccl_) ZERO_NCCL_CHECK(ncclAllReduce(grads_, grads_, total_, ncclBfloat16, ncclSum, nccl_, stream_));

    // The gradient norm (one host wait, as the engine's), clipping, then AdamW over each run.
    ZERO_CUDA_CHECK(cudaMemsetAsync(partials_, 0, static_cast<std::size_t>(blocks_) * sizeof(double), stream_));
    cuda::launch_sumsq_add(grads_, DType::bf16, total_, partials_, blocks_, stream_);
    cuda::launch_sumsq_finish(partials_, blocks_, partials_ + blocks_, stream_);
    ZERO_CUDA_CHECK(cudaMemcpyAsync(sumsq_host_, partials_ + blocks_, sizeof(double), cudaMemcpyDeviceToHost, stream_));
    ZERO_CUDA_CHECK(cudaStreamSynchronize(stream_));
    const double world = ctx_.world_size();
    const double norm = std::sqrt(*sumsq_host_) / world;
    ZERO_CHECK(std::isfinite(norm), "bench_engine_overhead: the bare loop's gradient norm is not finite");
    const double coef = std::min(1.0, kClip / (norm + 1e-6));
    ++step_;
    const AdamHyper h = adam_hyper(cfg_.optimizer, lr_at(cfg_, step_ - 1), step_, static_cast<float>(coef / world));
    AdamHyper h0 = h;
    h0.weight_decay = 0.0f;
    const AdamConstants with = adam_constants(h), without = adam_constants(h0);
    for (const Run& r : runs_)
      cuda::launch_adam(master_ + r.begin, m_ + r.begin, v_ + r.begin, grads_ + 2 * r.begin, DType::bf16,
                        params_ + 2 * r.begin, DType::bf16, r.n, r.decay ? with : without, stream_);
    ZERO_CUDA_CHECK(cudaMemsetAsync(grads_, 0, total_ * 2, stream_));
  }

 private:
  struct Run {
    std::size_t begin, n;
    bool decay;
  };
  std::size_t off(int u) const { return offset_[static_cast<std::size_t>(u)]; }
  const Act* const* p(int u) { return ptrs_[static_cast<std::size_t>(u)].at(layout_.unit(u), params_ + 2 * off(u), 2); }
  Act* const* g(int u) { return gptrs_[static_cast<std::size_t>(u)].at(layout_.unit(u), grads_ + 2 * off(u), 2); }

  Context& ctx_;
  const GptConfig& c_;
  const Layout& layout_;
  const Config& cfg_;
  GptModel& model_;
  cudaStream_t stream_ = nullptr;
  std::vector<std::size_t> offset_;
  std::size_t total_ = 0;
  char* params_ = nullptr;
  char* grads_ = nullptr;
  float *master_ = nullptr, *m_ = nullptr, *v_ = nullptr;
  double* partials_ = nullptr;
  double* sumsq_host_ = nullptr;
  int blocks_ = 1;
  std::vector<Run> runs_;
  std::vector<UnitPtrs> ptrs_, gptrs_;
  ncclComm_t nccl_ = nullptr;
  std::int64_t step_ = 0;
};

// ---------------------------------------------------------------- the engine loop

// One optimizer step through the engine, in GptTrainer::run_micro_batch's order (the bf16 path,
// where the model reads and writes the engine's storage directly).
// The handles of the micro-step end before step(), as run_micro_batch returns before train_step
// steps.
void engine_micro_step(Engine& engine, GptModel& model, const GptConfig& c, UnitPtrs* slots) {
  const int emb = embeddings_unit(), lnf = ln_f_unit(c);
  const Layout& layout = engine.layout();
  const std::size_t es = model.ops().elem_bytes();
  UnitParams E = engine.gather(emb);
  const Act* const* pe = slots[0].at(layout.unit(emb), E.data(), es);
  model.forward_embeddings(pe);
  for (int l = 0; l < c.n_layer; ++l) {
    UnitParams P = engine.gather(block_unit(l));
    model.forward_block(l, slots[1].at(layout.unit(block_unit(l)), P.data(), es));
  }
  {
    UnitParams P = engine.gather(lnf);
    model.forward_head(slots[1].at(layout.unit(lnf), P.data(), es), pe);
  }
  (void)model.loss();
  const float dloss = engine.loss_scale();
  UnitGrads GE = engine.grads(emb);
  Act* const* ge = slots[2].at(layout.unit(emb), GE.data(), es);
  {
    UnitParams P = engine.gather(lnf);
    UnitGrads G = engine.grads(lnf);
    model.backward_head(slots[1].at(layout.unit(lnf), P.data(), es), slots[3].at(layout.unit(lnf), G.data(), es), pe,
                        ge, dloss);
    engine.reduce(lnf);
  }
  for (int l = c.n_layer - 1; l >= 0; --l) {
    const int u = block_unit(l);
    UnitParams P = engine.gather(u);
    UnitGrads G = engine.grads(u);
    model.backward_block(l, slots[1].at(layout.unit(u), P.data(), es), slots[3].at(layout.unit(u), G.data(), es));
    engine.reduce(u);
  }
  model.backward_embeddings(pe, ge);
  engine.reduce(emb);
}

void engine_step(Engine& engine, GptModel& model, const GptConfig& c, const std::int32_t* inputs,
                 const std::int32_t* targets, int B, int T, UnitPtrs* slots) {
  model.set_batch(inputs, targets, B, T);
  engine_micro_step(engine, model, c, slots);
  const StepResult r = engine.step();
  ZERO_CHECK(!r.skipped, "bench_engine_overhead: the engine skipped a step (non-finite gradient norm)");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Engine overhead: GPT step time at ZeRO stages 0-3 (overlap_comm on and off) against a bare loop "
      "running the same kernels without the engine"};
  app.option_defaults()->always_capture_default();
  Options o;
  app.add_option("--preset", o.preset, "GPT shape")->check(CLI::IsMember(gpt_preset_names()));
  app.add_option("--n-layer", o.n_layer, "override the preset's layers (0: keep)")->check(CLI::Range(0, 4096));
  app.add_option("--n-head", o.n_head, "override the preset's heads (0: keep)")->check(CLI::Range(0, 4096));
  app.add_option("--n-embd", o.n_embd, "override the preset's width (0: keep)")->check(CLI::Range(0, 1 << 20));
  app.add_option("--seq-len", o.seq_len, "sequence length T")->check(CLI::Range(1, 1 << 20));
  app.add_option("--micro-batch", o.micro_batch, "sequences per micro-batch B")->check(CLI::Range(1, 1 << 20));
  app.add_flag("--checkpointing", o.checkpointing, "activation checkpointing in the model");
  app.add_option("--stages", o.stages, "engine stages to run")->check(CLI::IsMember({0, 1, 2, 3}));
  app.add_option("--overlap", o.overlap, "overlap_comm settings to run")->check(CLI::IsMember({"on", "off"}));
  app.add_option("--steps", o.steps, "timed steps per variant (the median is reported)")->check(CLI::Range(1, 100000));
  app.add_option("--warmup", o.warmup, "untimed steps first")->check(CLI::Range(0, 100000));
  app.add_option("--comm", o.comm, "the engine's communicator")->check(CLI::IsMember({"nccl", "mpi"}));
  app.add_option("--reduce-bucket", o.reduce_bucket,
                 "zero_optimization.reduce_bucket_size (elements; 0: the "
                 "DeepSpeed default 5e8)")
      ->check(CLI::Range(0.0, 1e12));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (const int rc = bench::cuda_device_status("bench_engine_overhead")) return rc;

  Context ctx(&argc, &argv);
  return ctx.run([&] {
    ZERO_CHECK(ctx.device() >= 0, "bench_engine_overhead: rank " + std::to_string(ctx.rank()) + " has no CUDA device");
    ZERO_CUDA_CHECK(cudaSetDevice(ctx.device()));
    const int world = ctx.world_size();

    GptConfig c = gpt_preset(o.preset);
    if (o.n_layer) c.n_layer = o.n_layer;
    if (o.n_head) c.n_head = o.n_head;
    if (o.n_embd) c.n_embd = o.n_embd;
    c.seq_len = o.seq_len;
    c.activation_checkpointing = o.checkpointing;
    c.validate();
    const Layout layout = build_layout(c);
    const int B = o.micro_batch, T = c.seq_len;

    // The model, its Ops and stream, and the data: shared by every variant.
    std::unique_ptr<Ops> ops = make_cuda_ops(nullptr);
    GptModel model(c, B, *ops);
    std::vector<std::int32_t> inputs(static_cast<std::size_t>(B) * T), targets(inputs.size());
    std::uint64_t state = 0x9e3779b97f4a7c15ull * static_cast<std::uint64_t>(ctx.rank() + 1);
    auto token = [&] {
      state = state * 6364136223846793005ull + 1442695040888963407ull;  // an LCG is plenty for token ids
      return static_cast<std::int32_t>((state >> 33) % static_cast<std::uint64_t>(c.vocab_size));
    };
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      inputs[i] = token();
      targets[i] = token();
    }
    const std::vector<std::vector<float>> init = initial_values(c, layout);
    std::unordered_map<std::string, int> unit_of;
    for (int u = 0; u < layout.num_units(); ++u)
      for (const ParamInfo& p : layout.unit(u).params) unit_of[p.name] = u;
    ZERO_CUDA_CHECK(cudaDeviceSynchronize());
    const double flops_per_step = training_flops_per_token(c).total() * B * T;

    if (ctx.is_root()) {
      std::printf("bench_engine_overhead: %s (%s), bf16, micro-batch %d x seq %d, %d rank(s), comm %s\n",
                  o.preset.c_str(), c.describe().c_str(), B, T, world, o.comm.c_str());
      std::printf(
          "activations %.2f GiB (shared by every variant); median of %d steps after %d warm-up; each step "
          "ends with a device synchronize\n",
          static_cast<double>(model.activation_bytes()) / kGiB, o.steps, o.warmup);
      std::fflush(stdout);
    }

    std::vector<Row> rows;
    auto finish_row = [&](Row r, const std::vector<double>& times, std::size_t used, std::size_t base) {
      r.step = ctx.comm().all_reduce_scalar(median(times), ReduceOp::max);  // the slowest rank's
      r.mem_gib = ctx.comm().all_reduce_scalar(static_cast<double>(used - std::min(used, base)) / kGiB, ReduceOp::max);
      r.state_gib = ctx.comm().all_reduce_scalar(r.state_gib, ReduceOp::max);
      if (ctx.is_root()) {
        std::printf("  %-20s %9.2f ms\n", r.name.c_str(), r.step * 1e3);
        std::fflush(stdout);
      }
      rows.push_back(r);
    };

    {
      const Config cfg = make_config(o, 0, true, world);
      const std::size_t base = device_used();
      BareLoop bare(ctx, c, layout, init, cfg, model, *ops);
      std::size_t used = base;
      const auto times = run_steps(ctx, o, used, [&] { bare.step(inputs.data(), targets.data(), B, T); });
      Row r;
      r.name = world > 1 ? "bare (+1 all-reduce)" : "bare";
      r.state_gib = static_cast<double>(bare.state_bytes()) / kGiB;
      finish_row(r, times, used, base);
    }

    for (int stage : o.stages) {
      for (const std::string& ov : o.overlap) {
        const bool overlap = ov == "on";
        const Config cfg = make_config(o, stage, overlap, world);
        const std::size_t base = device_used();
        std::size_t used = base;
        Row r;
        r.name = "stage " + std::to_string(stage) + " overlap " + ov;
        r.stage = stage;
        r.overlap = overlap;
        {
          Engine engine(ctx, cfg, layout);
          engine.set_stream(ops->stream());
          engine.init_params([&](const ParamInfo& p, std::span<float> v) {
            const std::vector<float>& src = init[static_cast<std::size_t>(unit_of.at(p.name))];
            std::copy(src.begin() + p.offset, src.begin() + p.offset + p.numel, v.begin());
          });
          UnitPtrs slots[4];
          const auto times = run_steps(
              ctx, o, used, [&] { engine_step(engine, model, c, inputs.data(), targets.data(), B, T, slots); });
          const MemoryReport m = engine.memory();
          r.state_gib = static_cast<double>(m.model_state() + m.comm_buffers + m.gathered) / kGiB;
          finish_row(r, times, used, base);
        }
        ZERO_CUDA_CHECK(cudaDeviceSynchronize());
      }
    }

    if (ctx.is_root()) {
      const Row& bare = rows.front();
      auto stage0 = [&](const Row& r) -> const Row* {
        for (const Row& s : rows)
          if (s.stage == 0 && s.overlap == r.overlap) return &s;
        return nullptr;
      };
      std::printf("\n%-22s | %9s | %7s | %10s | %8s | %9s | %9s\n", "variant", "step ms", "vs bare", "vs stage 0",
                  "TFLOP/s", "state GiB", "mem GiB");
      for (const Row& r : rows) {
        const Row* s0 = r.stage >= 0 ? stage0(r) : nullptr;
        char vs0[16] = "-";
        if (s0) std::snprintf(vs0, sizeof vs0, "%.3f", r.step / s0->step);
        std::printf("%-22s | %9.2f | %7.3f | %10s | %8.1f | %9.2f | %9.2f\n", r.name.c_str(), r.step * 1e3,
                    r.step / bare.step, vs0, flops_per_step / r.step / 1e12, r.state_gib, r.mem_gib);
      }
      std::printf("\ngoals (one GPU): stage 1 and 2 <= 1.03 x stage 0, stage 3 <= 1.10 x stage 0 (same overlap)\n");
      for (const Row& r : rows) {
        if (r.stage <= 0) continue;
        const Row* s0 = stage0(r);
        if (!s0) continue;
        const double limit = r.stage == 3 ? 1.10 : 1.03;
        std::printf("  %-20s %.3f x stage 0 (limit %.2f): %s\n", r.name.c_str(), r.step / s0->step, limit,
                    r.step <= limit * s0->step ? "met" : "NOT met");
      }
    }
    return 0;
  });
}
