// The whole model of a checkpoint (see ckpt::ModelReader in checkpoint/format.hpp): every grid
// position's shard set opened, and each parameter put back together from its parts.
#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "checkpoint/format.hpp"
#include "runtime/part_cut.hpp"
#include "runtime/strings.hpp"
#include "zero/error.hpp"

namespace zero::ckpt {

ModelReader::~ModelReader() = default;

ModelReader::ModelReader(const std::string& step_dir) : dir_(step_dir) {
  Metadata saved = read_metadata_file(step_dir + "/" + kMetadataFile);
  grid_ = saved.grid;
  const int T = grid_.tensor, P = grid_.pipeline;
  for (int p = 0; p < P; ++p)
    for (int t = 0; t < T; ++t) readers_.push_back(std::make_unique<Reader>(step_dir, saved, t, p));
  meta_ = saved;
  meta_.grid = {};
  meta_.positions.clear();
  meta_.shards.clear();
  meta_.units.clear();
  if (!grid_.split()) {
    meta_.units = readers_[0]->meta().units;
    for (std::size_t u = 0; u < meta_.units.size(); ++u) {
      sources_.emplace_back();
      for (std::size_t k = 0; k < meta_.units[u].params.size(); ++k)
        sources_.back().push_back({0, static_cast<int>(u), static_cast<int>(k)});
    }
    return;
  }
  std::map<std::string, std::size_t> unit_at;  // whole unit by name
  for (int p = 0; p < P; ++p) {
    const std::vector<UnitMeta>& first = readers_[static_cast<std::size_t>(T * p)]->meta().units;
    // Every tensor rank of a pipeline part holds the same units and parameters, its own part of each:
    // Metadata::parse refused any other grid (ckpt::position_disagreements).
    for (std::size_t u = 0; u < first.size(); ++u) {
      const UnitMeta& part = first[u];
      auto [it, fresh] = unit_at.try_emplace(part.name, meta_.units.size());
      if (fresh) {
        meta_.units.push_back({part.name, 0, 0, {}});
        sources_.emplace_back();
      }
      UnitMeta& whole = meta_.units[it->second];
      for (std::size_t k = 0; k < part.params.size(); ++k) {
        const ParamMeta& pm = part.params[k];
        const bool held = std::any_of(whole.params.begin(), whole.params.end(),
                                      [&](const ParamMeta& q) { return q.name == pm.name; });
        if (held) continue;  // a lower pipeline part has it (a tied embedding)
        ZERO_CHECK(T == 1 || pm.replicated || pm.split_axis >= 0,
                   fmt::format("checkpoint '{}': parameter '{}' of unit '{}' is neither split nor replicated over "
                               "the {} tensor ranks, so its parts cannot be put together; declare it with "
                               "Layout::set_split or set_replicated in the model that saves",
                               dir_, escape_bytes(pm.name), escape_bytes(part.name), T));
        ParamMeta w = pm;
        if (pm.split_axis >= 0) w.shape[static_cast<std::size_t>(pm.split_axis)] *= T;
        w.numel = pm.numel * (pm.split_axis >= 0 ? T : 1);
        w.offset = whole.numel;
        w.replicated = false;
        w.split_axis = -1;
        w.split_blocks = 1;
        whole.numel += w.numel;
        whole.slice = whole.numel;
        whole.params.push_back(std::move(w));
        sources_[it->second].push_back({p, static_cast<int>(u), static_cast<int>(k)});
      }
    }
  }
}

void ModelReader::read_unit(int unit, float* master) {
  float* out[] = {master};
  read_unit(unit, out);
}

void ModelReader::read_unit(int unit, std::span<float* const> out) {
  ZERO_CHECK(unit >= 0 && static_cast<std::size_t>(unit) < meta_.units.size(),
             fmt::format("checkpoint '{}' has no unit {}", dir_, unit));
  ZERO_CHECK(!out.empty() && out.size() <= static_cast<std::size_t>(1 + meta_.moments),
             fmt::format("checkpoint '{}' holds {} optimizer moment(s), not {}", dir_, meta_.moments, out.size() - 1));
  const auto& whole = meta_.units[static_cast<std::size_t>(unit)];
  const auto& src = sources_[static_cast<std::size_t>(unit)];
  const int T = grid_.tensor;
  const std::size_t arrays = out.size();
  // Each source unit is read once per tensor rank: parameters of one unit share its sections.
  // (pipeline part, unit) -> per tensor rank, the part's arrays back to back.
  std::map<std::pair<int, int>, std::vector<std::vector<float>>> parts;
  for (std::size_t k = 0; k < whole.params.size(); ++k) {
    auto& got = parts[{src[k].pipeline, src[k].unit}];
    if (!got.empty()) continue;
    const bool split = std::any_of(src.begin(), src.end(), [&](const Source& s) {
      return s.pipeline == src[k].pipeline && s.unit == src[k].unit && part_param(s).split_axis >= 0;
    });
    for (int t = 0; t < (split ? T : 1); ++t) {
      Reader& r = *readers_[static_cast<std::size_t>(t + T * src[k].pipeline)];
      const auto n = static_cast<std::size_t>(r.meta().units[static_cast<std::size_t>(src[k].unit)].numel);
      got.emplace_back(n * arrays);
      std::vector<float*> to;
      for (std::size_t a = 0; a < arrays; ++a) to.push_back(out[a] ? got.back().data() + a * n : nullptr);
      r.read_range(src[k].unit, 0, static_cast<std::int64_t>(n), to);
    }
  }
  for (std::size_t k = 0; k < whole.params.size(); ++k) {
    const auto& got = parts.at({src[k].pipeline, src[k].unit});
    const ParamMeta& pm = part_param(src[k]);
    const std::size_t n = got[0].size() / arrays;
    for (std::size_t a = 0; a < arrays; ++a) {
      if (!out[a]) continue;
      float* to = out[a] + whole.params[k].offset;
      if (pm.split_axis < 0) {
        std::copy_n(got[0].data() + a * n + pm.offset, pm.numel, to);
        continue;
      }
      std::vector<const float*> ptrs;
      for (const auto& g : got) ptrs.push_back(g.data() + a * n + pm.offset);
      concat_parts(ptrs, pm.shape, pm.split_axis, pm.split_blocks, to);
    }
  }
}

const ParamMeta& ModelReader::saved_part(int unit, int param) const {
  return part_param(sources_.at(static_cast<std::size_t>(unit)).at(static_cast<std::size_t>(param)));
}

const ParamMeta& ModelReader::part_param(const Source& s) const {
  return readers_[static_cast<std::size_t>(grid_.tensor * s.pipeline)]
      ->meta()
      .units[static_cast<std::size_t>(s.unit)]
      .params[static_cast<std::size_t>(s.param)];
}

void ModelReader::read_part(const UnitInfo& part, int tensor, int tensors, std::int64_t begin, std::int64_t len,
                            std::span<float* const> out, const std::string& grid) {
  for (float* o : out)  // (Reader::read_runs checks out against the moments held)
    if (o) std::fill(o, o + len, 0.0f);
  const std::string saved = fmt::format("checkpoint '{}' (saved on the grid {})", dir_, grid_.describe());
  const auto wu =
      std::find_if(meta_.units.begin(), meta_.units.end(), [&](const UnitMeta& u) { return u.name == part.name; });
  if (wu == meta_.units.end())
    ZERO_THROW(
        fmt::format("load_checkpoint: {} has no unit '{}', which this job's model ({}) holds: it is another "
                    "model",
                    saved, escape_bytes(part.name), grid));
  const auto& src = sources_[static_cast<std::size_t>(wu - meta_.units.begin())];
  const int T = grid_.tensor;
  // (reader, unit) -> the runs to copy from it, in the order they were found.
  std::map<std::pair<int, int>, std::vector<Reader::Run>> runs;
  for (const ParamInfo& q : part.params) {
    const auto wp =
        std::find_if(wu->params.begin(), wu->params.end(), [&](const ParamMeta& p) { return p.name == q.name; });
    const std::string what = fmt::format("parameter '{}' of unit '{}'", escape_bytes(q.name), escape_bytes(part.name));
    if (wp == wu->params.end())
      ZERO_THROW(fmt::format("load_checkpoint: {} has no {}, which this job's model ({}) holds: it is another model",
                             saved, what, grid));
    const Source& s = src[static_cast<std::size_t>(wp - wu->params.begin())];
    const ParamMeta& pm = part_param(s);
    if (tensors > 1 && !q.replicated && q.split_axis < 0)
      ZERO_THROW(
          fmt::format("load_checkpoint: {} is neither split nor replicated over this job's {} tensor ranks "
                      "({}), so it cannot be cut from {}; declare it with Layout::set_split or set_replicated",
                      what, tensors, grid, saved));
    std::vector<std::int64_t> whole = q.shape;
    if (tensors > 1 && q.split_axis >= 0) whole[static_cast<std::size_t>(q.split_axis)] *= tensors;
    if (whole != wp->shape)
      ZERO_THROW(
          fmt::format("load_checkpoint: {} is {} as a whole tensor in {}, this job's model ({}) has {} (its "
                      "part {}): it is another model",
                      what, shape_text(wp->shape), saved, grid, shape_text(whole), shape_text(q.shape)));
    // Every parameter is checked, the ones outside this rank's range too: each rank finds the
    // same errors.
    const std::int64_t lo = std::max(begin, q.offset), hi = std::min(begin + len, q.offset + q.numel);
    if (lo >= hi) continue;
    const PartCut mine(q.shape, q.split_axis, q.split_blocks, q.replicated ? 1 : tensors);
    const PartCut theirs(pm.shape, pm.split_axis, pm.split_blocks, pm.replicated ? 1 : T);
    for (std::int64_t x = lo - q.offset; x < hi - q.offset;) {
      std::int64_t run_mine = 0, run_theirs = 0, t = 0;
      const std::int64_t w = mine.to_whole(x, tensor, run_mine);
      const std::int64_t y = theirs.from_whole(w, t, run_theirs);
      const std::int64_t n = std::min({run_mine, run_theirs, hi - q.offset - x});
      auto& list = runs[{static_cast<int>(t) + T * s.pipeline, s.unit}];
      const Reader::Run r{pm.offset + y, n, q.offset + x - begin};
      if (!list.empty() && list.back().from + list.back().len == r.from && list.back().to + list.back().len == r.to)
        list.back().len += n;
      else
        list.push_back(r);
      x += n;
    }
  }
  for (auto& [where, list] : runs) {
    std::sort(list.begin(), list.end(), [](const Reader::Run& a, const Reader::Run& b) { return a.from < b.from; });
    readers_[static_cast<std::size_t>(where.first)]->read_runs(where.second, list, out);
  }
}

}  // namespace zero::ckpt
