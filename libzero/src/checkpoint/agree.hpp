// The checkpoint phases' agreement over ranks. Every phase that touches files runs on each rank
// inside agree(): if it fails anywhere, every rank throws the message of the lowest failing rank,
// so no rank waits in a collective for a peer that gave up (a corrupted shard read by rank 2 alone
// must not hang ranks 0, 1 and 3).
#pragma once

#include <cstdint>
#include <exception>
#include <string>

#include "checkpoint/format.hpp"
#include "zero/comm.hpp"
#include "zero/error.hpp"

namespace zero {

// Runs fn on every rank; when it throws on any rank, every rank throws the same zero::Error.
template <class F>
void agree(Communicator& comm, F&& fn) {
  std::string err;
  try {
    fn();
  } catch (const std::exception& e) {
    err = e.what();
    if (err.empty()) err = "checkpoint: unknown error";
  }
  const int world = comm.size(), rank = comm.rank();
  double who = comm.all_reduce_scalar(err.empty() ? 0.0 : static_cast<double>(world - rank), ReduceOp::max);
  if (who == 0.0) return;
  const int root = world - static_cast<int>(who);  // the lowest failing rank
  std::uint64_t len = rank == root ? err.size() : 0;
  comm.broadcast(&len, sizeof len, root);
  std::string msg = rank == root ? err : std::string(static_cast<std::size_t>(len), '\0');
  if (len > 0) comm.broadcast(msg.data(), static_cast<std::size_t>(len), root);
  throw Error(msg);
}

// Every rank must pass the same value (a root path, the client state): a difference would
// scatter shards over several directories or silently save one rank's view.
inline void same_on_all_ranks(Communicator& comm, const std::string& value, const std::string& what) {
  // 52 bits of the checksum are exact in a double.
  auto h = static_cast<double>(ckpt::checksum(value.data(), value.size()) >> 12);
  double hi = comm.all_reduce_scalar(h, ReduceOp::max);
  double lo = -comm.all_reduce_scalar(-h, ReduceOp::max);
  if (hi != lo)
    ZERO_THROW("checkpoint: " + what + " differs between ranks; pass the same value on every rank" +
               (what.find("client") != std::string::npos
                    ? " (the client state is saved once: derive per-rank values such as RNG states from a seed, "
                      "the rank and the step)"
                    : ""));
}

}  // namespace zero
