// UnitShape: how one unit's flat storage splits over ranks, the geometry every engine role shares.
//
// Each unit is padded so it splits evenly: `padded` = `slice` x world, and rank r owns slice r of
// every unit (stages 1-3) or the whole unit (stage 0). The same partitioning serves every stage,
// so gradients, parameters and optimizer state of one unit always line up slice for slice.
#pragma once

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
};

inline std::vector<UnitShape> make_unit_shapes(const Layout& layout, int rank, int world, int stage,
                                               std::int64_t persistence_threshold) {
  std::vector<UnitShape> shapes(static_cast<std::size_t>(layout.num_units()));
  for (int i = 0; i < layout.num_units(); ++i) {
    UnitShape& u = shapes[static_cast<std::size_t>(i)];
    u.numel = layout.unit(i).numel;
    u.slice = layout.slice_numel(i, world);
    u.padded = u.slice * world;
    u.sharded_params = stage == 3 && u.numel >= persistence_threshold;
    u.own_begin = stage == 0 ? 0 : static_cast<std::int64_t>(rank) * u.slice;
    u.own_len = stage == 0 ? u.padded : u.slice;
  }
  return shapes;
}

}  // namespace zero
