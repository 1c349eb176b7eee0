// The calls of MpiCommunicator as its three files name and check them (comm/mpi_comm.cpp the
// collectives, comm/mpi_p2p.cpp point to point, comm/mpi_stall.cpp the deadline's report): the
// kinds MpiCommunicator::Call::kind indexes, the side channel's tags, and MPI's int counts.
#pragma once

#include <fmt/format.h>

#include <climits>
#include <cstddef>
#include <cstdint>

#include "zero/error.hpp"

namespace zero::mpi_calls {

enum Kind : int {
  kAllReduce,
  kReduceScatter,
  kAllGather,
  kBroadcast,
  kBarrier,
  kAllReduceScalar,
  kSend,
  kRecv,
  kAllToAll,
  kKinds
};
inline const char* kind_name(std::int64_t k) {
  static const char* names[kKinds] = {"all_reduce",        "reduce_scatter", "all_gather", "broadcast", "barrier",
                                      "all_reduce_scalar", "send",           "recv",       "all_to_all"};
  return k >= 0 && k < kKinds ? names[k] : "an unknown collective";
}

// Side-channel tags: a rank past its deadline sends a query; a waiting rank answers with the
// collective it waits in.
constexpr int kQueryTag = 1, kAnswerTag = 2;
// Point to point: the payload on the communicator, its header on the side channel.
constexpr int kP2PTag = 3;

inline int checked_count(std::size_t n, const char* what) {
  ZERO_CHECK(n <= static_cast<std::size_t>(INT_MAX),
             fmt::format("{}: {} elements exceed MPI's int count; use smaller buckets (reduce_bucket_size / "
                         "allgather_bucket_size)",
                         what, n));
  return static_cast<int>(n);
}

}  // namespace zero::mpi_calls
