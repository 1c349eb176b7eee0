// Process groups: the tensor / pipeline / data-parallel grid over the world in Megatron-LM's rank
// order (world rank = t + T * (d + D * p)), one communicator per group, and the node topology.
// What each group is for: docs/model-parallel.md; what a node is: docs/multi-node.md, Nodes.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "zero/comm.hpp"

namespace zero {

class Context;

// The nodes under the world communicator (the Context's), for start-up reports.
struct NodeLayout {
  int nodes = 1;
  int ranks_per_node = 1;        // 0 when nodes differ in size
  bool simulated = false;        // ZERO_RANKS_PER_NODE
  std::string describe() const;  // "2 nodes x 2 ranks (simulated: ZERO_RANKS_PER_NODE)"
};
NodeLayout node_layout(Context& ctx);

struct GridSpec {
  int tensor = 1;    // T: ranks that split each layer
  int pipeline = 1;  // P: pipeline parts
};

// A rank's place in the grid.
struct GridCoord {
  int tensor = 0, data = 0, pipeline = 0;
};

// Groups the application made itself (as Megatron's mpu hands them to DeepSpeed): this rank's
// tensor, data and pipeline groups, each the world ranks of its members in group-rank order
// (the order of MPI_Group_translate_ranks on the application's own communicators). A rank's
// position in each list is its coordinate there, so every member of a group must pass the same
// list, and the three kinds must form a grid: the members of a tensor group share their data
// and pipeline coordinates, and so on.
struct ExplicitGroups {
  std::vector<int> tensor, data, pipeline;
};

class ProcessGroups {
 public:
  // Collective over the world. A world size that T x P does not divide is an error naming both.
  ProcessGroups(Context& ctx, GridSpec spec = {});
  // Collective over the world: the application's own groups (see ExplicitGroups). Lists that do
  // not form a grid over the world (sizes that differ between ranks or do not multiply to the
  // world, a rank missing from its own group, members that disagree on a group, groups that
  // cross) are an error naming the ranks and lists, the same on every rank.
  ProcessGroups(Context& ctx, const ExplicitGroups& mine);
  ~ProcessGroups();
  ProcessGroups(const ProcessGroups&) = delete;
  ProcessGroups& operator=(const ProcessGroups&) = delete;

  int tensor_size() const { return spec_.tensor; }
  int pipeline_size() const { return spec_.pipeline; }
  int data_size() const { return data_size_; }
  GridCoord coord() const { return coord_; }
  // The world rank at a grid position (Megatron's order, or the explicit groups').
  int world_rank(GridCoord c) const {
    return rank_at_[static_cast<std::size_t>(c.tensor + spec_.tensor * (c.data + data_size_ * c.pipeline))];
  }
  bool explicit_groups() const { return explicit_; }

  Communicator& tensor() { return *tensor_; }
  Communicator& data() { return *data_; }
  Communicator& pipeline() { return *pipeline_; }
  Communicator& model() { return *model_; }
  Communicator& node() { return *node_; }
  Communicator& cross_node() { return *cross_node_; }

  int nodes() const { return nodes_; }
  int node_index() const { return node_index_; }
  int ranks_per_node() const { return ranks_per_node_; }  // 0 when nodes differ in size
  bool simulated_nodes() const { return simulated_; }     // ZERO_RANKS_PER_NODE
  // The node of every world rank.
  const std::vector<int>& node_of_rank() const { return node_of_; }
  // Bytes this rank sent over all of its groups (the world communicator excluded).
  TrafficBytes traffic() const;

  // "4 ranks on 2 nodes x 2 ranks (simulated); grid TP 2 x DP 2 x PP 1; ..." for start-up reports.
  std::string describe() const;

 private:
  // Splits the world by the coordinates of every world rank (coords[q]), and finds the nodes.
  void build(Context& ctx, const std::vector<GridCoord>& coords);
  GridSpec spec_;
  bool explicit_ = false;
  std::vector<int> rank_at_;  // world rank per grid position, t + T x (d + D x p)
  int world_ = 1, data_size_ = 1;
  GridCoord coord_;
  int nodes_ = 1, node_index_ = 0, ranks_per_node_ = 1;
  bool simulated_ = false;
  std::vector<int> node_of_;
  std::unique_ptr<Communicator> tensor_, data_, pipeline_, model_, node_, cross_node_;
};

}  // namespace zero
