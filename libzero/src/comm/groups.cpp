// Process groups (see zero/groups.hpp): MPI_Comm_split of the world by grid position and node.
#include "zero/groups.hpp"

#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>

#include "comm/mpi_comm.hpp"
#include "comm/topology.hpp"
#include "zero/context.hpp"
#include "zero/error.hpp"

namespace zero {

namespace {
NodeLayout layout_of(const std::vector<int>& node_of) {
  NodeLayout l;
  l.nodes = *std::max_element(node_of.begin(), node_of.end()) + 1;
  std::vector<int> per_node(static_cast<std::size_t>(l.nodes), 0);
  for (int n : node_of) ++per_node[static_cast<std::size_t>(n)];
  l.ranks_per_node =
      std::all_of(per_node.begin(), per_node.end(), [&](int k) { return k == per_node[0]; }) ? per_node[0] : 0;
  l.simulated = simulated_ranks_per_node() > 0;
  return l;
}

}  // namespace

ProcessGroups::ProcessGroups(Context& ctx, GridSpec spec) : spec_(spec), world_(ctx.world_size()) {
  ZERO_CHECK(spec.tensor >= 1 && spec.pipeline >= 1,
             fmt::format("process groups: tensor ({}) and pipeline ({}) sizes must be at least 1", spec.tensor,
                         spec.pipeline));
  ZERO_CHECK(world_ % (spec.tensor * spec.pipeline) == 0,
             fmt::format("process groups: the world of {} ranks does not divide into tensor {} x pipeline {} = {} "
                         "ranks per model replica; launch a multiple of {} ranks or change the sizes",
                         world_, spec.tensor, spec.pipeline, spec.tensor * spec.pipeline,
                         spec.tensor * spec.pipeline));
  data_size_ = world_ / (spec.tensor * spec.pipeline);
  const int r = ctx.rank();
  coord_.tensor = r % spec.tensor;
  coord_.data = (r / spec.tensor) % data_size_;
  coord_.pipeline = r / (spec.tensor * data_size_);

  node_of_ = node_of_ranks(MPI_COMM_WORLD);
  const NodeLayout nl = layout_of(node_of_);
  simulated_ = nl.simulated;
  nodes_ = nl.nodes;
  ranks_per_node_ = nl.ranks_per_node;
  node_index_ = node_of_[static_cast<std::size_t>(r)];
  int local = 0;  // this rank's position inside its node
  for (int q = 0; q < r; ++q) local += node_of_[static_cast<std::size_t>(q)] == node_index_;

  // The Context's communicator spans the world in world-rank order.
  const auto& world = static_cast<const MpiCommunicator&>(ctx.comm());
  auto split = [&](int color, int key) -> std::unique_ptr<Communicator> { return world.split(color, key); };
  // Colors name the group (every member computes the same one); keys order it by the coordinate
  // that varies inside it, so a group's rank equals that coordinate.
  const int T = spec.tensor, D = data_size_;
  tensor_ = split(coord_.data + D * coord_.pipeline, coord_.tensor);
  data_ = split(coord_.tensor + T * coord_.pipeline, coord_.data);
  pipeline_ = split(coord_.tensor + T * coord_.data, coord_.pipeline);
  model_ = split(coord_.data, coord_.tensor + T * coord_.pipeline);
  node_ = split(node_index_, r);
  cross_node_ = split(local, node_index_);
}

ProcessGroups::~ProcessGroups() = default;

TrafficBytes ProcessGroups::traffic() const {
  TrafficBytes t;
  for (const auto* c : {&tensor_, &data_, &pipeline_, &model_, &node_, &cross_node_}) t += (*c)->traffic();
  return t;
}

std::string NodeLayout::describe() const {
  const std::string shape = ranks_per_node > 0 ? fmt::format("{} nodes x {} ranks", nodes, ranks_per_node)
                                                : fmt::format("{} nodes of unequal size", nodes);
  return shape + (simulated ? " (simulated: ZERO_RANKS_PER_NODE)" : "");
}

NodeLayout node_layout(Context& ctx) {
  // The Context's communicator is the host (MPI) one; it knows its ranks' nodes.
  return layout_of(static_cast<const MpiCommunicator&>(ctx.comm()).nodes());
}

std::string ProcessGroups::describe() const {
  const NodeLayout nl{nodes_, ranks_per_node_, simulated_};
  return fmt::format("{} ranks on {}; grid TP {} x DP {} x PP {} (tensor ranks adjacent, then data, then pipeline)",
                     world_, nl.describe(), spec_.tensor, data_size_, spec_.pipeline);
}

}  // namespace zero
