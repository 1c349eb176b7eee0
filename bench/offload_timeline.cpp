// bench_offload_timeline: with offload_optimizer: cpu on the CUDA backend, does an optimizer step
// cost little more than the host AdamW it cannot avoid? The gradients of each sub-group travel to
// pinned host memory (D2H), the host AdamW steps it, and its bf16 parameters travel back (H2D);
// the three should overlap across sub-groups, so that only the first copy out and the last copy
// back add to the host's work. Goal: an offloaded step at most 1.2 x the host AdamW alone.
//
// The model is a synthetic layout (no forward or backward): --units units of one [rows, 1024]
// matrix each, --params million parameters in all, bf16 on the device. Each step a memset kernel
// fills every unit's gradient (the same value every step: finite, so no step is skipped), the
// units are reduced, and Engine::step() is timed from its call until the device is idle.
// "Host AdamW alone" is offload::adam_step over host arrays of the same sub-groups in the same
// order, with the same threads (OpenMP's default, as the engine) and the same bf16 gradient in
// and bf16 parameter out: bench_host_adam's fused step. The two take turns within each
// repetition, and the medians are compared.
//
// The timeline comes from one more step with the staging's timeline sink set (it waits for the
// copies at the step's start and end, so that step is not one of the timed ones): per sub-group,
// the start and end of its D2H copy, the host's wait for it, its AdamW, and its H2D copy, in ms
// from the step() call.
//
// Run: bench_offload_timeline [--params 300] [--units 24] [--sub-group 1e9] [--stages 1 2]
// Needs a CUDA device (exit 77 without one). World size 1 is the intended run; under mpirun each
// rank steps its own shards and rank 0 prints.
#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda_probe.hpp"
#include "timing.hpp"
#include "engine/engine_impl.hpp"
#include "zero/comm.hpp"
#include "zero/config.hpp"
#include "zero/context.hpp"
#include "zero/engine.hpp"
#include "zero/error.hpp"
#include "offload/host_optimizer.hpp"
#include "zero/optim.hpp"

using namespace zero;

namespace {

using zero::bench::median;
using zero::bench::now_s;

constexpr std::int64_t kCols = 1024;
// Every gradient element becomes bf16 0x3C3C (about 0.0115): finite, so no step is skipped.
constexpr int kGradByte = 0x3C;

struct Options {
  double params_m = 300;
  int units = 24;
  double sub_group = 1e9;
  std::vector<int> stages{1, 2};
  int steps = 10, warmup = 2;
  std::string comm = "nccl";
  bool pin = false;
};

Layout make_layout(const Options& o) {
  const auto total = static_cast<std::int64_t>(o.params_m * 1e6);
  const std::int64_t rows = std::max<std::int64_t>(1, total / o.units / kCols);
  Layout layout;
  for (int u = 0; u < o.units; ++u) layout.add_unit("u" + std::to_string(u), {{"weight", {rows, kCols}}});
  return layout;
}

Config make_config(const Options& o, int stage, int world) {
  std::string y;
  y += "backend: cuda\ncomm: " + o.comm + "\n";
  y += "train_micro_batch_size_per_gpu: 1\ngradient_accumulation_steps: 1\ngradient_clipping: 1.0\n";
  y += "bf16:\n  enabled: true\n";
  y += "optimizer:\n  type: AdamW\n  params:\n    lr: 1.0e-4\n    weight_decay: 0.1\n";
  y += "zero_optimization:\n  stage: " + std::to_string(stage) + "\n";
  y += "  sub_group_size: " + std::to_string(static_cast<std::int64_t>(o.sub_group)) + "\n";
  y += "  offload_optimizer:\n    device: cpu\n    pin_memory: " + std::string(o.pin ? "true" : "false") + "\n";
  Config cfg = parse_config(y, "bench_offload_timeline");
  cfg.resolve(world);
  return cfg;
}

// The sub-groups the optimizer store visits (engine/optimizer_store.cpp): each unit's owned range cut
// into sub_group_size pieces, units in order.
struct SubGroup {
  int unit;
  std::int64_t begin, len;
};
std::vector<SubGroup> sub_groups(const Layout& layout, int world, std::int64_t sub_group) {
  std::vector<SubGroup> out;
  for (int u = 0; u < layout.num_units(); ++u) {
    const std::int64_t len = layout.slice_numel(u, world);  // stages 1-3 own one slice
    for (std::int64_t b = 0; b < len; b += sub_group) out.push_back({u, b, std::min(sub_group, len - b)});
  }
  return out;
}

// Host AdamW alone over the same sub-groups: fp32 master and moments, bf16 gradient in, bf16
// parameter out, one adam_step per sub-group.
class HostAlone {
 public:
  explicit HostAlone(const std::vector<SubGroup>& groups) : groups_(groups) {
    std::size_t n = 0;
    for (const auto& g : groups_) n += static_cast<std::size_t>(g.len);
    master_.assign(n, 0.01f);
    m_.assign(n, 0.0f);
    v_.assign(n, 0.0f);
    grad_.assign(n, static_cast<std::uint16_t>(kGradByte << 8 | kGradByte));
    out_.assign(n, 0);
  }
  // One pass over every sub-group; seconds.
  double run(const AdamHyper& h) {
    const double t0 = now_s();
    std::size_t off = 0;
    for (const auto& g : groups_) {
      const auto n = static_cast<std::size_t>(g.len);
      offload::adam_step(master_.data() + off, m_.data() + off, v_.data() + off, grad_.data() + off, DType::bf16,
                         out_.data() + off, DType::bf16, n, h);
      off += n;
    }
    return now_s() - t0;
  }

 private:
  std::vector<SubGroup> groups_;
  std::vector<float> master_, m_, v_;
  std::vector<std::uint16_t> grad_, out_;
};

// Fills every unit's gradient and reduces it: one micro-step, as a backward would end.
void fill_grads(Engine& engine, cudaStream_t stream) {
  const Layout& layout = engine.layout();
  for (int u = 0; u < layout.num_units(); ++u) {
    UnitGrads g = engine.grads(u);
    const auto bytes = static_cast<std::size_t>(layout.unit(u).numel) * sizeof(std::uint16_t);
    ZERO_CUDA_CHECK(cudaMemsetAsync(g.data(), kGradByte, bytes, stream));
    engine.reduce(u);
  }
}

// One timed step: gradients ready and the device idle first, then step() until the device is
// idle again. Seconds from the step() call; `called` receives that call's steady_clock time.
double timed_step(Context& ctx, Engine& engine, cudaStream_t stream, double* called = nullptr) {
  fill_grads(engine, stream);
  ZERO_CUDA_CHECK(cudaDeviceSynchronize());
  ctx.comm().barrier();
  const double t0 = now_s();
  const StepResult r = engine.step();
  ZERO_CUDA_CHECK(cudaDeviceSynchronize());
  const double t1 = now_s();
  ZERO_CHECK(!r.skipped,
             "bench_offload_timeline: a step was skipped (non-finite gradient norm); the synthetic "
             "gradients should be finite");
  if (called) *called = t0;
  return t1 - t0;
}

void print_timeline(const OffloadTimeline& tl, double called, double step_s) {
  // Shift from the staging's origin (after the gradient norm) to the step() call.
  const double shift = (tl.origin_s - called) * 1e3;
  auto at = [&](double ms) { return ms < 0 ? -1.0 : ms + shift; };
  std::printf(
      "\ntimeline of one traced step (ms from the step() call; the copies' origin is at %.2f ms, after "
      "the gradient norm):\n",
      shift);
  std::printf("%5s %5s %8s | %8s %8s | %8s %8s %8s | %8s %8s\n", "group", "unit", "Melem", "D2H beg", "D2H end", "wait",
              "Adam beg", "Adam end", "H2D beg", "H2D end");
  double adam = 0, d2h = 0, h2d = 0, gaps = 0;
  int hidden_out = 0, hidden_back = 0;
  // Long timelines print their first and last rows; the totals below cover every group.
  constexpr std::size_t kHead = 32, kTail = 16;
  const std::size_t count = tl.groups.size();
  for (std::size_t k = 0; k < count; ++k) {
    const OffloadTimeline::Group& g = tl.groups[k];
    if (count > kHead + kTail && k == kHead) std::printf("  ... %zu groups not shown ...\n", count - kHead - kTail);
    if (count <= kHead + kTail || k < kHead || k >= count - kTail)
      std::printf("%5zu %5zu %8.2f | %8.2f %8.2f | %8.2f %8.2f %8.2f | %8.2f %8.2f\n", k, g.range,
                  static_cast<double>(g.n) / 1e6, at(g.d2h_start), at(g.d2h_end), at(g.wait_start), at(g.host_start),
                  at(g.host_end), at(g.h2d_start), at(g.h2d_end));
    adam += g.host_end - g.host_start;
    if (k > 0) gaps += g.host_start - tl.groups[k - 1].host_end;
    if (g.d2h_start >= 0) d2h += g.d2h_end - g.d2h_start;
    if (g.h2d_start >= 0) h2d += g.h2d_end - g.h2d_start;
    // Hidden copies: the next group's gradients had arrived before this group's AdamW ended,
    // and this group's parameters were back before the next group's AdamW ended.
    if (k + 1 < count) {
      const OffloadTimeline::Group& next = tl.groups[k + 1];
      if (next.d2h_end >= 0 && next.d2h_end <= g.host_end) ++hidden_out;
      if (g.h2d_end >= 0 && g.h2d_end <= next.host_end) ++hidden_back;
    }
  }
  if (count == 0) {
    std::printf("no sub-group was recorded\n");
    return;
  }
  const double step_ms = step_s * 1e3;
  const double before = at(tl.groups.front().host_start), after = step_ms - at(tl.groups.back().host_end);
  std::printf(
      "traced step %.2f ms = %.2f before the first AdamW (norm, first D2H) + %.2f host AdamW + %.2f between "
      "sub-groups (waits, bookkeeping) + %.2f after the last AdamW (last H2D, all-gather)\n",
      step_ms, before, adam, gaps, after);
  std::printf(
      "copy engines busy: D2H %.2f ms, H2D %.2f ms; hidden behind the host: next D2H done before this AdamW "
      "ended in %d of %zu groups, this H2D done before the next AdamW ended in %d of %zu\n",
      d2h, h2d, hidden_out, count - 1, hidden_back, count - 1);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Offloaded optimizer step (offload_optimizer: cpu, CUDA backend): per-sub-group timeline of D2H, "
      "host AdamW and H2D, and the step against the host AdamW alone (goal <= 1.2x)"};
  app.option_defaults()->always_capture_default();
  Options o;
  app.add_option("--params", o.params_m, "parameters, millions")->check(CLI::PositiveNumber);
  app.add_option("--units", o.units, "units (one [rows, 1024] matrix each)")->check(CLI::Range(1, 100000));
  app.add_option("--sub-group", o.sub_group,
                 "zero_optimization.sub_group_size (elements; DeepSpeed's default 1e9 "
                 "makes every unit one sub-group)")
      ->check(CLI::Range(1.0, 1e12));
  app.add_option("--stages", o.stages, "ZeRO stages to run (1 and/or 2)")->check(CLI::IsMember({1, 2}));
  app.add_option("--steps", o.steps, "timed steps per stage (the median is reported)")->check(CLI::Range(1, 100000));
  app.add_option("--warmup", o.warmup, "untimed steps first")->check(CLI::Range(0, 100000));
  app.add_option("--comm", o.comm, "the CUDA backend's communicator")->check(CLI::IsMember({"nccl", "mpi"}));
  app.add_flag("--pin", o.pin,
               "offload_optimizer.pin_memory: true (pinning failure is an error; by default the "
               "state is pinned when possible)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (const int rc = bench::cuda_device_status("bench_offload_timeline")) return rc;

  Context ctx(&argc, &argv);
  return ctx.run([&] {
    ZERO_CHECK(ctx.device() >= 0, "bench_offload_timeline: rank " + std::to_string(ctx.rank()) + " has no CUDA device");
    const Layout layout = make_layout(o);
    const int world = ctx.world_size();
    std::int64_t owned = 0;
    for (int u = 0; u < layout.num_units(); ++u) owned += layout.slice_numel(u, world);
    const std::vector<SubGroup> groups = sub_groups(layout, world, static_cast<std::int64_t>(o.sub_group));
    if (ctx.is_root()) {
      std::printf("bench_offload_timeline: %.1fM parameters in %d units, bf16 on the device; %d rank(s), comm %s\n",
                  static_cast<double>(layout.num_params()) / 1e6, layout.num_units(), world, o.comm.c_str());
      std::printf(
          "offload_optimizer: cpu, sub_group_size %.0f: %zu sub-groups of up to %.2fM owned elements per "
          "rank (%.1fM owned); host AdamW path %s, OpenMP default threads\n",
          o.sub_group, groups.size(),
          static_cast<double>(
              std::min<std::int64_t>(static_cast<std::int64_t>(o.sub_group), layout.slice_numel(0, world))) /
              1e6,
          static_cast<double>(owned) / 1e6, std::string(offload::simd_path_name(offload::best_simd_path())).c_str());
      std::printf(
          "step = Engine::step() from its call until the device is idle (gradient norm, D2H, host AdamW, "
          "H2D, all-gather); median of %d after %d warm-up steps\n",
          o.steps, o.warmup);
      std::fflush(stdout);
    }
    HostAlone alone(groups);
    cudaStream_t stream = nullptr;
    ZERO_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

    struct Row {
      int stage;
      double step, host;
    };
    std::vector<Row> rows;
    for (int stage : o.stages) {
      const Config cfg = make_config(o, stage, world);
      Engine engine(ctx, cfg, layout);
      engine.set_stream(stream);
      engine.init_params([](const ParamInfo&, std::span<float> v) { std::fill(v.begin(), v.end(), 0.01f); });
      OffloadStaging* staging = engine_backend(engine).offload_staging();
      ZERO_CHECK(staging, "bench_offload_timeline: the CUDA backend has no offload staging");

      std::int64_t host_steps = 0;
      auto host_once = [&] {
        // The engine's hyper-parameters at this step (clipping aside: it changes no traffic).
        return alone.run(adam_hyper(cfg.optimizer, cfg.optimizer.lr, ++host_steps, 1.0f));
      };
      for (int i = 0; i < o.warmup; ++i) {
        timed_step(ctx, engine, stream);
        host_once();
      }
      std::vector<double> step_s, host_s;
      for (int i = 0; i < o.steps; ++i) {
        step_s.push_back(timed_step(ctx, engine, stream));
        ctx.comm().barrier();
        host_s.push_back(host_once());
      }
      // The slowest rank decides the step.
      const double step_med = ctx.comm().all_reduce_scalar(median(step_s), ReduceOp::max);
      const double host_med = ctx.comm().all_reduce_scalar(median(host_s), ReduceOp::max);
      rows.push_back({stage, step_med, host_med});

      OffloadTimeline tl;
      staging->set_timeline(&tl);
      double called = 0;
      const double traced = timed_step(ctx, engine, stream, &called);
      staging->set_timeline(nullptr);
      if (ctx.is_root()) {
        std::printf("\n== stage %d: offloaded step %.2f ms (median), host AdamW alone %.2f ms (median), ratio %.3f\n",
                    stage, step_med * 1e3, host_med * 1e3, step_med / host_med);
        print_timeline(tl, called, traced);
        std::fflush(stdout);
      }
      cudaDeviceSynchronize();
    }
    ZERO_CUDA_CHECK(cudaStreamDestroy(stream));

    if (ctx.is_root()) {
      std::printf("\nsummary (goal: offloaded step <= 1.20 x host AdamW alone)\n");
      std::printf("%5s | %12s | %14s | %6s | %s\n", "stage", "step ms", "host AdamW ms", "ratio", "goal");
      for (const Row& r : rows)
        std::printf("%5d | %12.2f | %14.2f | %6.3f | %s\n", r.stage, r.step * 1e3, r.host * 1e3, r.step / r.host,
                    r.step <= 1.2 * r.host ? "met" : "NOT met");
    }
    return 0;
  });
}
