// zero-ckpt reshard (reshard_checkpoint): a checkpoint rewritten offline for another data-parallel
// size or ZeRO stage, or another tensor size with the pipeline kept or made 1, one shard at a time.
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "checkpoint/format.hpp"
#include "runtime/strings.hpp"
#include "zero/checkpoint.hpp"
#include "zero/error.hpp"
#include "zero/layout.hpp"

namespace zero {

namespace fs = std::filesystem;

namespace {

// Writes grid position (t, p)'s shards for `world` data-parallel ranks into tmp, one shard and
// one unit at a time (memory: one new slice plus what `read` holds): read(unit, begin, len, out)
// fills that slice of the unit's master (out[0]) and of each moment. Each shard written adds its
// bytes to `done` and calls progress(done). Returns the shards' records.
std::vector<ckpt::ShardMeta> write_position(
    const std::string& tmp, const std::vector<ckpt::UnitMeta>& units, const ckpt::Metadata& nm, int moments, int t,
    int p, const std::function<void(int, std::int64_t, std::int64_t, std::span<float* const>)>& read,
    std::uint64_t& done, const std::function<void(std::uint64_t)>& progress) {
  std::vector<ckpt::ShardMeta> shards;
  std::vector<float> section;
  std::vector<float*> out(static_cast<std::size_t>(1 + moments));
  for (int k = 0; k < nm.world; ++k) {
    std::vector<ckpt::ShardWriter::Range> ranges;
    for (const auto& u : units) {
      const std::int64_t b = std::min(static_cast<std::int64_t>(k) * u.slice, u.numel);
      ranges.push_back({b, std::min(b + u.slice, u.numel) - b});
    }
    const std::string file = nm.grid.split() ? ckpt::shard_file_name(k, t, p) : ckpt::shard_file_name(k);
    ckpt::ShardWriter w(tmp + "/" + file, k, nm.world, nm.stage, moments, nm.step, ranges, t, p);
    for (std::size_t i = 0; i < units.size(); ++i) {
      const auto len = ranges[i].len;
      section.resize(static_cast<std::size_t>(len) * out.size());
      for (std::size_t a = 0; a < out.size(); ++a) out[a] = section.data() + a * static_cast<std::size_t>(len);
      read(static_cast<int>(i), ranges[i].begin, len, out);
      w.add_section(section.data());
      done += section.size() * sizeof(float);
    }
    shards.push_back(w.finish());
    if (progress) progress(done);
  }
  return shards;
}

// Puts a written position into the new metadata: its place in the grid's list, or the units and
// shards of a checkpoint without a grid.
void place_position(ckpt::Metadata& nm, ckpt::PositionMeta pos) {
  if (!nm.grid.split()) {
    nm.units = std::move(pos.units);
    nm.shards = std::move(pos.shards);
    return;
  }
  nm.positions.resize(static_cast<std::size_t>(nm.grid.tensor * nm.grid.pipeline));
  nm.positions[static_cast<std::size_t>(pos.tensor + nm.grid.tensor * pos.pipeline)] = std::move(pos);
}

// The units of a part on a grid of `tensors` tensor ranks (every tensor rank's part has the same
// shapes): `units` (whole or a saved pipeline part's), each parameter cut from its whole tensor by its
// saved split. Errors name the parameter.
Layout part_layout(const ckpt::ModelReader& whole, const std::vector<ckpt::UnitMeta>& units, int tensors) {
  Layout layout;
  const auto& wu = whole.meta().units;
  for (const auto& u : units) {
    const auto at = static_cast<int>(
        std::find_if(wu.begin(), wu.end(), [&](const ckpt::UnitMeta& w) { return w.name == u.name; }) - wu.begin());
    std::vector<std::pair<std::string, Layout::Shape>> ps;
    std::vector<const ckpt::ParamMeta*> saved;
    for (const auto& q : u.params) {
      const auto& wps = wu[static_cast<std::size_t>(at)].params;
      const auto k = static_cast<int>(
          std::find_if(wps.begin(), wps.end(), [&](const ckpt::ParamMeta& w) { return w.name == q.name; }) -
          wps.begin());
      const ckpt::ParamMeta& sp = whole.saved_part(at, k);
      Layout::Shape shape = wps[static_cast<std::size_t>(k)].shape;
      if (tensors > 1 && !sp.replicated) {
        ZERO_CHECK(sp.split_axis >= 0,
                   fmt::format("reshard: parameter '{}' of unit '{}' is neither split nor replicated, so it cannot "
                               "be cut for TP {}",
                               escape_bytes(q.name), escape_bytes(u.name), tensors));
        auto& d = shape[static_cast<std::size_t>(sp.split_axis)];
        ZERO_CHECK(d % (static_cast<std::int64_t>(tensors) * sp.split_blocks) == 0,
                   fmt::format("reshard: parameter '{}' of unit '{}' ({}) cannot be cut for TP {}: its axis {} ({}) "
                               "does not divide into {} block(s) of {} parts",
                               escape_bytes(q.name), escape_bytes(u.name), shape_text(shape), tensors, sp.split_axis, d,
                               sp.split_blocks, tensors));
        d /= tensors;
      }
      ps.emplace_back(q.name, std::move(shape));
      saved.push_back(&sp);
    }
    const int id = layout.add_unit(u.name, std::move(ps));
    for (std::size_t k = 0; k < saved.size(); ++k) {
      if (saved[k]->replicated) layout.set_replicated(id, u.params[k].name);
      if (saved[k]->split_axis >= 0)
        layout.set_split(id, u.params[k].name, saved[k]->split_axis, saved[k]->split_blocks);
    }
  }
  return layout;
}

// reshard_checkpoint onto another tensor x pipeline grid: every position's shards cut from the
// whole tensors (ModelReader::read_part), one unit's slice at a time.
void reshard_grid(const std::string& dir, const ckpt::Metadata& old, const std::string& tmp, ckpt::Metadata& nm,
                  int tensors, int parts, const std::function<void(std::uint64_t, std::uint64_t)>& progress) {
  // Adafactor keeps a matrix's row and column statistics in the first places of its own array:
  // they describe the part of the matrix a tensor rank holds and cannot be cut anew.
  ZERO_CHECK(old.optimizer != "Adafactor" || tensors == old.grid.tensor,
             fmt::format("reshard: '{}' holds Adafactor's state, whose row and column statistics belong to each "
                         "tensor rank's part of a matrix and cannot be cut from the grid {} for TP {}",
                         dir, old.grid.describe(), tensors));
  ZERO_CHECK(old.tensor_records.empty() || tensors * parts == 1,
             fmt::format("reshard: '{}' holds {}'s values per parameter, and {} runs without tensor or pipeline "
                         "parallelism: reshard it for another data-parallel size or stage only (--world, --stage)",
                         dir, old.optimizer, old.optimizer));
  ckpt::ModelReader whole(dir);
  const int world = nm.world, moments = old.moments;
  const ckpt::GridMeta grid{tensors, parts};
  const std::string text = fmt::format("{} x DP {}", grid.describe(), world);
  nm.grid = grid.split() ? grid : ckpt::GridMeta{};
  nm.positions.clear();
  nm.units.clear();
  nm.shards.clear();
  std::uint64_t total = 0, done = 0;
  std::vector<Layout> layouts;
  for (int p = 0; p < parts; ++p)
    for (int t = 0; t < tensors; ++t) {
      // The saved part's units (the pipeline is kept), or the whole model's (cut to one part).
      const std::vector<ckpt::UnitMeta> units =
          parts == old.grid.pipeline ? ckpt::Reader(dir, old, 0, p).meta().units : whole.meta().units;
      layouts.push_back(part_layout(whole, units, tensors));
      for (int i = 0; i < layouts.back().num_units(); ++i)
        total += static_cast<std::uint64_t>(layouts.back().unit(i).numel) * static_cast<std::uint64_t>(1 + moments) *
                 sizeof(float);
    }
  for (int p = 0; p < parts; ++p)
    for (int t = 0; t < tensors; ++t) {
      const Layout& layout = layouts[static_cast<std::size_t>(t + tensors * p)];
      ckpt::PositionMeta pos{t, p, {}, {}};
      for (int i = 0; i < layout.num_units(); ++i)
        pos.units.push_back(ckpt::unit_meta(layout.unit(i), layout.slice_numel(i, world)));
      pos.shards = write_position(
          tmp, pos.units, nm, moments, t, p,
          [&](int i, std::int64_t begin, std::int64_t len, std::span<float* const> out) {
            whole.read_part(layout.unit(i), t, tensors, begin, len, out, text);
          },
          done,
          [&](std::uint64_t d) {
            if (progress) progress(d, total);
          });
      place_position(nm, std::move(pos));
    }
}

}  // namespace

void reshard_checkpoint(const std::string& path, const std::string& out_root, int world, int stage,
                        const std::string& tag, int tensor, int pipeline,
                        const std::function<void(std::uint64_t, std::uint64_t)>& progress) {
  ZERO_CHECK(world >= 1 && world <= (1 << 20), fmt::format("reshard: --world {} must be in [1, 2^20]", world));
  ZERO_CHECK(stage >= -1 && stage <= 3, fmt::format("reshard: --stage {} must be 0, 1, 2 or 3", stage));
  ZERO_CHECK(tensor == -1 || (tensor >= 1 && tensor < (1 << 16)),
             fmt::format("reshard: --tp {} must be in [1, 65535]", tensor));
  const std::string dir = ckpt::resolve(path, tag);
  const ckpt::Metadata old = ckpt::read_metadata_file(dir + "/" + ckpt::kMetadataFile);
  const int tensors = tensor < 0 ? old.grid.tensor : tensor, parts = pipeline < 0 ? old.grid.pipeline : pipeline;
  ZERO_CHECK(
      parts == old.grid.pipeline || parts == 1,
      fmt::format("reshard: --pp {}: '{}' was saved on the grid {}; the offline tool keeps the pipeline "
                  "size or makes it 1 (how a model cuts its pipeline parts is the model's). Resume the job at PP {} "
                  "directly: a load onto another grid cuts the pipeline parts itself",
                  pipeline, dir, old.grid.describe(), pipeline));
  ckpt::Metadata nm = old;
  nm.world = world;
  nm.stage = stage < 0 ? old.stage : stage;
  // Per-rank state (PowerSGD's error buffers and Q, qgZ's and the 1-bit exchange's errors) has
  // no meaning at another slicing: dropped. The optimizer's per-tensor values stay as they are.
  nm.rank_state_kind.clear();
  nm.rank_state_layout.clear();
  nm.rank_state.clear();

  // An offline tool never rolls a root back: into a root with newer steps it refuses.
  std::string tmp = ckpt::prepare(out_root, old.step, "reshard", /*refuse_older=*/true);
  try {
    if (tensors != old.grid.tensor || parts != old.grid.pipeline) {
      reshard_grid(dir, old, tmp, nm, tensors, parts, progress);
    } else {
      // Each grid position (or the one shard set without a grid) is cut anew for `world`
      // data-parallel ranks; the grid stays as it was.
      for (int p = 0; p < old.grid.pipeline; ++p)
        for (int t = 0; t < old.grid.tensor; ++t) {
          ckpt::Reader r(dir, old, t, p);
          ckpt::PositionMeta pos{t, p, r.meta().units, {}};
          // The new slicing is the engine's: rebuild the layout and ask it.
          Layout layout;
          for (const auto& u : pos.units) {
            std::vector<std::pair<std::string, Layout::Shape>> ps;
            for (const auto& q : u.params) ps.emplace_back(q.name, q.shape);
            layout.add_unit(u.name, std::move(ps));
          }
          for (std::size_t i = 0; i < pos.units.size(); ++i)
            pos.units[i].slice = layout.slice_numel(static_cast<int>(i), world);
          // Memory: one new slice plus the old section being cut, never a whole unit.
          std::uint64_t done = 0;
          pos.shards = write_position(tmp, pos.units, nm, old.moments, t, p,
                                      [&](int i, std::int64_t begin, std::int64_t len, std::span<float* const> out) {
                                        r.read_range(i, begin, len, out);
                                      },
                                      done, {});
          place_position(nm, std::move(pos));
        }
    }
    ckpt::write_metadata_file(tmp + "/" + ckpt::kMetadataFile, nm);
    ckpt::commit(out_root, tmp, old.step, 0, [](const char*) {});
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
}

}  // namespace zero
