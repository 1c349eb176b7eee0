// MpiStagedCommunicator: device-buffer collectives over the host (MPI) communicator, through
// pinned host copies. comm: mpi selects it; it is what lets several ranks share one GPU, which
// NCCL refuses, and it gives the host communicator's arithmetic (16-bit sums in fp32, rounded
// once) on device buffers, so a CUDA run can be compared with a host run bit for bit.
//
// A collective copies its input to pinned host memory on the communication stream, after the
// work already on the compute stream, and waits for that copy on the host (MPI needs the bytes);
// then it starts the host collective. Work::wait() completes the host collective and enqueues
// the copy of the result back to the device on the compute stream, so later compute work sees
// it without a device synchronization. The pinned buffer is kept until that copy has finished.
// Slower than NCCL by the two copies and the host wait per collective; meant for development,
// tests and small jobs, not for speed.
#pragma once

#include <deque>
#include <utility>
#include <vector>

#include "cuda/streams.hpp"
#include "zero/comm.hpp"
#include "offload/pinned_pool.hpp"

namespace zero::cuda {

class MpiStagedCommunicator final : public Communicator {
 public:
  MpiStagedCommunicator(Communicator& host, StreamSet& streams, offload::PinnedPool& pool);
  ~MpiStagedCommunicator() override;
  MpiStagedCommunicator(const MpiStagedCommunicator&) = delete;
  MpiStagedCommunicator& operator=(const MpiStagedCommunicator&) = delete;

  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  Work all_reduce_async(void* buf, std::size_t count, DType t, ReduceOp op) override;
  Work reduce_scatter_async(const void* send, void* recv, std::size_t recv_count, DType t, ReduceOp op) override;
  Work all_gather_async(const void* send, void* recv, std::size_t send_count, DType t) override;
  Work all_to_all_async(const void* send, void* recv, std::size_t count, DType t) override;
  Work broadcast_async(void* buf, std::size_t bytes, int root) override;
  Work barrier_async() override { return host_.barrier_async(); }
  double all_reduce_scalar(double v, ReduceOp op) override { return host_.all_reduce_scalar(v, op); }
  // Point to point through pinned host memory on the host communicator (its header check too).
  Work send_async(const void* buf, std::size_t count, DType t, int peer) override;
  Work recv_async(void* buf, std::size_t count, DType t, int peer) override;

  // Used by the Work handles.
  // Copies `bytes` at `host_src` (inside `buf`) to `dev_dst` on the compute stream; keeps `buf`
  // until the copy has run.
  void copy_back(void* dev_dst, const void* host_src, std::size_t bytes, offload::PinnedBuffer&& buf);

 private:
  // A staging buffer of `bytes` for collective `what`, refused while the compute stream is being
  // captured into a CUDA graph (refuse_capture).
  offload::PinnedBuffer take(std::size_t bytes, const char* what);
  // dev -> host, after the compute stream's work; returns once the bytes are on the host.
  void stage_in(void* host_dst, const void* dev_src, std::size_t bytes);

  Communicator& host_;
  StreamSet& streams_;
  offload::PinnedPool& pool_;
  int device_ = 0;
  Event ready_;
  std::deque<std::pair<offload::PinnedBuffer, Event>> retired_;  // buffers of copies in flight
  std::vector<Event> spare_events_;
};

}  // namespace zero::cuda
