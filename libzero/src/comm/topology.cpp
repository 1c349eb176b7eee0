// Node topology (see comm/topology.hpp).
#include "comm/topology.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <string_view>

#include "zero/error.hpp"

namespace zero {

int simulated_ranks_per_node() {
  const char* v = std::getenv("ZERO_RANKS_PER_NODE");
  if (v == nullptr || *v == '\0') return 0;
  const std::string_view s(v);
  int n = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
  ZERO_CHECK(ec == std::errc() && end == s.data() + s.size() && n > 0,
             fmt::format("ZERO_RANKS_PER_NODE='{}' is not a positive number of ranks; unset it to use the real "
                         "nodes (ranks sharing a host)",
                         s));
  return n;
}

std::vector<int> node_of_ranks(MPI_Comm comm) {
  int world_rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(comm, &size);
  // A node is named by its lowest world rank: the same name on every rank of the node.
  int key = 0;
  if (const int per_node = simulated_ranks_per_node(); per_node > 0) {
    key = world_rank / per_node * per_node;
  } else {
    // Found once per process, by the first communicator (the Context's, over the world, which
    // every rank makes): later ones may span only some ranks, and a split of the world would
    // then wait for the others.
    static const int shared_key = [world_rank] {
      MPI_Comm shared = MPI_COMM_NULL;
      ZERO_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank, MPI_INFO_NULL, &shared));
      int lowest = world_rank;
      ZERO_MPI_CHECK(MPI_Allreduce(&world_rank, &lowest, 1, MPI_INT, MPI_MIN, shared));
      MPI_Comm_free(&shared);
      return lowest;
    }();
    key = shared_key;
  }
  std::vector<int> keys(static_cast<std::size_t>(size));
  ZERO_MPI_CHECK(MPI_Allgather(&key, 1, MPI_INT, keys.data(), 1, MPI_INT, comm));
  std::vector<int> names = keys;
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  std::vector<int> node(keys.size());
  for (std::size_t r = 0; r < keys.size(); ++r)
    node[r] = static_cast<int>(std::lower_bound(names.begin(), names.end(), keys[r]) - names.begin());
  return node;
}

}  // namespace zero
