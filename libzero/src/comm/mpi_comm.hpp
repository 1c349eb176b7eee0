// MpiCommunicator: the host-memory Communicator over an MPI communicator.
//
// Point-to-point sends go out on the communicator itself with one tag; with the collective
// check on, a 3-integer header (count, dtype, sender) goes first on the private channel, and
// the receiver's wait() compares it with what it posted before reading the payload.
//
// 16-bit reductions are staged through fp32 scratch: the payload is widened, reduced with
// MPI's float sum, and rounded once on completion. That costs a copy, but the result is the
// correctly rounded sum, independent of the order MPI combines ranks in as far as fp32 allows.
//
// Every wait has a deadline (collective_timeout_s()). A rank whose deadline passes asks every
// peer, over a private duplicate of the communicator, which collective it is waiting in; ranks
// that are waiting answer (and report too), a stopped or hung rank cannot. The message names
// the collective, its size and the ranks that did not arrive, and the job ends with
// kCollectiveTimeoutExit. Collectives are numbered in issue order, which every rank shares, so
// "waiting in #12" on two ranks means the same call.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/collective_check.hpp"
#include "zero/comm.hpp"

namespace zero {

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(MPI_Comm comm);
  ~MpiCommunicator() override;
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  Work all_reduce_async(void* buf, std::size_t count, DType t, ReduceOp op) override;
  Work reduce_scatter_async(const void* send, void* recv, std::size_t recv_count, DType t, ReduceOp op) override;
  Work all_gather_async(const void* send, void* recv, std::size_t send_count, DType t) override;
  Work all_to_all_async(const void* send, void* recv, std::size_t count, DType t) override;
  Work broadcast_async(void* buf, std::size_t bytes, int root) override;
  Work barrier_async() override;
  double all_reduce_scalar(double v, ReduceOp op) override;
  Work send_async(const void* buf, std::size_t count, DType t, int peer) override;
  Work recv_async(void* buf, std::size_t count, DType t, int peer) override;
  void note_p2p(const char* kind, std::size_t count, DType t, int peer) override;
  void check_collective(const char* kind, std::size_t count, DType t, int root) override;
  std::string recent_collectives() const override { return check_->recent(); }
  TrafficBytes traffic() const override { return traffic_; }
  // The node of each rank of this communicator (comm/topology.hpp).
  const std::vector<int>& nodes() const { return node_of_; }
  MPI_Comm handle() const { return comm_; }
  // Collective over this communicator: the sub-communicator of the ranks with the same color,
  // ordered by key (MPI_Comm_split), as a communicator of its own.
  std::unique_ptr<MpiCommunicator> split(int color, int key) const;
  // Names this communicator as one of the process groups ("tensor group"): its deadline reports
  // then say which group and name ranks by their world rank, so reports from different groups
  // (a tensor all-reduce on one rank, a data reduce-scatter on its peers) read together.
  void set_group(std::string name);

  // fp32 scratch reused across calls (collectives in flight each hold their own).
  std::vector<float> take_scratch(std::size_t n);
  void give_scratch(std::vector<float>&& v);

  // One collective as messages describe it: its issue number, kind and payload.
  struct Call {
    std::int64_t seq = 0;
    int kind = 0;  // a kind of comm/mpi_calls.hpp (mpi_calls::Kind)
    std::size_t count = 0;
    DType dtype = DType::f32;  // of count; broadcast and barrier count bytes
    int peer = -1;             // point to point: the other rank
  };
  // Polls `req` until it completes (backing off), or ends the job when the deadline passes.
  void wait(MPI_Request& req, const Call& call);
  // Whether sends carry the header the receiver checks (the collective check's switch).
  bool checks_p2p() const { return check_->enabled(); }
  // The private channel of the P2P headers.
  MPI_Comm side() const { return side_; }
  // "rank 2" / "ranks 0, 1", as world ranks on a named group ("world rank 2"): how messages name
  // this communicator's ranks.
  std::string ranks_text(const std::vector<int>& ranks) const;

 private:
  // The next collective's Call, after the collective check has agreed on it (root: broadcast's).
  Call next_call(int kind, std::size_t count, DType t, int root = -1);
  // Answers peers' queries about what this rank waits in; true if any came.
  bool answer_queries(const Call& waiting);
  [[noreturn]] void report_stall(const Call& call, double waited_s);

  MPI_Comm comm_;
  MPI_Comm side_;  // the stall queries, apart from user traffic
  std::unique_ptr<CollectiveCheck> check_;
  std::vector<int> node_of_;       // node of each rank
  std::vector<std::string> host_;  // host name of each rank (for the deadline's report)
  // "ranks 2, 3 (node 1, host b)": ranks grouped by node, each group with where it runs.
  std::string located(const std::vector<int>& ranks) const;
  // True when the ranks are on more than one node (node_of_).
  bool spans_nodes() const;
  TrafficBytes traffic_;
  // Adds what this rank sends in one collective to traffic_ (the ring model of zero/comm.hpp).
  void count_traffic(int kind, std::size_t count, DType t, int root);
  // Records and counts a P2P call; returns its Call for the deadline's report.
  Call p2p_call(int kind, std::size_t count, DType t, int peer);
  std::string group_;            // set_group's name, or empty (the world, hpZ's group)
  std::vector<int> world_rank_;  // world rank of each rank, with a group name
  double timeout_s_ = 600.0;
  std::int64_t seq_ = 0;
  std::int64_t p2p_seq_ = 0;  // P2P calls are numbered apart: only two ranks share each
  int rank_ = 0, size_ = 1;
  std::mutex scratch_mu_;
  std::vector<std::vector<float>> scratch_;
};

}  // namespace zero
