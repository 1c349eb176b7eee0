// Process groups (see zero/groups.hpp): MPI_Comm_split of the world by grid position and node.
#include "zero/groups.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <mpi.h>

#include <algorithm>
#include <array>

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
                         world_, spec.tensor, spec.pipeline, spec.tensor * spec.pipeline, spec.tensor * spec.pipeline));
  data_size_ = world_ / (spec.tensor * spec.pipeline);
  std::vector<GridCoord> coords;
  for (int q = 0; q < world_; ++q)
    coords.push_back({q % spec.tensor, (q / spec.tensor) % data_size_, q / (spec.tensor * data_size_)});
  build(ctx, coords);
}

namespace {

std::string list_text(const std::vector<int>& v) { return fmt::format("[{}]", fmt::join(v, ", ")); }

// Every rank's three lists, gathered over the world (the same on every rank, so every rank
// reaches the same verdict and no rank waits for a peer that gave up).
struct AllLists {
  std::vector<std::array<std::vector<int>, 3>> of;  // per world rank: tensor, data, pipeline
};
AllLists gather_lists(const ExplicitGroups& mine, int world) {
  const std::array<const std::vector<int>*, 3> lists = {&mine.tensor, &mine.data, &mine.pipeline};
  std::array<int, 3> sizes{};
  for (int k = 0; k < 3; ++k)
    sizes[static_cast<std::size_t>(k)] = static_cast<int>(lists[static_cast<std::size_t>(k)]->size());
  std::vector<int> all_sizes(static_cast<std::size_t>(3 * world));
  MPI_Allgather(sizes.data(), 3, MPI_INT, all_sizes.data(), 3, MPI_INT, MPI_COMM_WORLD);
  std::vector<int> counts(static_cast<std::size_t>(world)), displs(static_cast<std::size_t>(world));
  int total = 0;
  for (int q = 0; q < world; ++q) {
    const auto at = static_cast<std::size_t>(3 * q);
    counts[static_cast<std::size_t>(q)] = all_sizes[at] + all_sizes[at + 1] + all_sizes[at + 2];
    displs[static_cast<std::size_t>(q)] = total;
    total += counts[static_cast<std::size_t>(q)];
  }
  std::vector<int> flat;
  for (const auto* l : lists) flat.insert(flat.end(), l->begin(), l->end());
  std::vector<int> all(static_cast<std::size_t>(std::max(total, 1)));
  MPI_Allgatherv(flat.data(), static_cast<int>(flat.size()), MPI_INT, all.data(), counts.data(), displs.data(), MPI_INT,
                 MPI_COMM_WORLD);
  AllLists out;
  for (int q = 0; q < world; ++q) {
    std::array<std::vector<int>, 3> l;
    auto it = all.begin() + displs[static_cast<std::size_t>(q)];
    for (int k = 0; k < 3; ++k) {
      const int n = all_sizes[static_cast<std::size_t>(3 * q + k)];
      l[static_cast<std::size_t>(k)].assign(it, it + n);
      it += n;
    }
    out.of.push_back(std::move(l));
  }
  return out;
}

}  // namespace

ProcessGroups::ProcessGroups(Context& ctx, const ExplicitGroups& mine) : explicit_(true), world_(ctx.world_size()) {
  const AllLists all = gather_lists(mine, world_);
  const char* kinds[3] = {"tensor", "data", "pipeline"};
  const std::string fix =
      "; pass each rank's own tensor, data and pipeline groups as lists of world ranks, every "
      "member of a group the same list in the same order";
  auto list = [&](int q, int k) -> const std::vector<int>& {
    return all.of[static_cast<std::size_t>(q)][static_cast<std::size_t>(k)];
  };
  int size[3];
  for (int k = 0; k < 3; ++k) {
    size[k] = static_cast<int>(list(0, k).size());
    for (int q = 0; q < world_; ++q)
      ZERO_CHECK(static_cast<int>(list(q, k).size()) == size[k],
                 fmt::format("explicit process groups: rank {} passes a {} group of {} ranks {}, rank 0 one of {} {}: "
                             "all {} groups must have one size{}",
                             q, kinds[k], list(q, k).size(), list_text(list(q, k)), size[k], list_text(list(0, k)),
                             kinds[k], fix));
  }
  ZERO_CHECK(
      size[0] >= 1 && size[1] >= 1 && size[2] >= 1 && static_cast<long long>(size[0]) * size[1] * size[2] == world_,
      fmt::format("explicit process groups: tensor {} x data {} x pipeline {} ranks is not the world of {}{}", size[0],
                  size[1], size[2], world_, fix));
  spec_ = {size[0], size[2]};
  data_size_ = size[1];
  // A rank's coordinate in each kind is its place in its own list.
  std::vector<GridCoord> coords(static_cast<std::size_t>(world_));
  for (int q = 0; q < world_; ++q) {
    int c[3];
    for (int k = 0; k < 3; ++k) {
      const auto& l = list(q, k);
      for (int m : l)
        ZERO_CHECK(m >= 0 && m < world_ && std::count(l.begin(), l.end(), m) == 1,
                   fmt::format("explicit process groups: rank {}'s {} group {} names rank {}, {}{}", q, kinds[k],
                               list_text(l), m, m >= 0 && m < world_ ? "twice" : "outside the world", fix));
      const auto at = std::find(l.begin(), l.end(), q);
      ZERO_CHECK(at != l.end(), fmt::format("explicit process groups: rank {}'s {} group {} does not contain rank {}{}",
                                            q, kinds[k], list_text(l), q, fix));
      c[k] = static_cast<int>(at - l.begin());
    }
    coords[static_cast<std::size_t>(q)] = {c[0], c[1], c[2]};
  }
  for (int q = 0; q < world_; ++q)
    for (int k = 0; k < 3; ++k)
      for (int m : list(q, k)) {
        ZERO_CHECK(list(m, k) == list(q, k),
                   fmt::format("explicit process groups: rank {}'s {} group is {}, but its member rank {} passes {}{}",
                               q, kinds[k], list_text(list(q, k)), m, list_text(list(m, k)), fix));
        // Members of one group differ in that group's coordinate only: the groups form a grid.
        const GridCoord a = coords[static_cast<std::size_t>(q)], b = coords[static_cast<std::size_t>(m)];
        const bool same_rest =
            (k == 0 || a.tensor == b.tensor) && (k == 1 || a.data == b.data) && (k == 2 || a.pipeline == b.pipeline);
        ZERO_CHECK(same_rest,
                   fmt::format("explicit process groups: ranks {} and {} share a {} group {} but sit at different "
                               "places of the other groups (tensor {}, data {}, pipeline {} vs {}, {}, {}): a "
                               "group's members must be at the same place in each other kind, as in a grid{}",
                               q, m, kinds[k], list_text(list(q, k)), a.tensor, a.data, a.pipeline, b.tensor, b.data,
                               b.pipeline, fix));
      }
  build(ctx, coords);
}

void ProcessGroups::build(Context& ctx, const std::vector<GridCoord>& coords) {
  const int T = spec_.tensor, D = data_size_;
  rank_at_.assign(static_cast<std::size_t>(world_), -1);
  for (int q = 0; q < world_; ++q) {
    const GridCoord c = coords[static_cast<std::size_t>(q)];
    int& at = rank_at_[static_cast<std::size_t>(c.tensor + T * (c.data + D * c.pipeline))];
    ZERO_CHECK(at < 0, fmt::format("process groups: ranks {} and {} are both at tensor {}, data {}, pipeline {}; "
                                   "each place of the grid holds one rank",
                                   at, q, c.tensor, c.data, c.pipeline));
    at = q;
  }
  const int r = ctx.rank();
  coord_ = coords[static_cast<std::size_t>(r)];

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
  // Named, so that deadline reports say which group and name ranks by world rank.
  auto split = [&](int color, int key, const char* name) -> std::unique_ptr<Communicator> {
    auto c = world.split(color, key);
    c->set_group(name);
    return c;
  };
  // Colors name the group (every member computes the same one); keys order it by the coordinate
  // that varies inside it, so a group's rank equals that coordinate.
  tensor_ = split(coord_.data + D * coord_.pipeline, coord_.tensor, "tensor group");
  data_ = split(coord_.tensor + T * coord_.pipeline, coord_.data, "data group");
  pipeline_ = split(coord_.tensor + T * coord_.data, coord_.pipeline, "pipeline group");
  model_ = split(coord_.data, coord_.tensor + T * coord_.pipeline, "model group");
  node_ = split(node_index_, r, "node group");
  cross_node_ = split(local, node_index_, "cross-node group");
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
  return fmt::format("{} ranks on {}; grid TP {} x DP {} x PP {} ({})", world_, nl.describe(), spec_.tensor, data_size_,
                     spec_.pipeline, explicit_ ? "explicit groups" : "tensor ranks adjacent, then data, then pipeline");
}

}  // namespace zero
