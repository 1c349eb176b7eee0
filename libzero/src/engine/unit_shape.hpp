// UnitShape: how one unit's flat storage splits over ranks, the geometry every engine role (and
// zero-plan, plan/engine_sizes.hpp) shares.
//
// Each unit is padded so it splits evenly: `padded` = `slice` x world, and rank r owns slice r of
// every unit (stages 1-3) or the whole unit (stage 0). The same partitioning serves every stage,
// so gradients, parameters and optimizer state of one unit always line up slice for slice.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "zero/layout.hpp"

namespace zero {

struct UnitShape {
  std::int64_t numel = 0;   // real elements
  std::int64_t slice = 0;   // elements per rank slice
  std::int64_t padded = 0;  // slice * world
  // The optimizer's owned range: [own_begin, own_begin + own_len) of the padded unit.
  std::int64_t own_begin = 0, own_len = 0;
  bool sharded_params = false;  // stage 3 and at or above the persistence threshold
  // The compute-dtype parameters a rank keeps between uses: its slice of a sharded unit, else
  // the whole padded unit.
  std::int64_t param_elements() const { return sharded_params ? slice : padded; }
};

// A per-unit vector's element for a unit id (an int, as Layout numbers units): the one place the
// engine's and the planner's per-unit vectors turn ids into indices.
template <class T>
T& unit_at(std::vector<T>& v, int unit) {
  return v[static_cast<std::size_t>(unit)];
}
template <class T>
const T& unit_at(const std::vector<T>& v, int unit) {
  return v[static_cast<std::size_t>(unit)];
}

inline std::vector<UnitShape> make_unit_shapes(const Layout& layout, int rank, int world, int stage,
                                               std::int64_t persistence_threshold) {
  std::vector<UnitShape> shapes(static_cast<std::size_t>(layout.num_units()));
  for (int i = 0; i < layout.num_units(); ++i) {
    UnitShape& u = unit_at(shapes, i);
    u.numel = layout.unit(i).numel;
    u.slice = layout.slice_numel(i, world);
    u.padded = u.slice * world;
    u.sharded_params = stage == 3 && u.numel >= persistence_threshold;
    u.own_begin = stage == 0 ? 0 : static_cast<std::int64_t>(rank) * u.slice;
    u.own_len = stage == 0 ? u.padded : u.slice;
  }
  return shapes;
}

// Splits [begin, begin + len) of unit's owned range (offsets relative to own_begin) into the
// maximal runs whose parameters agree on weight decay, calling fn(run_begin, run_len, decay)
// in order. Padding past the last parameter joins the run before it. Allocates nothing: the
// optimizer step calls it for every sub-group.
template <class Fn>
void for_each_decay_run(const UnitInfo& ui, const UnitShape& u, std::int64_t begin, std::int64_t len, Fn&& fn) {
  const std::int64_t lo = u.own_begin + begin, hi = lo + len;
  const auto& ps = ui.params;
  std::size_t k = 0;  // the parameter holding `pos` (or the last one, for padding)
  std::int64_t pos = lo;
  while (pos < hi) {
    while (k + 1 < ps.size() && ps[k].offset + ps[k].numel <= pos) ++k;
    const bool decay = ps[k].decay;
    std::size_t e = k;
    while (e + 1 < ps.size() && ps[e + 1].decay == decay) ++e;
    const std::int64_t end = e + 1 == ps.size() ? hi : std::min(hi, ps[e].offset + ps[e].numel);
    fn(pos - u.own_begin, end - pos, decay);
    pos = end;
    k = e + 1 < ps.size() ? e + 1 : e;
  }
}

}  // namespace zero
