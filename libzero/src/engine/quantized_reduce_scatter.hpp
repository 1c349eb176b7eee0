// qgZ (ZeRO++'s zero_quantized_gradients): a hierarchical reduce-scatter whose payload is
// block-quantized (comm/quantize.hpp), with error feedback.
//
// The data-parallel ranks form M nodes of L ranks each (comm/topology.hpp). Rank R(n, l), local
// rank l on node n, must end with slice R(n, l) of the sum over all ranks, as the engine's
// partition says (rank r owns slice r of every unit). Two all-to-alls:
//   1. inside the node: to each node peer l' this rank sends the M slices that ranks R(*, l')
//      own, as int8 blocks. Each rank dequantizes what its L-1 peers sent, adds its own slices
//      exactly, in local-rank order, in fp32: the node's partial sum of the M slices it serves.
//   2. across nodes, between the ranks with the same local rank (one rank per node): to the
//      rank on node n' it sends the partial sum of slice R(n', l), as int4 blocks; it sums the
//      M-1 received and its own, in node order, in fp32: the full sum of its own slice.
// Every slice size works: the chunks are whole slices, so nothing is padded beyond the units'
// own padding (each message is rounded up to a whole 4-byte word, see quant::packed_bytes).
// Error feedback: what a rank sends in each phase is quantized from its values plus the
// quantization error it kept from the previous reduction of the same tensor, and the new error
// replaces the old (quant::quantize_keep_error), so no part of a gradient is lost, only
// delayed. The buffers hold exactly what a rank sends: (L-1)/L of the tensor for phase 1 and
// (M-1)/(M L) for phase 2, in fp32. Sums run in a fixed order: the same inputs give the same bits.
//
// Collectives go over two sub-communicators of the data-parallel group, so their traffic counts
// inside the node and across it exactly as sent. Every buffer (the gradient, the result, the
// error feedback, the scratch) is the backend's memory and every element operation the
// backend's (convert, accumulate, quantize_keep_error, dequantize_add): on the host backend the
// host quantizer over MPI; on CUDA kernels with the same per-element arithmetic (the same bytes)
// over device communicators of the two groups (Backend::group_comm), ordered on the backend's
// streams. The host only sequences the phases, and each phase's element work is a fixed number of
// backend calls (a gather through a small table of slice numbers, one batched quantization,
// batched dequantize-adds), not one per peer or node: on a device a handful of launches
// whatever L and M.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "zero/comm.hpp"

namespace zero {

class MpiCommunicator;

class QuantizedReduceScatter {
 public:
  // One tensor's error-feedback state (one unit's gradient).
  // fp32 values in the backend's memory, zeroed when made.
  struct Feedback {
    Buffer intra;                          // phase 1: the L-1 chunks sent to node peers, in local-rank order
    Buffer inter;                          // phase 2: the M-1 slices sent to other nodes, in node order
    std::size_t intra_n = 0, inter_n = 0;  // their elements
  };

  // Collective over `dp`: splits it into this rank's node and its cross-node group. Throws when
  // the nodes hold different numbers of data-parallel ranks. `backend` (over dp's ranks, or a
  // host backend of its own when null) supplies memory, arithmetic and the groups' device
  // communicators; it must outlive this object and every Feedback made by it.
  QuantizedReduceScatter(MpiCommunicator& dp, std::size_t block, Backend* backend = nullptr);
  ~QuantizedReduceScatter();
  QuantizedReduceScatter(const QuantizedReduceScatter&) = delete;
  QuantizedReduceScatter& operator=(const QuantizedReduceScatter&) = delete;

  int nodes() const { return nodes_; }
  int ranks_per_node() const { return per_node_; }
  std::size_t block() const { return block_; }
  // The buffers one reduction of a tensor of `slice` elements per rank takes from the pool, on M
  // nodes of L ranks with quantization blocks of `block` elements, in bytes; zero-plan replays
  // the pool with them (plan::qgz_buffer_bytes).
  struct Scratch {
    std::size_t message1 = 0;  // one phase-1 message: a node peer's M slices as int8 blocks
    std::size_t phase1 = 0;    // send1, and recv1: L such messages (none when L = 1)
    std::size_t partial = 0;   // the node's fp32 partial sum of the M slices this rank serves
    std::size_t message2 = 0;  // one phase-2 message: one slice of the partial sum as int4 blocks
    std::size_t phase2 = 0;    // send2, and recv2: M such messages (none when M = 1)
  };
  static Scratch scratch_for(std::size_t L, std::size_t M, std::size_t slice, std::size_t block);
  // The elements of a Feedback for a tensor of `slice` elements per rank on M nodes of L ranks.
  static std::size_t intra_feedback_elements(std::size_t L, std::size_t M, std::size_t slice) {
    return (L - 1) * M * slice;
  }
  static std::size_t inter_feedback_elements(std::size_t M, std::size_t slice) { return (M - 1) * slice; }
  // A Feedback sized for a tensor of `slice` elements per rank, zeroed.
  Feedback make_feedback(std::size_t slice) const;
  // Bytes this rank sends for one reduction of a tensor of `slice` elements per rank (inside its
  // node, across nodes); the static form for M nodes of L ranks and blocks of `block`.
  TrafficBytes bytes_per_reduction(std::size_t slice) const;
  static TrafficBytes bytes_per_reduction_for(std::size_t L, std::size_t M, std::size_t slice, std::size_t block);

  // Starts the reduction of `grad` (world x slice values of dtype t; rank r's slice at r x slice;
  // backend memory). When the Work completes, out (slice fp32 values, backend memory) holds the sum over ranks of this
  // rank's slice. grad, fb and out must stay valid until then. Works must be started in the same order on every rank
  // (as every collective). Its test() (Work::done) only reports and issues no collective: phase 2 starts when a Work is
  // waited for, so a Work is never done before some wait() has started its phase 2.
  Work start(const void* grad, DType t, std::size_t slice, Feedback& fb, float* out);

  TrafficBytes traffic() const;
  // The most bytes its scratch (packed messages and partial sums) has held so far, the buffers
  // kept for reuse included: what qgZ adds to the reduce staging (MemoryReport::qgz_buffers, in
  // comm_buffers; plan::qgz_buffer_bytes models it).
  std::int64_t scratch_bytes() const { return pool_.held_peak(); }

 private:
  struct Op;
  class OpWork;
  void start_inter(Op& op);      // phase 1 done: sum it, start phase 2 (or finish)
  void finish(Op& op);           // phase 2 done: sum into out
  void advance_through(Op* op);  // completes phase 1 of every op up to op, in start order
  void complete(Op* op);
  bool poll(Op* op);  // reports only: starts no phase and no collective

  // The communicators the all-to-alls use: the device ones where there are, else the host ones.
  Communicator& node();
  Communicator& cross();

  std::unique_ptr<Backend> own_backend_;  // a host backend, when none was given
  Backend& backend_;
  std::unique_ptr<MpiCommunicator> node_comm_, cross_comm_;  // ranks: local rank l; node n
  // Device communicators over the same two groups (null on the host backend); traffic and the
  // collective check stay with the host ones above.
  std::unique_ptr<Communicator> node_dev_, cross_dev_;
  BufferPool pool_;                                      // scratch: the packed messages and the partial sums
  int nodes_ = 1, per_node_ = 1, node_ = 0, local_ = 0;  // M, L, and this rank's n and l
  std::vector<std::vector<int>> owner_;                  // owner_[n][l]: the data-parallel rank R(n, l)
  // The row tables of Backend::gather_rows, in backend memory, made once: which slice feeds each
  // row of the phase-1 messages (peer by peer, node by node: R(n, l) for l != local), of the
  // rank's own part of the partial sum (R(n, local)), and of the phase-2 messages (node n != node).
  Buffer rows_;
  const std::int32_t* intra_rows_ = nullptr;
  const std::int32_t* own_rows_ = nullptr;
  const std::int32_t* inter_rows_ = nullptr;
  std::size_t block_;
  std::deque<std::shared_ptr<Op>> in_phase1_;  // ops whose phase 1 is in flight, in start order
};

}  // namespace zero
