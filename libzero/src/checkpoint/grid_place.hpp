// The grid position a rank saves its shards at and loads them from, shared by save_checkpoint
// (checkpoint.cpp) and load_checkpoint (load.cpp).
#pragma once

#include "checkpoint/format.hpp"
#include "zero/engine_state.hpp"
#include "zero/groups.hpp"

namespace zero::ckpt {

// Where this rank's shards go: its (tensor, pipeline) position of the grid the engine runs on,
// or no grid (1 x 1) for an engine that holds the whole model.
struct GridPlace {
  ckpt::GridMeta grid;
  int tensor = 0, pipeline = 0;
};
inline GridPlace grid_place(const EngineState& e) {
  if (!e.model_parallel()) return {};
  const ProcessGroups& g = *e.groups();
  return {{g.tensor_size(), g.pipeline_size()}, g.coord().tensor, g.coord().pipeline};
}

}  // namespace zero::ckpt
