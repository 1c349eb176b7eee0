#include "gpt/autotune_run.hpp"

#include <fmt/format.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "gpt/reporter.hpp"
#include "zero/comm.hpp"
#include "zero/error.hpp"
#include "zero/groups.hpp"
#include "zero/plan/plan.hpp"

namespace zero::gpt {

namespace fs = std::filesystem;

void add_autotune_options(CLI::App& app, AutotuneRequest& r) {
  CLI::Option_group* g = app.add_option_group(
      "Autotune", "--autotune: time a few steps of every candidate that fits and keep the fastest");
  CLI::Option* flag = g->add_flag("--autotune", r.enabled,
                                  "try the combinations of the lists below at the configured global batch; write "
                                  "<run.out_dir>/autotune.yaml (the fastest, a complete config file) and autotune.txt "
                                  "(every candidate: its step time, or why it was skipped)");
  g->add_option("--autotune-stages", r.stages, "ZeRO stages to try")
      ->delimiter(',')
      ->check(CLI::Range(0, 3))
      ->capture_default_str();
  g->add_option("--autotune-micro-batches", r.micro_batches,
                "micro-batches per rank to try (default: the powers of two that divide the batch per rank)")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  g->add_option("--autotune-buckets", r.bucket_sizes,
                "reduce/allgather bucket sizes in elements to try (default: the config's)")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  g->add_option("--autotune-overlap", r.overlap, "overlap_comm values to try: on, off (default: the config's)")
      ->delimiter(',')
      ->check(CLI::IsMember({"on", "off"}));
  g->add_option("--autotune-offload", r.offload, "offload_optimizer devices to try: none, cpu, nvme")
      ->delimiter(',')
      ->check(CLI::IsMember({"none", "cpu", "nvme"}))
      ->capture_default_str();
  g->add_option("--autotune-tp", r.tensor_parallel,
                "model.tensor_parallel sizes to try, e.g. 1,2 (default: the config's); each must divide the ranks")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  g->add_option("--autotune-pp", r.pipeline_parallel,
                "model.pipeline_parallel sizes to try, e.g. 1,2 (default: the config's); a pipeline runs at stages 0-1")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  g->add_option("--autotune-warmup", r.warmup_steps, "untimed optimizer steps per candidate")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  g->add_option("--autotune-steps", r.timed_steps, "timed optimizer steps per candidate")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  g->add_option("--autotune-memory", r.memory_bytes,
                "memory one rank may use, e.g. 2GiB (default: the node's available memory shared by its ranks)")
      ->transform(CLI::AsSizeValue(false));
  g->add_option("--autotune-then", r.then, "after tuning: exit, or train with the winner")
      ->check(CLI::IsMember({"exit", "train"}))
      ->capture_default_str();
  // An --autotune-* option without --autotune would be silently ignored: refuse it instead.
  for (CLI::Option* o : g->get_options())
    if (o != flag) o->needs(flag);
}

namespace {

// MemAvailable from /proc/meminfo in bytes; 0 where it cannot be read.
double mem_available_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  double kib = 0;
  std::string unit;
  while (in >> key >> kib) {
    std::getline(in, unit);
    if (key == "MemAvailable:") return kib * 1024.0;
  }
  return 0;
}

// The budget every rank holds candidates against: the same on every rank (the smallest), so
// that all ranks skip the same candidates.
double rank_memory_budget(Context& ctx, double requested) {
  if (requested > 0) return requested;
  const double mine = mem_available_bytes() / ctx.local_size();
  ZERO_CHECK(ctx.comm().all_reduce_scalar(mine > 0 ? 0.0 : 1.0, ReduceOp::max) == 0.0,
             "zero-gpt --autotune: cannot read MemAvailable from /proc/meminfo on some rank; state the "
             "memory one rank may use with --autotune-memory (e.g. 8GiB)");
  return -ctx.comm().all_reduce_scalar(-mine, ReduceOp::max);
}

OffloadDevice offload_device(const std::string& name) {
  if (name == "cpu") return OffloadDevice::cpu;
  if (name == "nvme") return OffloadDevice::nvme;
  return OffloadDevice::none;
}

// Small models differ by fractions of a MiB; large ones need no more than a tenth.
std::string mib(double bytes) {
  const double m = bytes / (1 << 20);
  return m < 100 ? fmt::format("{:.3f} MiB", m) : fmt::format("{:.1f} MiB", m);
}

// The planner's memory for one candidate, summed for the host backend: the engine's "device"
// memory and the offloaded states are the same RAM, and the host model keeps fp32 activations
// whatever the parameters' dtype. Under a tensor x pipeline grid it is the rank the planner
// finds fullest (the first or the last pipeline part): its part of the model, sharded over its
// data-parallel group, and the activations of its 1F1B micro-batches in flight, split by TP. The planner's stated
// per-process overheads (a CUDA context, the process and MPI) are left out: the budget is measured with the processes
// running.
FitsFn host_fits(const GptConfig& model, int world, int ranks_per_node, double budget) {
  const plan::GptShape shape = model.plan_shape();
  plan::Cluster cluster;
  cluster.gpus = world;
  cluster.gpus_per_node = ranks_per_node;
  // Only the memory side of the plan is used (the time is measured); nonzero rates keep the
  // unused time model finite.
  cluster.gpu.name = "host";
  cluster.gpu.memory_bytes = budget;
  cluster.gpu.peak_flops = cluster.gpu.efficiency = 1;
  cluster.gpu.hbm_bytes_per_s = cluster.gpu.pcie_bytes_per_s = cluster.gpu.nvlink_bytes_per_s = 1;
  cluster.host_bytes_per_gpu = budget;
  cluster.nvme_bytes_per_node = 1e18;  // NVMe space is the engine's to check (aio.nvme_path)
  const bool ckpt = model.activation_checkpointing;
  return [shape, cluster, ckpt, budget](const Config& cfg, GridSpec grid, std::string& why) {
    plan::Settings s = plan::settings_from(cfg);
    s.activation_checkpointing = ckpt;
    s.tensor_parallel = grid.tensor;
    s.pipeline_parallel = grid.pipeline;
    // Throws for a grid or stage the planner refuses: the candidate is refused with its reason.
    const plan::Plan p = plan::make_plan(shape, cluster, s);
    const plan::MemoryPlan& m = p.memory;
    const plan::PipelinePart part{grid.tensor, grid.pipeline, p.memory_part};
    const int in_flight = std::min(grid.pipeline - part.index, s.grad_accum);
    const std::int64_t activations = plan::part_activation_bytes(shape, part, s.micro_batch, in_flight, ckpt, 4,
                                                                 plan::AttentionStore::probabilities);
    const std::int64_t states = m.states.device() + m.states.host;
    const std::int64_t buffers = m.comm_buffers + m.gathered + m.pinned;
    const double need = static_cast<double>(states + activations + buffers);
    // Said for the candidates that run too: the table then shows how close each came.
    const std::string where = grid.pipeline > 1 ? fmt::format("pipeline part {}: ", part.index) : "";
    why = "memory per rank: " + mib(need) + " (" + where + "model states " + mib(static_cast<double>(states)) +
          " + activations " + mib(static_cast<double>(activations)) + " + buffers " +
          mib(static_cast<double>(buffers)) + (need <= budget ? ") of " : ") > ") + mib(budget);
    return need <= budget;
  };
}

}  // namespace

GptSettings with_grid(const GptSettings& settings, GridSpec grid) {
  GptSettings s = settings;
  s.tensor_parallel = grid.tensor;
  s.pipeline_parallel = grid.pipeline;
  return s;
}

AutotuneOutcome run_autotune(Context& ctx, const Config& base, const GptSettings& settings,
                             const AutotuneRequest& req) {
  ZERO_CHECK(base.resolved, "run_autotune: the base config must be resolved for the world size");
  const int world = ctx.world_size();
  // The default micro-batches divide the batch of a data-parallel rank at the largest
  // data-parallel size tried (the smallest grid): they divide it at every other grid too.
  auto smallest = [](const std::vector<int>& sizes, int config) {
    return sizes.empty() ? config : *std::min_element(sizes.begin(), sizes.end());
  };
  const int fewest = smallest(req.tensor_parallel, settings.tensor_parallel) *
                     smallest(req.pipeline_parallel, settings.pipeline_parallel);
  const std::int64_t per_rank = base.train_batch_size / std::max(1, world / fewest);
  std::vector<std::int64_t> micro = req.micro_batches;
  if (micro.empty())
    for (std::int64_t mb = 1; mb <= per_rank; mb *= 2)
      if (per_rank % mb == 0) micro.push_back(mb);
  std::vector<bool> overlap;
  for (const auto& o : req.overlap) overlap.push_back(o == "on");
  std::vector<OffloadDevice> offload;
  for (const auto& o : req.offload) offload.push_back(offload_device(o));
  std::vector<TuneCandidate> candidates = with_grids(tune_grid(req.stages, micro, req.bucket_sizes, overlap, offload),
                                                     req.tensor_parallel, req.pipeline_parallel);
  // Across nodes, stage 3 is also tried with ZeRO++ (hpZ inside the node, qwZ, qgZ), stage 2
  // with qgZ, stages 1-3 with MiCS over the node: whether they pay depends on the links, which
  // the timing measures.
  const NodeLayout nodes = node_layout(ctx);
  if (nodes.nodes > 1 && base.backend == BackendKind::host)  // (ZeRO++ and MiCS are host-only for now)
    candidates = with_zero_plus_plus(candidates, base.zero_optimization.stage, nodes.ranks_per_node);

  AutotuneOutcome out;
  out.memory_bytes = rank_memory_budget(ctx, req.memory_bytes);
  const fs::path dir = settings.out_dir;
  out.config_path = (dir / "autotune.yaml").string();
  out.table_path = (dir / "autotune.txt").string();
  if (ctx.is_root()) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    ZERO_CHECK(!ec, "zero-gpt --autotune: cannot create run.out_dir '" + dir.string() + "': " + ec.message() +
                        "; choose a writable directory");
    fs::remove(out.config_path, ec);  // a stale winner must not survive a run where nothing fits
  }
  ctx.comm().barrier();

  // The winner's file is a whole zero-gpt config: the engine's keys and the trainer's sections.
  Config tuned = base;
  for (const auto& [name, yaml] : settings.sections()) tuned.extra_sections[name] = yaml;
  TuneOptions opt;
  opt.warmup_steps = req.warmup_steps;
  opt.timed_steps = req.timed_steps;
  opt.fits = host_fits(settings.model, world, ctx.local_size(), out.memory_bytes);
  opt.config_out = out.config_path;
  opt.grid = {settings.tensor_parallel, settings.pipeline_parallel};
  // The grid lives in the model section: every candidate's config (and so the winner's file)
  // carries its own.
  opt.record_grid = [&settings](Config& cfg, GridSpec grid) {
    for (const auto& [name, yaml] : with_grid(settings, grid).sections()) cfg.extra_sections[name] = yaml;
  };
  // Each candidate's groups and engine: this rank's part of the model at the candidate's grid,
  // initialised as zero-gpt initialises it.
  auto make_engine = [&ctx, &settings](const Config& cfg, GridSpec grid) {
    TuneEngine run;
    if (grid.tensor > 1 || grid.pipeline > 1) run.groups = std::make_unique<ProcessGroups>(ctx, grid);
    run.engine = make_gpt_engine(ctx, cfg, with_grid(settings, grid), run.groups.get());
    return run;
  };
  // Each candidate trains with its own trainer on that engine: activations sized by its
  // micro-batch, the data stream from the start, so every candidate sees the same batches.
  auto make_step = [&ctx, &settings](TuneEngine& run) -> TrainStepFn {
    const GptSettings s =
        with_grid(settings, {run.groups ? run.groups->tensor_size() : 1, run.groups ? run.groups->pipeline_size() : 1});
    auto trainer = run.groups ? std::make_shared<GptTrainer>(ctx, *run.engine, *run.groups, s)
                              : std::make_shared<GptTrainer>(ctx, *run.engine, s);
    return [trainer](Engine&) { trainer->train_step(); };
  };
  const GptConfig& model = settings.model;
  out.result = autotune_grid(ctx, tuned, make_engine, make_step, candidates, opt);

  if (ctx.is_root()) {
    std::ofstream f(out.table_path);
    ZERO_CHECK(f, "zero-gpt --autotune: cannot write " + out.table_path + "; check the directory is writable");
    f << "# zero-gpt --autotune: " << model.describe() << ", " << world << " rank" << (world == 1 ? "" : "s")
      << ", global batch " << base.train_batch_size << ", " << req.warmup_steps << " warm-up + " << req.timed_steps
      << " timed steps per candidate, memory per rank " << mib(out.memory_bytes) << ", the config's grid "
      << format_grid(opt.grid.tensor, world / (opt.grid.tensor * opt.grid.pipeline), opt.grid.pipeline)
      << " (a candidate without tp / pp runs at it)\n"
      << out.result.table();
  }
  ctx.comm().barrier();
  return out;
}

std::string autotune_report(const AutotuneOutcome& o) {
  std::string r = "--- autotune (memory per rank " + mib(o.memory_bytes) + ") ---\n" + o.result.table();
  if (!o.result.found) return r + "no candidate ran; the table is in " + o.table_path + "\n";
  const std::string step =
      fmt::format("{:.4g} s per step, {:.4g} samples/s", o.result.best_trial.step_s, o.result.best_trial.samples_per_s);
  return r + "fastest: " + o.result.best_trial.candidate.label() + " (" + step + ")\nwritten: " + o.config_path +
         " (train with: zero-gpt --config " + o.config_path + ", at the same rank count), " + o.table_path + "\n";
}

}  // namespace zero::gpt
