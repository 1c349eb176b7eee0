// Node topology: which ranks of a communicator share a node.
//
// Ranks that share a host form a node (MPI_COMM_TYPE_SHARED). ZERO_RANKS_PER_NODE=N instead
// pretends that consecutive blocks of N world ranks are nodes: that is how tests, CI and the
// simulated cluster (bench/cluster) give one machine the shape of several.
#pragma once

#include <mpi.h>

#include <vector>

namespace zero {

// ZERO_RANKS_PER_NODE, or 0 when unset (the real topology). Throws on a malformed value.
int simulated_ranks_per_node();
// Collective over `comm`: the node of every rank of `comm` (indexed by its rank in `comm`),
// numbered 0, 1, ... in the order of each node's lowest world rank, the same on every rank.
std::vector<int> node_of_ranks(MPI_Comm comm);

}  // namespace zero
