// save_checkpoint / checkpoint_bytes: the collective parts, each phase that touches files inside
// agree() (checkpoint/agree.hpp); loading is in load.cpp, the space check and the directory locks
// in preflight.cpp.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
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

// Test hook: ZERO_CKPT_FAIL_AT=<point>[:exit|:kill] stops a save at a named point, as a crash
// would there (exit: _exit(86); kill: SIGKILL) or as an error every rank agrees on (default).
void fail_point(const char* point) {
  const char* env = std::getenv("ZERO_CKPT_FAIL_AT");
  if (!env || !*env) return;
  std::string_view v(env);
  auto colon = v.find(':');
  if (v.substr(0, colon) != point) return;
  std::string_view mode = colon == std::string_view::npos ? "throw" : v.substr(colon + 1);
  if (mode == "exit") {
    std::fflush(nullptr);
    ::_exit(86);
  }
  if (mode == "kill") ::raise(SIGKILL);
  ZERO_THROW("checkpoint save stopped at '" + std::string(point) + "' by ZERO_CKPT_FAIL_AT=" + std::string(v) +
             " (a test hook; unset the variable)");
}

std::string serialize(const ClientState& c) {
  std::string s;
  for (const auto& [k, v] : c) {
    s += fmt::format("{}:{}{}:{}", k.size(), k, v.size(), v);
  }
  return s;
}

// This rank's shard: slice `rank` of each unit for the current world size, clipped to the
// unit's real elements, read from the owned range (at stage 0 the owned range is the whole
// unit, identical on every rank, so the slices still add up to one copy). The shard records its
// grid position (tensor, pipeline), (0, 0) without a grid.
// The first value of `section` (unit `u`'s slice from element `begin`, master then moments) that
// is not finite, described; empty when all are.
std::string first_unfinite(const UnitInfo& u, const float* section, std::int64_t begin, std::int64_t len, int moments) {
  for (int k = 0; k <= moments; ++k)
    for (std::int64_t j = 0; j < len; ++j) {
      const float v = section[k * len + j];
      if (std::isfinite(v)) continue;
      const std::int64_t at = begin + j;
      for (const auto& p : u.params)
        if (at >= p.offset && at < p.offset + p.numel)
          return fmt::format("{} of parameter '{}' in unit '{}' is {} at index {}",
                             k == 0 ? std::string("the master weight") : fmt::format("optimizer moment {}", k), p.name,
                             u.name, v, at - p.offset);
    }
  return {};
}

// Writes this rank's shard; `unfinite` describes its first value that is not finite, if any.
ckpt::ShardMeta write_shard(EngineState& e, const std::string& path, std::int64_t step, int tensor, int pipeline,
                            std::string& unfinite) {
  const int moments = e.optimizer_moments();
  std::vector<ckpt::ShardWriter::Range> ranges;
  for (int i = 0; i < e.layout().num_units(); ++i) {
    const std::int64_t slice = e.slice(i), numel = e.layout().unit(i).numel;
    std::int64_t b = std::min(static_cast<std::int64_t>(e.rank()) * slice, numel);
    std::int64_t end = std::min(b + slice, numel);
    ranges.push_back({b, end - b});
  }
  ckpt::ShardWriter w(path, e.rank(), e.world_size(), e.stage(), moments, step, ranges, tensor, pipeline);
  std::vector<float> owned, section;
  for (int i = 0; i < e.layout().num_units(); ++i) {
    const OwnedRange u = e.owned_range(i);
    const auto& r = ranges[static_cast<std::size_t>(i)];
    ZERO_CHECK(r.len == 0 || (r.begin >= u.begin && r.begin + r.len <= u.begin + u.len),
               "save_checkpoint: unit '" + e.layout().unit(i).name + "': slice outside the owned range");
    owned.resize(static_cast<std::size_t>(u.len));
    section.resize(static_cast<std::size_t>(r.len) * static_cast<std::size_t>(1 + moments));
    for (int k = 0; k <= moments; ++k) {
      e.read_owned(i, k, owned.data());
      if (r.len > 0)
        std::copy_n(owned.data() + (r.begin - u.begin), r.len,
                    section.data() + static_cast<std::size_t>(k) * static_cast<std::size_t>(r.len));
    }
    if (unfinite.empty()) unfinite = first_unfinite(e.layout().unit(i), section.data(), r.begin, r.len, moments);
    w.add_section(section.data());
    if (i == 0) fail_point("mid_shard");
  }
  return w.finish();
}

ckpt::Metadata make_metadata(EngineState& e, const TrainingState& st, const ClientState& client,
                             std::vector<ckpt::ShardMeta> shards) {
  ckpt::Metadata m;
  m.step = st.step;
  m.applied = st.applied;
  m.world = e.world_size();
  m.stage = e.stage();
  m.compute_dtype = e.compute_dtype();
  m.optimizer = to_string(e.config().optimizer.type);
  m.moments = e.optimizer_moments();
  m.scaler_dynamic = e.loss_scale_dynamic();
  m.scaler = st.scaler;
  m.scheduler = to_string(e.config().scheduler.type);
  m.scheduler_step = st.applied;  // the scheduler is stepped by applied updates
  m.loop_lr = st.lr;
  for (int i = 0; i < e.layout().num_units(); ++i) m.units.push_back(ckpt::unit_meta(e.layout().unit(i), e.slice(i)));
  m.shards = std::move(shards);
  m.tensor_records = e.tensor_records();
  m.client = client;
  m.config_yaml = e.config().to_yaml();
  return m;
}

std::string shard_name(const GridPlace& at, int rank) {
  return at.grid.split() ? ckpt::shard_file_name(rank, at.tensor, at.pipeline) : ckpt::shard_file_name(rank);
}

// Collective over the world: every position's units and shards, as its data-parallel rank 0
// holds them, in position order (tensor fastest). The metadata is small: each position's text
// is broadcast from its first rank.
std::vector<ckpt::PositionMeta> gather_positions(EngineState& e, const GridPlace& at, ckpt::PositionMeta mine) {
  ProcessGroups& g = *e.groups();
  Communicator& world = e.world_comm();
  std::vector<ckpt::PositionMeta> out;
  for (int p = 0; p < at.grid.pipeline; ++p)
    for (int t = 0; t < at.grid.tensor; ++t) {
      const int root = g.world_rank({.tensor = t, .data = 0, .pipeline = p});
      std::string text = world.rank() == root ? ckpt::position_to_json(mine, e.world_size()) : std::string();
      std::uint64_t len = text.size();
      world.broadcast(&len, sizeof len, root);
      text.resize(static_cast<std::size_t>(len));
      world.broadcast(text.data(), text.size(), root);
      out.push_back(ckpt::position_from_json(text, e.world_size(), t, p, "the checkpoint's position list"));
    }
  return out;
}

}  // namespace

void save_checkpoint(Engine& engine, const std::string& root, const ClientState& client,
                     const CheckpointOptions& opts) {
  EngineState e(engine);
  // Host memory: the MPI communicators, whatever the backend uses. The root, the commit and the
  // agreement on errors span the world; shards are cut over each position's data-parallel group.
  Communicator& comm = e.world_comm();
  Communicator& data = e.host_comm();
  const GridPlace at = grid_place(e);
  agree(comm, [&] {
    ZERO_CHECK(e.initialized(),
               "save_checkpoint: parameters are not initialised; call init_params or load_checkpoint first");
    e.check_between_steps("save_checkpoint");
    ZERO_CHECK(!root.empty(), "save_checkpoint: the checkpoint root is empty; pass a directory");
    ZERO_CHECK(opts.keep_last >= 0, fmt::format("save_checkpoint: keep_last = {} is negative; use 0 to keep every "
                                                "checkpoint",
                                                opts.keep_last));
  });
  same_on_all_ranks(comm, root, "the checkpoint root");
  const bool leader = comm.rank() == 0;
  same_on_all_ranks(comm, serialize(client), "the client state");

  const TrainingState st = e.training_state();
  if (at.grid.split()) same_on_all_ranks(comm, std::to_string(st.step), "the step count (every position's engine)");
  const std::string tmp = root + "/.tmp_" + ckpt::step_dir_name(st.step);
  agree(comm, [&] {
    if (leader) (void)ckpt::prepare(root, st.step, "save_checkpoint");
  });
  try {
    ckpt::ShardMeta mine, mine_state;
    std::string unfinite;
    const std::string state_kind = e.rank_state_kind();
    const bool rank_state = !state_kind.empty();
    agree(comm, [&] {
      // With MiCS the other groups hold the same slices: the first group's shards are the checkpoint.
      if (e.writes_shards()) {
        mine = write_shard(e, tmp + "/" + shard_name(at, e.rank()), st.step, at.tensor, at.pipeline, unfinite);
        if (rank_state)
          mine_state = ckpt::write_rank_state_file(tmp + "/" + ckpt::rank_state_file_name(e.rank()), e.rank_state());
      }
      fail_point("after_shard");
    });
    // A model that diverged is not saved: it would become `latest` and, under keep_last, push
    // the finite checkpoints out. Every rank learns whether any rank's slice held a NaN or an
    // infinity, and all refuse together; the partial directory goes (below).
    const double unfinite_ranks = comm.all_reduce_scalar(unfinite.empty() ? 0.0 : 1.0, ReduceOp::sum);
    if (unfinite_ranks > 0)
      ZERO_THROW(fmt::format(
          "save_checkpoint: step {} was not saved: {}, which is not finite (the training diverged). "
          "`latest` and every earlier checkpoint in '{}' are kept, none is pruned; resume from "
          "the latest with a lower learning rate or gradient clipping",
          st.step,
          unfinite.empty() ? fmt::format("{} other rank(s) hold a value (their messages name it)", unfinite_ranks)
                           : unfinite,
          root));
    // Rank 0 records every shard's size and index checksum, binding the shards to the metadata.
    // Shard r's writer is data-parallel rank r (engine_state.hpp).
    std::vector<ckpt::ShardMeta> shards(static_cast<std::size_t>(e.world_size())), states;
    for (int r = 0; r < e.world_size(); ++r) {
      std::uint64_t v[4] = {mine.bytes, mine.index_checksum, mine_state.bytes, mine_state.index_checksum};
      data.broadcast(v, sizeof v, r);
      shards[static_cast<std::size_t>(r)] = {shard_name(at, r), v[0], v[1]};
      if (rank_state) states.push_back({ckpt::rank_state_file_name(r), v[2], v[3]});
    }
    ckpt::Metadata meta = make_metadata(e, st, client, std::move(shards));
    if (rank_state) {  // (PowerSGD, qgZ and the 1-bit optimizers run without tensor or pipeline parallelism)
      meta.rank_state_kind = state_kind;
      meta.rank_state_layout = e.rank_state_layout();
      meta.rank_state = std::move(states);
    }
    if (at.grid.split()) {
      meta.grid = at.grid;
      meta.positions = gather_positions(e, at, {at.tensor, at.pipeline, std::move(meta.units), std::move(meta.shards)});
      meta.units.clear();
      meta.shards.clear();
    }
    agree(comm, [&] {
      if (!leader) return;
      ckpt::write_metadata_file(tmp + "/" + ckpt::kMetadataFile, meta);
      ckpt::commit(root, tmp, st.step, opts.keep_last, fail_point);
    });
  } catch (...) {
    // An error (not a crash): remove the partial directory now rather than at the next save.
    if (leader) {
      std::error_code ec;
      std::filesystem::remove_all(tmp, ec);
    }
    throw;
  }
}
std::uint64_t checkpoint_bytes(Engine& engine, std::uint64_t block_size) {
  EngineState e(engine);
  const std::uint64_t bs = std::max<std::uint64_t>(block_size, 1);
  auto block = [bs](std::uint64_t b) { return (b + bs - 1) / bs * bs; };
  const std::size_t units = static_cast<std::size_t>(e.layout().num_units());
  std::uint64_t total = 0;
  for (int r = 0; r < e.world_size(); ++r) {
    std::uint64_t elements = 0;  // rank r's slices, clipped to each unit's real elements
    for (int i = 0; i < e.layout().num_units(); ++i) {
      const std::int64_t slice = e.slice(i), numel = e.layout().unit(i).numel;
      const std::int64_t b = std::min(static_cast<std::int64_t>(r) * slice, numel);
      elements += static_cast<std::uint64_t>(std::min(b + slice, numel) - b);
    }
    total += block(ckpt::shard_file_bytes(units, e.optimizer_moments(), elements));
  }
  if (!e.rank_state_kind().empty())  // one per rank, as large on every rank
    total +=
        static_cast<std::uint64_t>(e.world_size()) * block(ckpt::kHeaderBytes + e.rank_state_size() * sizeof(float));
  // Under a grid every position saves its own shards: the model group holds one of each.
  if (e.model_parallel())
    total =
        static_cast<std::uint64_t>(e.groups()->model().all_reduce_scalar(static_cast<double>(total), ReduceOp::sum));
  std::vector<ckpt::ShardMeta> shards(static_cast<std::size_t>(e.world_size()),
                                      ckpt::ShardMeta{"shard_00000.ckpt", 0, 0});
  const std::string meta = make_metadata(e, e.training_state(), {}, std::move(shards)).to_json();
  return total + block(ckpt::kHeaderBytes + meta.size());
}

}  // namespace zero
