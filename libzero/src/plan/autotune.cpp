#include "zero/plan/autotune.hpp"

#include <fmt/format.h>

#include <chrono>
#include <fstream>
#include <sstream>

#include "zero/comm.hpp"
#include "zero/context.hpp"
#include "zero/error.hpp"

namespace zero {

namespace {

// The base config with the candidate's changes, resolved for `data_parallel` ranks at the
// base's global batch (the base is resolved for `base_data_parallel` when it is not yet).
// Throws (zero::Error) when the micro-batch does not divide the global batch.
Config apply(const Config& base, const TuneCandidate& c, int base_data_parallel, int data_parallel) {
  Config cfg = base;
  if (!cfg.resolved) cfg.resolve(base_data_parallel);
  const std::int64_t global = cfg.train_batch_size;
  auto& z = cfg.zero_optimization;
  if (c.stage) z.stage = *c.stage;
  if (c.bucket_size) z.reduce_bucket_size = z.allgather_bucket_size = *c.bucket_size;
  if (c.overlap_comm) z.overlap_comm = *c.overlap_comm;
  if (c.offload_optimizer) z.offload_optimizer.device = *c.offload_optimizer;
  if (c.hpz_partition_size) z.zero_hpz_partition_size = *c.hpz_partition_size;
  if (c.quantized_weights) z.zero_quantized_weights = *c.quantized_weights;
  if (c.quantized_gradients) z.zero_quantized_gradients = *c.quantized_gradients;
  if (c.mics_shard_size) z.mics_shard_size = *c.mics_shard_size;
  if (c.micro_batch) cfg.train_micro_batch_size_per_gpu = *c.micro_batch;
  // Derived from the global batch: another micro-batch or data-parallel size changes it.
  if (c.micro_batch || data_parallel != base_data_parallel) cfg.gradient_accumulation_steps = 0;
  cfg.train_batch_size = global;
  cfg.resolved = false;
  cfg.resolve(data_parallel);
  return cfg;
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

std::string TuneCandidate::label() const {
  std::ostringstream l;
  const char* sep = "";
  if (stage) {
    l << sep << "stage " << *stage;
    sep = ", ";
  }
  if (micro_batch) {
    l << sep << "mb " << *micro_batch;
    sep = ", ";
  }
  if (bucket_size) {
    l << sep << "bucket " << *bucket_size;
    sep = ", ";
  }
  if (overlap_comm) {
    l << sep << (*overlap_comm ? "overlap" : "no overlap");
    sep = ", ";
  }
  if (offload_optimizer) {
    l << sep << "offload " << to_string(*offload_optimizer);
    sep = ", ";
  }
  if (hpz_partition_size && *hpz_partition_size > 1) {
    l << sep << "hpz " << *hpz_partition_size;
    sep = ", ";
  }
  if (quantized_weights && *quantized_weights) {
    l << sep << "qwz";
    sep = ", ";
  }
  if (quantized_gradients && *quantized_gradients) {
    l << sep << "qgz";
    sep = ", ";
  }
  if (mics_shard_size && *mics_shard_size != -1) {
    l << sep << "mics " << *mics_shard_size;
    sep = ", ";
  }
  if (tensor_parallel) {
    l << sep << "tp " << *tensor_parallel;
    sep = ", ";
  }
  if (pipeline_parallel) {
    l << sep << "pp " << *pipeline_parallel;
    sep = ", ";
  }
  std::string s = l.str();
  return s.empty() ? "base" : s;
}

std::vector<TuneCandidate> tune_grid(const std::vector<int>& stages, const std::vector<std::int64_t>& micro_batches,
                                     const std::vector<std::int64_t>& bucket_sizes, const std::vector<bool>& overlap,
                                     const std::vector<OffloadDevice>& offload) {
  // An empty list is one "keep the base" value.
  auto opts = [](const auto& v) {
    using T = typename std::decay_t<decltype(v)>::value_type;
    std::vector<std::optional<T>> o(v.begin(), v.end());
    if (o.empty()) o.emplace_back();
    return o;
  };
  std::vector<TuneCandidate> out;
  for (auto st : opts(stages))
    for (auto mb : opts(micro_batches))
      for (auto b : opts(bucket_sizes))
        for (auto ov : opts(overlap))
          for (auto off : opts(offload)) {
            if (off && *off != OffloadDevice::none && st && *st == 0) continue;  // offload needs stage >= 1
            out.push_back(TuneCandidate{st, mb, b, ov, off, {}, {}, {}, {}, {}, {}});
          }
  return out;
}

std::vector<TuneCandidate> with_grids(const std::vector<TuneCandidate>& candidates, const std::vector<int>& tensor,
                                      const std::vector<int>& pipeline) {
  std::vector<std::optional<int>> ts(tensor.begin(), tensor.end()), ps(pipeline.begin(), pipeline.end());
  if (ts.empty()) ts.emplace_back();
  if (ps.empty()) ps.emplace_back();
  std::vector<TuneCandidate> out;
  for (const auto& t : ts)
    for (const auto& p : ps)
      for (TuneCandidate c : candidates) {
        c.tensor_parallel = t;
        c.pipeline_parallel = p;
        out.push_back(std::move(c));
      }
  return out;
}

std::vector<TuneCandidate> with_zero_plus_plus(const std::vector<TuneCandidate>& candidates, int base_stage,
                                               int node_ranks) {
  std::vector<TuneCandidate> out;
  for (const TuneCandidate& c : candidates) {
    out.push_back(c);
    const int stage = c.stage.value_or(base_stage);
    const bool grid = c.tensor_parallel.value_or(1) * c.pipeline_parallel.value_or(1) > 1;
    auto variant = [&](int hpz, bool qwz, bool qgz) {
      TuneCandidate v = c;
      if (hpz > 1) v.hpz_partition_size = hpz;
      if (qwz) v.quantized_weights = true;
      if (qgz) v.quantized_gradients = true;
      out.push_back(v);
    };
    if (stage == 3) {
      variant(1, true, false);
      if (node_ranks > 1) {
        variant(node_ranks, false, false);
        variant(node_ranks, true, false);
      }
      if (!grid) variant(node_ranks, true, true);  // all of ZeRO++ (hpZ 1: off)
    }
    if (stage == 2 && !grid) variant(1, false, true);
    if (stage >= 1 && stage <= 3 && !grid && node_ranks > 1) {
      TuneCandidate v = c;
      v.mics_shard_size = node_ranks;
      out.push_back(v);
    }
  }
  return out;
}

FitsFn plan_fits(const plan::GptShape& shape, const plan::Cluster& cluster) {
  return [shape, cluster](const Config& cfg, GridSpec grid, std::string& why) {
    plan::Settings s = plan::settings_from(cfg);
    s.tensor_parallel = grid.tensor;
    s.pipeline_parallel = grid.pipeline;
    const plan::Plan p = plan::make_plan(shape, cluster, s);
    why = p.why;
    return p.fits;
  };
}

TuneResult autotune(Context& ctx, const Config& base, const Layout& layout, const InitFn& init,
                    const TrainStepFn& train_step, const std::vector<TuneCandidate>& candidates,
                    const TuneOptions& options) {
  return autotune_per_engine(
      ctx, base, layout, init, [&train_step](Engine&) { return train_step; }, candidates, options);
}

TuneResult autotune_per_engine(Context& ctx, const Config& base, const Layout& layout, const InitFn& init,
                               const MakeTrainStepFn& make_train_step, const std::vector<TuneCandidate>& candidates,
                               const TuneOptions& options) {
  auto make_engine = [&ctx, &layout, &init](const Config& cfg, GridSpec grid) {
    ZERO_CHECK(grid.tensor == 1 && grid.pipeline == 1,
               fmt::format("autotune: a candidate with tensor {} x pipeline {} needs its own process groups and "
                           "its part of the model; use autotune_grid() with an engine factory",
                           grid.tensor, grid.pipeline));
    TuneEngine run;
    run.engine = std::make_unique<Engine>(ctx, cfg, layout);
    run.engine->init_params(init);
    return run;
  };
  return autotune_grid(
      ctx, base, make_engine, [&make_train_step](TuneEngine& run) { return make_train_step(*run.engine); }, candidates,
      options);
}

TuneResult autotune_grid(Context& ctx, const Config& base, const MakeEngineFn& make_engine,
                         const MakeGridStepFn& make_train_step, const std::vector<TuneCandidate>& candidates,
                         const TuneOptions& options) {
  ZERO_CHECK(!candidates.empty(), "autotune: no candidates; build some with tune_grid()");
  ZERO_CHECK(options.timed_steps >= 1 && options.warmup_steps >= 0,
             "autotune: timed_steps must be >= 1 and warmup_steps >= 0");
  Communicator& comm = ctx.comm();
  const int world = ctx.world_size();
  const int base_ranks = options.grid.tensor * options.grid.pipeline;
  ZERO_CHECK(base_ranks >= 1 && world % base_ranks == 0,
             fmt::format("autotune: the base grid tensor {} x pipeline {} does not divide the {} ranks; set "
                         "TuneOptions::grid to the sizes the base config runs with",
                         options.grid.tensor, options.grid.pipeline, world));
  TuneResult result;
  for (const auto& cand : candidates) {
    TuneTrial t;
    t.candidate = cand;
    t.grid = cand.grid(options.grid);
    const int ranks = t.grid.tensor * t.grid.pipeline;
    if (ranks < 1 || t.grid.tensor < 1 || world % ranks != 0) {
      t.outcome = TuneTrial::Outcome::refused;
      t.note =
          fmt::format("tensor {} x pipeline {} does not divide the {} ranks", t.grid.tensor, t.grid.pipeline, world);
      result.trials.push_back(std::move(t));
      continue;
    }
    Config cfg;
    try {
      cfg = apply(base, cand, world / base_ranks, world / ranks);
      if (options.record_grid) options.record_grid(cfg, t.grid);
    } catch (const Error& e) {
      t.note = e.what();
      result.trials.push_back(std::move(t));
      continue;
    }
    if (options.fits) {
      bool fits = false;
      try {
        fits = options.fits(cfg, t.grid, t.note);
        t.outcome = fits ? TuneTrial::Outcome::failed : TuneTrial::Outcome::does_not_fit;
      } catch (const Error& e) {
        t.outcome = TuneTrial::Outcome::refused;
        t.note = e.what();
      }
      if (!fits) {
        result.trials.push_back(std::move(t));
        continue;
      }
    }
    // A failure on any rank fails the candidate on every rank, so all ranks move on together.
    double elapsed = 0;
    std::string error;
    try {
      TuneEngine run = make_engine(cfg, t.grid);
      ZERO_CHECK(run.engine, "autotune: the engine factory returned no engine");
      const TrainStepFn train_step = make_train_step(run);
      for (int s = 0; s < options.warmup_steps; ++s) train_step(*run.engine);
      comm.barrier();
      const auto start = std::chrono::steady_clock::now();
      for (int s = 0; s < options.timed_steps; ++s) train_step(*run.engine);
      elapsed = seconds_since(start);
    } catch (const std::exception& e) {
      error = e.what();
    }
    const bool failed = comm.all_reduce_scalar(error.empty() ? 0.0 : 1.0, ReduceOp::max) > 0;
    if (failed) {
      t.note = error.empty() ? "failed on another rank" : error;
    } else {
      t.outcome = TuneTrial::Outcome::timed;
      t.step_s = comm.all_reduce_scalar(elapsed, ReduceOp::max) / options.timed_steps;
      t.samples_per_s = static_cast<double>(cfg.train_batch_size) / t.step_s;
      if (!result.found || t.step_s < result.best_trial.step_s) {
        result.found = true;
        result.best_index = static_cast<int>(result.trials.size());
        result.best = cfg;
        result.best_trial = t;
      }
    }
    result.trials.push_back(std::move(t));
  }
  if (ctx.rank() == 0) {
    if (!options.config_out.empty() && result.found) {
      std::ofstream f(options.config_out);
      ZERO_CHECK(f, "autotune: cannot write " + options.config_out + "; check the directory exists and is writable");
      f << "# autotune winner: " << result.best_trial.candidate.label() << ", " << result.best_trial.step_s
        << " s per step\n"
        << result.best.to_yaml();
    }
    if (!options.table_out.empty()) {
      std::ofstream f(options.table_out);
      ZERO_CHECK(f, "autotune: cannot write " + options.table_out + "; check the directory exists and is writable");
      f << result.table();
    }
  }
  comm.barrier();  // the files exist on every rank's return
  return result;
}

std::string TuneResult::table() const {
  std::ostringstream o;
  o << "candidate | outcome | step s | samples/s | note\n";
  for (std::size_t i = 0; i < trials.size(); ++i) {
    const TuneTrial& t = trials[i];
    o << t.candidate.label() << (static_cast<int>(i) == best_index ? " (best)" : "") << " | ";
    switch (t.outcome) {
      case TuneTrial::Outcome::timed: o << fmt::format("timed | {:.6f} | {:.1f} | ", t.step_s, t.samples_per_s); break;
      case TuneTrial::Outcome::does_not_fit: o << "does not fit | - | - | "; break;
      case TuneTrial::Outcome::failed: o << "failed | - | - | "; break;
      case TuneTrial::Outcome::refused: o << "refused | - | - | "; break;
    }
    o << t.note << "\n";
  }
  return o.str();
}

}  // namespace zero
