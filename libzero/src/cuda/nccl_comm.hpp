// NcclCommunicator: the CUDA backend's Communicator over NCCL, for device buffers.
//
// Bootstrapped through the host communicator (MPI): rank 0 makes the NCCL unique id and
// broadcasts it; every rank then joins with its own device (one GPU per rank; several ranks on
// one GPU need comm: mpi). Collectives run on the backend's communication stream:
//   - at the call, the comm stream first waits for everything already enqueued on the compute
//     stream, so inputs written by kernels launched just before are complete and earlier kernels
//     that read the output buffer (a reused pool buffer) are done with it;
//   - completion is an event recorded after the collective (a Watchdog ticket); Work::wait()
//     makes the compute stream wait on it, never the host (see zero/comm.hpp).
// Between group_begin() and group_end() collectives are issued inside ncclGroupStart/End, so a
// bucket of units is one launch; the group's Works share one completion event, recorded at the
// outermost group_end(). NCCL's group belongs to the calling thread, not to one communicator:
// a collective on another NcclCommunicator while this one's group is open (qgZ's all-to-alls in
// the reducer's bucket group) is deferred by NCCL to the same outermost ncclGroupEnd, so it joins
// the open group here too and gets its completion event there. A Work dropped while its group
// is open (its destructor cannot wait yet) makes the compute stream wait for the group when it
// closes, as a dropped Work waits everywhere else.
// fp32, bf16 and fp16 reduce natively; an average is NCCL's sum divided by the world size in
// fp32 on the comm stream (never ncclAvg: see nccl_comm.cpp).
// Scalar reductions and barriers are host operations and go to the host communicator.
// Setup and teardown are bounded by the collective timeout (ZERO_NCCL_TIMEOUT_S): the setup is
// non-blocking and polled, and names the ranks that never reached it; the teardown drains the
// comm stream and finalizes within it, and aborts past it.
#pragma once

#include <nccl.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "cuda/streams.hpp"
#include "cuda/watchdog.hpp"
#include "zero/comm.hpp"

namespace zero::cuda {

class NcclCommunicator final : public Communicator {
 public:
  // Collective over all ranks of `host`; this rank uses `device` (already current).
  NcclCommunicator(Communicator& host, StreamSet& streams, int device);
  // A communicator over `group`'s ranks split from `parent` (ncclCommSplit with splitShare: it
  // shares the parent's resources instead of a second set of buffers and a proxy thread).
  // Collective over every rank of the parent, each passing its own group of one partition of
  // the parent's ranks (the group's host communicator, whose rank order it keeps). Null for a
  // group of one rank, which takes part in the split and gets no communicator.
  static std::unique_ptr<NcclCommunicator> split(NcclCommunicator& parent, Communicator& group);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Work all_reduce_async(void* buf, std::size_t count, DType t, ReduceOp op) override;
  Work reduce_scatter_async(const void* send, void* recv, std::size_t recv_count, DType t, ReduceOp op) override;
  Work all_gather_async(const void* send, void* recv, std::size_t send_count, DType t) override;
  Work all_to_all_async(const void* send, void* recv, std::size_t count, DType t) override;
  Work broadcast_async(void* buf, std::size_t bytes, int root) override;
  // A host barrier (MPI): ranks meet; device work is not drained.
  Work barrier_async() override;
  double all_reduce_scalar(double v, ReduceOp op) override;
  // ncclSend / ncclRecv on the comm stream, recorded and counted on the host communicator.
  Work send_async(const void* buf, std::size_t count, DType t, int peer) override;
  Work recv_async(void* buf, std::size_t count, DType t, int peer) override;
  void group_begin() override;
  void group_end() override;

  // Used by the Work handles: a Work of the open group `group` was dropped before it closed;
  // the compute stream waits for the group when it does.
  void wait_when_group_closes(const std::shared_ptr<const std::uint64_t>& group);

  ncclComm_t handle() const { return comm_; }
  int device() const { return device_; }
  Watchdog& watchdog() { return *watchdog_; }
  StreamSet& streams() { return streams_; }

 private:
  // Orders the comm stream after the compute stream, runs `issue` (one NCCL call) and returns
  // its Work (or the open group's).
  // An average's division by the world size, after the summing collective (buf null: none).
  struct Divide {
    void* buf = nullptr;
    DType t = DType::f32;
    std::size_t n = 0;
  };
  template <class Issue>
  Work launch(const char* what, std::size_t bytes, Issue&& issue, Divide divide = {});
  void run_divide(const Divide& d);
  // The final result of an NCCL call on this (non-blocking) communicator.
  ncclResult_t settle(ncclResult_t rc);
  std::string async_error();
  // Aborts the communicator unless it is already closing or aborted; true when this call did.
  bool abort_once();
  NcclCommunicator(NcclCommunicator& parent, Communicator& group, int color);  // split()
  // The end of a setup (init or split) that returned rc: polled until done against the timeout,
  // then the watchdog; an error names the ranks that never arrived. `parent`: a split's.
  template <class Arrivals>
  void finish_setup(ncclResult_t rc, Arrivals& arrivals, ncclComm_t parent);

  Communicator& host_;
  StreamSet& streams_;
  int rank_ = 0, size_ = 1, device_ = 0;
  ncclComm_t comm_ = nullptr;
  Event ready_;  // compute -> comm ordering, re-recorded per collective
  std::unique_ptr<Watchdog> watchdog_;
  // Open until one of: closing (the destructor finalizes) or aborted (the watchdog or an error
  // unwinding). Exactly one transition happens, so an abort never races a finalization.
  enum State : int { kOpen, kClosing, kAborted };
  std::atomic<int> state_{kOpen};
  std::mutex comm_mu_;        // the watchdog's error polling vs the start of the finalization
  double timeout_s_ = 600.0;  // ZERO_NCCL_TIMEOUT_S: setup, collectives and teardown
  // This communicator's collectives in the thread's open NCCL group joined it (first one only).
  void join_group();
  // Destroyed inside an open group: the thread's group forgets it.
  void leave_thread_group();
  // The thread's outermost ncclGroupEnd returned `rc`: this member's collectives are enqueued
  // (or failed); settles them, runs their divisions and records the group's ticket.
  void close_group(ncclResult_t rc);

  // group_begin() calls not yet ended on this communicator (a group_end() needs one).
  int group_depth_ = 0;
  // Its collectives in the thread's open group: the shared ticket cell (null when it has none
  // there; 0 until the group closes), what they are, and whether a dropped Work awaits them.
  std::shared_ptr<std::uint64_t> group_ticket_;
  const char* group_what_ = nullptr;
  std::size_t group_bytes_ = 0;
  int group_ops_ = 0;
  bool group_dropped_ = false;
  std::vector<Divide> group_divides_;  // run after the group's ncclGroupEnd
};

}  // namespace zero::cuda
