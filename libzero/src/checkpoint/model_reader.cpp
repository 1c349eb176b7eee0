// The whole model of a checkpoint (see ckpt::ModelReader in checkpoint/format.hpp): every grid
// position's shard set opened, and each parameter put back together from its parts.
#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "checkpoint/format.hpp"
#include "runtime/strings.hpp"
#include "zero/error.hpp"

namespace zero::ckpt {

void concat_parts(const std::vector<const float*>& parts, const std::vector<std::int64_t>& part, int axis, int blocks,
                  float* whole) {
  const auto T = static_cast<std::int64_t>(parts.size());
  std::int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d) outer *= part[static_cast<std::size_t>(d)];
  for (std::size_t d = static_cast<std::size_t>(axis) + 1; d < part.size(); ++d) inner *= part[d];
  const std::int64_t extent = part[static_cast<std::size_t>(axis)];  // one part's, along axis
  const std::int64_t chunk = extent / blocks * inner;                // one block of one part
  for (std::int64_t o = 0; o < outer; ++o)
    for (std::int64_t b = 0; b < blocks; ++b)
      for (std::int64_t t = 0; t < T; ++t)
        std::copy_n(parts[static_cast<std::size_t>(t)] + o * extent * inner + b * chunk, chunk,
                    whole + o * extent * inner * T + (b * T + t) * chunk);
}

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
    // Every tensor rank of a stage holds the same units and parameters, its own part of each:
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
        if (held) continue;  // a lower stage has it (a tied embedding)
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
  ZERO_CHECK(unit >= 0 && static_cast<std::size_t>(unit) < meta_.units.size(),
             fmt::format("checkpoint '{}' has no unit {}", dir_, unit));
  const auto& whole = meta_.units[static_cast<std::size_t>(unit)];
  const auto& src = sources_[static_cast<std::size_t>(unit)];
  const int T = grid_.tensor;
  // Each source unit is read once per tensor rank: parameters of one unit share its sections.
  std::map<std::pair<int, int>, std::vector<std::vector<float>>> parts;  // (stage, unit) -> per tensor rank
  for (std::size_t k = 0; k < whole.params.size(); ++k) {
    auto& got = parts[{src[k].pipeline, src[k].unit}];
    if (!got.empty()) continue;
    const bool split = std::any_of(src.begin(), src.end(), [&](const Source& s) {
      if (s.pipeline != src[k].pipeline || s.unit != src[k].unit) return false;
      const auto& pm = readers_[static_cast<std::size_t>(T * s.pipeline)]
                           ->meta()
                           .units[static_cast<std::size_t>(s.unit)]
                           .params[static_cast<std::size_t>(s.param)];
      return pm.split_axis >= 0;
    });
    for (int t = 0; t < (split ? T : 1); ++t) {
      Reader& r = *readers_[static_cast<std::size_t>(t + T * src[k].pipeline)];
      const auto n = r.meta().units[static_cast<std::size_t>(src[k].unit)].numel;
      got.emplace_back(static_cast<std::size_t>(n));
      r.read_range(src[k].unit, 0, n, got.back().data(), nullptr, nullptr);
    }
  }
  for (std::size_t k = 0; k < whole.params.size(); ++k) {
    const auto& got = parts.at({src[k].pipeline, src[k].unit});
    const ParamMeta& pm = readers_[static_cast<std::size_t>(T * src[k].pipeline)]
                              ->meta()
                              .units[static_cast<std::size_t>(src[k].unit)]
                              .params[static_cast<std::size_t>(src[k].param)];
    float* out = master + whole.params[k].offset;
    if (pm.split_axis < 0) {
      std::copy_n(got[0].data() + pm.offset, pm.numel, out);
      continue;
    }
    std::vector<const float*> ptrs;
    for (const auto& g : got) ptrs.push_back(g.data() + pm.offset);
    concat_parts(ptrs, pm.shape, pm.split_axis, pm.split_blocks, out);
  }
}

}  // namespace zero::ckpt
