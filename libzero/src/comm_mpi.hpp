// MpiCommunicator: the host-memory Communicator over an MPI communicator.
//
// 16-bit reductions are staged through fp32 scratch: the payload is widened, reduced with
// MPI's float sum, and rounded once on completion. That costs a copy, but the result is the
// correctly rounded sum, independent of the order MPI combines ranks in as far as fp32 allows.
#pragma once

#include <mpi.h>

#include <mutex>
#include <vector>

#include "zero/comm.hpp"

namespace zero {

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(MPI_Comm comm);
  ~MpiCommunicator() override;
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  Work all_reduce_async(void* buf, std::size_t count, DType t, ReduceOp op) override;
  Work reduce_scatter_async(const void* send, void* recv, std::size_t recv_count, DType t,
                            ReduceOp op) override;
  Work all_gather_async(const void* send, void* recv, std::size_t send_count, DType t) override;
  Work broadcast_async(void* buf, std::size_t bytes, int root) override;
  Work barrier_async() override;
  double all_reduce_scalar(double v, ReduceOp op) override;
  MPI_Comm handle() const { return comm_; }

  // fp32 scratch reused across calls (collectives in flight each hold their own).
  std::vector<float> take_scratch(std::size_t n);
  void give_scratch(std::vector<float>&& v);

 private:
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  std::mutex scratch_mu_;
  std::vector<std::vector<float>> scratch_;
};

}  // namespace zero
