// load_checkpoint: the same grid reads its own shards' overlapping slices, another grid cuts
// each rank's part from the saved whole tensors (ModelReader); every check before anything changes.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "checkpoint/agree.hpp"
#include "checkpoint/format.hpp"
#include "checkpoint/grid_place.hpp"
#include "runtime/log.hpp"
#include "runtime/strings.hpp"
#include "zero/checkpoint.hpp"
#include "zero/comm.hpp"
#include "zero/engine.hpp"
#include "zero/engine_state.hpp"
#include "zero/error.hpp"
#include "zero/groups.hpp"

namespace zero {

using ckpt::grid_place;
using ckpt::GridPlace;

namespace {

// How a parameter lies over the tensor group, for messages.
std::string split_text(bool replicated, int axis, int blocks) {
  if (replicated) return "replicated over the tensor group";
  if (axis < 0) return "not split";
  return fmt::format("split along axis {}{}", axis, blocks > 1 ? fmt::format(" in {} blocks", blocks) : "");
}

// What a kind of per-rank state is, and what a run without it starts from (for the log).
std::string rank_state_what(const std::string& kind) {
  if (kind == "powersgd") return "PowerSGD's error buffers and Q";
  if (kind == "qgz") return "qgZ's error-feedback buffers";
  if (kind == "onebit") return "the 1-bit exchange's error buffers and shared momentum";
  return "per-rank state of kind '" + kind + "'";
}
std::string rank_state_start(const std::string& kind) {
  if (kind == "onebit") return "zero errors and the momentum restored in fp32";
  return kind == "powersgd" ? "zero error buffers and the seeded Q" : "zero (under one step's quantization error)";
}

// Restores this rank's own state (EngineState::rank_state: PowerSGD's or qgZ's) where the
// checkpoint holds it of the same kind, for this world size and layout. Otherwise (another world
// size or node layout, a checkpoint saved without it, another PowerSGD rank) the run continues
// from the start's state, and rank 0 says why: the state is one rank's share of what was not
// yet sent, with no meaning for another place among the ranks. The decision rests on the
// metadata and the sizes, the same on every rank.
void restore_rank_state(EngineState& e, const ckpt::Reader& r) {
  const ckpt::Metadata& m = r.meta();
  const bool lead = e.rank() == 0;
  const std::string kind = e.rank_state_kind();
  if (kind.empty()) {
    if (lead && !m.rank_state.empty())
      log_info("load_checkpoint: the checkpoint's per-rank {} are not used: this run keeps none",
               rank_state_what(m.rank_state_kind));
    return;
  }
  std::vector<float> s;
  std::string why;
  const std::string layout = e.rank_state_layout();
  if (m.rank_state.empty())
    why = "the checkpoint holds none (saved without them)";
  else if (m.rank_state_kind != kind)
    why = "the checkpoint holds " + rank_state_what(m.rank_state_kind) + " instead";
  else if (m.world != e.world_size())
    why = fmt::format("it was saved by {} ranks, this run has {}", m.world, e.world_size());
  else if (m.rank_state_layout != layout)
    why = fmt::format("they were saved for {}, this run is {}", m.rank_state_layout, layout);
  else
    s = ckpt::read_rank_state_file(r.dir() + "/" + m.rank_state[static_cast<std::size_t>(e.rank())].file,
                                   m.rank_state[static_cast<std::size_t>(e.rank())]);
  const std::size_t want = e.rank_state_size();
  if (why.empty() && s.size() != want) {
    why = fmt::format("they hold {} values per rank, this run's {}{}", s.size(), want,
                      kind == "powersgd" ? " (another rank or min_compression_rate?)" : " (another layout of units?)");
    s.clear();
  }
  if (lead && !why.empty())
    log_warning("load_checkpoint: {} start again from {}: {}; the rest of the state is restored in full",
                rank_state_what(kind), rank_state_start(kind), why);
  e.set_rank_state(s);  // empty: the start's state
}

// The checkpoint must describe the engine's model exactly; errors name the metadata field.
// `units`: where the units are in the metadata ("units", or a grid position's).
// `tensors`: the tensor size of the grid both run on (a split means nothing at 1).
void check_units(const EngineState& e, const ckpt::Metadata& m, const std::string& dir, const std::string& units,
                 int tensors) {
  const std::string file = "checkpoint file '" + dir + "/" + ckpt::kMetadataFile + "': field '";
  const std::string fix = "; load it into the model it was saved from (the same Layout)";
  const Layout& l = e.layout();
  if (static_cast<int>(m.units.size()) != l.num_units())
    ZERO_THROW(fmt::format("{}{}' lists {} units, the engine's layout has {}{}", file, units, m.units.size(),
                           l.num_units(), fix));
  for (int i = 0; i < l.num_units(); ++i) {
    const UnitInfo& ui = l.unit(i);
    const ckpt::UnitMeta& cu = m.units[static_cast<std::size_t>(i)];
    std::string at = fmt::format("{}{}[{}]", file, units, i);
    if (cu.name != ui.name)
      ZERO_THROW(fmt::format("{}.name' = \"{}\", the engine's unit {} is \"{}\"{}", at, escape_bytes(cu.name), i,
                             ui.name, fix));
    if (cu.params.size() != ui.params.size())
      ZERO_THROW(fmt::format("{}.params' lists {} parameters for unit '{}', the engine has {}{}", at, cu.params.size(),
                             ui.name, ui.params.size(), fix));
    for (std::size_t k = 0; k < ui.params.size(); ++k) {
      const auto& cp = cu.params[k];
      const auto& p = ui.params[k];
      std::string pat = fmt::format("{}.params[{}]", at, k);
      if (cp.name != p.name)
        ZERO_THROW(pat + ".name' = \"" + escape_bytes(cp.name) + "\", the engine's parameter is \"" + p.name +
                   "\" (unit '" + ui.name + "')" + fix);
      if (cp.shape != p.shape)
        ZERO_THROW(pat + ".shape' = " + shape_text(cp.shape) + " for '" + p.name + "', the engine's is " +
                   shape_text(p.shape) + fix);
      if (tensors > 1 &&
          (cp.replicated != p.replicated || cp.split_axis != p.split_axis || cp.split_blocks != p.split_blocks))
        ZERO_THROW(fmt::format("{}' ('{}') is {}, the engine's parameter is {}{}", pat, p.name,
                               split_text(cp.replicated, cp.split_axis, cp.split_blocks),
                               split_text(p.replicated, p.split_axis, p.split_blocks), fix));
    }
  }
}

// The checkpoint's optimizer state must be the engine's kind; the dtype and optimizer the same
// unless a config change is allowed.
void check_state(const EngineState& e, const ckpt::Metadata& m, const std::string& dir,
                 const CheckpointLoadOptions& o) {
  const std::string file = "checkpoint file '" + dir + "/" + ckpt::kMetadataFile + "': field '";
  // Adam, AdamW, Lamb, OneBitAdam and OneBitLamb keep the same m and v, SGD and Lion a momentum of the same meaning;
  // the others' arrays mean something of their own (Adafactor's hold its row and column statistics). A change of
  // optimizer within a family is a config change, across families never.
  auto family = [](std::string_view name) -> std::string_view {
    if (name == "Adam" || name == "AdamW" || name == "Lamb" || name == "OneBitAdam" || name == "OneBitLamb")
      return "Adam";
    if (name == "SGD" || name == "Lion") return "SGD";
    return name;
  };
  const std::string_view mine = to_string(e.config().optimizer.type);
  // In the Adam family m and v come first; OneBitLamb's fresh variance after them is read where
  // saved, else starts at zero (common_moments), and OneBitLamb refuses to go past freeze_step
  // without it (set_tensor_records).
  if (m.moments != e.optimizer_moments() && (family(m.optimizer) != "Adam" || family(mine) != "Adam"))
    ZERO_THROW(
        fmt::format("{}optimizer_moments' = {} ({}), the engine's optimizer keeps {}; use the optimizer the "
                    "checkpoint was trained with",
                    file, m.moments, m.optimizer, e.optimizer_moments()));
  if (family(m.optimizer) != family(mine))
    ZERO_THROW(file + "optimizer' = " + escape_bytes(m.optimizer) + ", the engine's optimizer is " + std::string(mine) +
               ", whose state means something else; resume with " + escape_bytes(m.optimizer) +
               " (a change between Adam, AdamW, Lamb, OneBitAdam and OneBitLamb, or between SGD and Lion, needs "
               "CheckpointLoadOptions::allow_config_change)");
  if (o.allow_config_change) return;
  if (m.compute_dtype != e.compute_dtype())
    ZERO_THROW(file + "compute_dtype' = " + std::string(dtype_name(m.compute_dtype)) + ", the engine computes in " +
               std::string(dtype_name(e.compute_dtype())) +
               "; use the same bf16/fp16 settings, or set CheckpointLoadOptions::allow_config_change");
  if (m.optimizer != to_string(e.config().optimizer.type))
    ZERO_THROW(file + "optimizer' = " + escape_bytes(m.optimizer) + ", the engine's optimizer is " +
               to_string(e.config().optimizer.type) +
               "; use the same optimizer, or set CheckpointLoadOptions::allow_config_change");
}

// Restores every unit's owned range, one unit at a time: read(unit, range, out) fills out[0]
// (the master) and out[k] (moment k) for the range, for the `saved` moments the checkpoint
// holds; the engine's moments past them start at zero.
void restore_owned(EngineState& e, int saved,
                   const std::function<void(int, const OwnedRange&, std::span<float* const>)>& read) {
  std::vector<std::vector<float>> buf(static_cast<std::size_t>(1 + e.optimizer_moments()));
  std::vector<float*> out(buf.size());
  const std::size_t common = std::min(buf.size(), static_cast<std::size_t>(1 + saved));
  for (int i = 0; i < e.layout().num_units(); ++i) {
    const OwnedRange u = e.owned_range(i);
    for (std::size_t k = 0; k < buf.size(); ++k) {
      buf[k].assign(static_cast<std::size_t>(u.len), 0.0f);
      out[k] = buf[k].data();
    }
    read(i, u, std::span<float* const>(out.data(), common));
    // Master first: a store may reset the moments when the master is written.
    for (std::size_t k = 0; k < buf.size(); ++k) e.write_owned(i, static_cast<int>(k), buf[k].data());
  }
}

std::string job_grid(const GridPlace& at, int data_size) {
  return fmt::format("{} x DP {}", at.grid.describe(), data_size);
}

// Collective over the world, on another grid than the checkpoint's: every parameter of the
// saved whole model must be held somewhere in this job's (each rank reads only its own part, so
// a model that lost a parameter would load without a word otherwise). Held: by this rank's
// layout, named by unit and parameter.
void check_whole_model_held(EngineState& e, const ckpt::ModelReader& whole, const std::string& grid) {
  std::vector<float> held;
  std::vector<std::string> names;
  const Layout& l = e.layout();
  for (const auto& u : whole.meta().units)
    for (const auto& p : u.params) {
      int i = l.num_units() - 1;
      while (i >= 0 && l.unit(i).name != u.name) --i;
      held.push_back(i >= 0 && l.unit(i).find_param(p.name) >= 0 ? 1.0f : 0.0f);
      names.push_back(fmt::format("'{}' of unit '{}'", escape_bytes(p.name), escape_bytes(u.name)));
    }
  e.world_comm().all_reduce(held.data(), held.size(), DType::f32, ReduceOp::max);
  std::vector<std::string> lost;
  for (std::size_t i = 0; i < held.size(); ++i)
    if (held[i] == 0.0f) lost.push_back(names[i]);
  if (!lost.empty())
    ZERO_THROW(
        fmt::format("load_checkpoint: '{}' (saved on the grid {}) holds {} parameter(s) that no rank of this "
                    "job ({}) holds: {}; it is another model",
                    whole.dir(), whole.grid().describe(), lost.size(), grid, fmt::join(lost, ", ")));
}

// What a load does, in words (rank 0 logs it; a dry run stops there).
std::string load_plan(const EngineState& e, const GridPlace& at, const ckpt::Metadata& m, const std::string& dir,
                      const ckpt::ModelReader* whole) {
  const std::string from = fmt::format(
      "'{}' was saved on the grid {} x DP {} at stage {}, this job runs {} at stage {}", dir,
      (whole ? whole->grid() : m.grid).describe(), m.world, m.stage, job_grid(at, e.world_size()), e.stage());
  if (!whole) return from + ": each rank reads the saved slices that overlap its own";
  std::int64_t params = 0, elements = 0, cut = 0, cut_elements = 0;
  const auto& units = whole->meta().units;
  for (std::size_t u = 0; u < units.size(); ++u)
    for (std::size_t k = 0; k < units[u].params.size(); ++k) {
      const ckpt::ParamMeta& sp = whole->saved_part(static_cast<int>(u), static_cast<int>(k));
      const std::int64_t n = units[u].params[k].numel;
      ++params;
      elements += n;
      if (sp.split_axis >= 0 && !sp.replicated && whole->grid().tensor != at.grid.tensor) {
        ++cut;
        cut_elements += n;
      }
    }
  return fmt::format(
      "{}: {} of {} parameters ({} of {} elements) are cut anew across the tensor group, with their {} "
      "state ({} moment(s)) alike; the others are read whole; units go to this job's pipeline parts by name{} "
      "(docs/checkpoints.md)",
      from, cut, params, cut_elements, elements, m.optimizer, m.moments,
      e.rank_state_kind().empty() ? "" : "; " + rank_state_what(e.rank_state_kind()) + " start again");
}

// The load onto another tensor or pipeline size: each rank's owned range of every unit is cut
// from the saved whole tensors (ModelReader::read_part), master and every moment alike, reading
// only the saved sections that overlap it. Per-rank state is dropped, as at another world size.
// dry_run: every check, nothing read or changed.
void load_regridded(EngineState& e, const GridPlace& at, ckpt::ModelReader& whole, bool dry_run) {
  const std::string grid = job_grid(at, e.world_size());
  check_whole_model_held(e, whole, grid);
  if (dry_run) {
    for (int i = 0; i < e.layout().num_units(); ++i)  // the parameters' checks, no range
      whole.read_part(e.layout().unit(i), at.tensor, at.grid.tensor, 0, 0, {}, grid);
    return;
  }
  restore_owned(e, whole.meta().moments, [&](int i, const OwnedRange& u, std::span<float* const> out) {
    whole.read_part(e.layout().unit(i), at.tensor, at.grid.tensor, u.begin, u.len, out, grid);
  });
  e.set_tensor_records({});  // (no optimizer that keeps them runs on a grid)
  if (!e.rank_state_kind().empty()) {
    if (e.world_comm().rank() == 0)
      log_warning("load_checkpoint: {} start again from {}: the checkpoint was saved on another grid",
                  rank_state_what(e.rank_state_kind()), rank_state_start(e.rank_state_kind()));
    e.set_rank_state({});
  }
}

}  // namespace

ClientState load_checkpoint(Engine& engine, const std::string& root, const std::string& tag,
                            const CheckpointLoadOptions& opts) {
  EngineState e(engine);
  Communicator& comm = e.world_comm();  // host memory: MPI, whatever the backend uses
  const GridPlace at = grid_place(e);
  same_on_all_ranks(comm, root + "\n" + tag, "the checkpoint root or tag");
  std::unique_ptr<ckpt::Reader> reader;      // the same grid: this position's shards
  std::unique_ptr<ckpt::ModelReader> whole;  // another grid: the whole model's
  std::string dir;
  agree(comm, [&] {
    e.check_between_steps("load_checkpoint");
    dir = ckpt::resolve(root, tag);
    if (comm.rank() == 0 && opts.lock_root) ckpt::lock_root(root, false);
    const ckpt::Metadata meta = ckpt::read_metadata_file(dir + "/" + ckpt::kMetadataFile);
    check_state(e, meta, dir, opts);
    if (meta.grid.tensor == at.grid.tensor && meta.grid.pipeline == at.grid.pipeline) {
      reader = std::make_unique<ckpt::Reader>(dir, meta, at.tensor, at.pipeline);
      check_units(e, reader->meta(), dir,
                  at.grid.split() ? fmt::format("grid.positions[{}].units", at.tensor + at.grid.tensor * at.pipeline)
                                  : std::string("units"),
                  at.grid.tensor);
    } else {
      // Adafactor keeps each matrix's row and column statistics for the part a tensor rank holds
      // (reshard refuses the same): cut anew they would be another matrix's.
      ZERO_CHECK(meta.optimizer != "Adafactor" || meta.grid.tensor == at.grid.tensor,
                 fmt::format("checkpoint '{}' holds Adafactor's state at tensor parallelism {}, whose row and "
                             "column statistics belong to each rank's part of a matrix and cannot be cut for "
                             "tensor parallelism {}; resume at tensor parallelism {}",
                             dir, meta.grid.tensor, at.grid.tensor, meta.grid.tensor));
      whole = std::make_unique<ckpt::ModelReader>(dir);
    }
  });
  same_on_all_ranks(comm, dir, "the checkpoint directory that '" + tag + "' names (was it replaced during the load?)");
  const ckpt::Metadata& m = reader ? reader->meta() : whole->meta();
  if (comm.rank() == 0 && (whole || opts.dry_run))
    log_info("load_checkpoint{}: {}", opts.dry_run ? " (dry run, nothing is loaded)" : "",
             load_plan(e, at, m, dir, whole.get()));
  if (opts.dry_run) {
    if (whole) agree(comm, [&] { load_regridded(e, at, *whole, true); });
    return m.client;
  }
  agree(comm, [&] {
    e.begin_restore();
    if (whole) {
      load_regridded(e, at, *whole, false);
      return;
    }
    restore_owned(e, m.moments, [&](int i, const OwnedRange& u, std::span<float* const> out) {
      reader->read_range(i, u.begin, u.len, out);
    });
    restore_rank_state(e, *reader);
    // The optimizer's per-tensor values are its own: another optimizer's (or none) are not used.
    const bool records = m.optimizer == to_string(e.config().optimizer.type) && m.moments == e.optimizer_moments();
    e.set_tensor_records(records ? m.tensor_records : std::map<std::string, std::vector<double>>{});
  });
  TrainingState st{m.step, m.applied, m.scaler, m.loop_lr};
  e.finish_restore(st, m.scaler_dynamic && e.loss_scale_dynamic());
  return m.client;
}

}  // namespace zero
