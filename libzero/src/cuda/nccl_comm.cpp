// NcclCommunicator's collectives (each on the comm stream, ordered after the compute stream)
// and its NCCL groups; its setup and teardown are in nccl_comm_setup.cpp.
#include "cuda/nccl_comm.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <exception>
#include <vector>

#include "cuda/cuda_check.hpp"
#include "cuda/kernels.hpp"
#include "zero/error.hpp"

namespace zero::cuda {

namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclFloat16;
  }
  ZERO_THROW(fmt::format("NCCL: unsupported dtype {}", static_cast<int>(t)));
}

// ncclAvg is never used: it multiplies by 1/size stored in the data type, which for bf16/fp16
// is off by up to 0.2% (e.g. +0.195% at 3 ranks) for every element alike. An average is a sum
// followed by an fp32 division (launch_divide).
ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::max ? ncclMax : ncclSum; }

// A collective (or a group's member): complete when its ticket is.
class NcclWork final : public Work::Impl {
 public:
  NcclWork(NcclCommunicator* c, std::uint64_t ticket, std::shared_ptr<const std::uint64_t> group)
      : c_(c), ticket_(ticket), group_(std::move(group)) {}
  // Dropped unwaited inside its open group (Work's destructor swallowed wait()'s refusal): the
  // group's end makes the compute stream wait instead, so later compute work still sees it.
  ~NcclWork() override {
    if (!waited_ && group_ && *group_ == 0) c_->wait_when_group_closes(group_);
  }
  void wait() override {
    const std::uint64_t t = ticket();
    ZERO_CHECK(t != 0,
               "Work::wait() on a collective of a communicator group that is still open; close the group "
               "(group_end() or CommGroup::end()) before waiting on its collectives");
    // The compute stream may be the legacy stream, which names the current device's: a thread
    // whose current device is another would make that device wait instead.
    use_device(c_->device());
    // A captured stream cannot wait on an event recorded outside its capture.
    refuse_capture(c_->streams().compute, "Work::wait()");
    c_->watchdog().stream_wait(c_->streams().compute, t);
    waited_ = true;
  }
  bool test() override {
    const std::uint64_t t = ticket();
    return t != 0 && c_->watchdog().done(t);
  }

 private:
  std::uint64_t ticket() const { return group_ ? *group_ : ticket_; }
  NcclCommunicator* c_;
  std::uint64_t ticket_;
  std::shared_ptr<const std::uint64_t> group_;
  bool waited_ = false;
};

// NCCL's group state is the calling thread's: from ncclGroupStart to the matching ncclGroupEnd
// every NCCL call this thread makes, on any communicator, is only recorded, and the outermost
// ncclGroupEnd enqueues them all. This is the thread's group depth over every NcclCommunicator
// and the communicators with collectives in the open group, so that each one's completion
// event is recorded after that ncclGroupEnd, not before its collectives are on the stream.
struct ThreadGroup {
  int depth = 0;
  std::vector<NcclCommunicator*> members;
};
ThreadGroup& thread_group() {
  thread_local ThreadGroup g;
  return g;
}

}  // namespace

template <class Issue>
Work NcclCommunicator::launch(const char* what, std::size_t bytes, Issue&& issue, Divide divide) {
  use_device(device_);
  refuse_capture(streams_.compute, what);
  stream_after(streams_.comm, streams_.compute, ready_.get());
  issue();
  if (thread_group().depth > 0) {
    // Inside a group (this communicator's or another's on this thread) NCCL enqueues at the
    // outermost ncclGroupEnd, so the division and the completion event wait until then.
    join_group();
    if (divide.buf) group_divides_.push_back(divide);
    if (!group_what_) group_what_ = what;
    group_bytes_ += bytes;
    ++group_ops_;
    return Work(std::make_unique<NcclWork>(this, 0, group_ticket_));
  }
  run_divide(divide);
  return Work(std::make_unique<NcclWork>(this, watchdog_->record(streams_.comm, what, bytes, 1), nullptr));
}

void NcclCommunicator::run_divide(const Divide& d) {
  if (d.buf) launch_divide(d.buf, d.t, d.n, static_cast<float>(size_), streams_.comm);
}

// Each collective is first stated to the host communicator's collective check (zero/comm.hpp),
// so ranks that would pair up different NCCL calls stop with an error instead.
Work NcclCommunicator::all_reduce_async(void* buf, std::size_t count, DType t, ReduceOp op) {
  host_.check_collective("all_reduce", count, t, -1);
  return launch(
      "all_reduce", count * dtype_size(t),
      [&] { ZERO_NCCL_CHECK(settle(ncclAllReduce(buf, buf, count, nccl_type(t), nccl_op(op), comm_, streams_.comm))); },
      op == ReduceOp::avg ? Divide{buf, t, count} : Divide{});
}

Work NcclCommunicator::reduce_scatter_async(const void* send, void* recv, std::size_t recv_count, DType t,
                                            ReduceOp op) {
  host_.check_collective("reduce_scatter", recv_count, t, -1);
  return launch(
      "reduce_scatter", recv_count * static_cast<std::size_t>(size_) * dtype_size(t),
      [&] {
        ZERO_NCCL_CHECK(
            settle(ncclReduceScatter(send, recv, recv_count, nccl_type(t), nccl_op(op), comm_, streams_.comm)));
      },
      op == ReduceOp::avg ? Divide{recv, t, recv_count} : Divide{});
}

Work NcclCommunicator::all_gather_async(const void* send, void* recv, std::size_t send_count, DType t) {
  // NCCL's in-place form is exactly ours: send == recv + rank * send_count.
  host_.check_collective("all_gather", send_count, t, -1);
  return launch("all_gather", send_count * static_cast<std::size_t>(size_) * dtype_size(t), [&] {
    ZERO_NCCL_CHECK(settle(ncclAllGather(send, recv, send_count, nccl_type(t), comm_, streams_.comm)));
  });
}

Work NcclCommunicator::all_to_all_async(const void* send, void* recv, std::size_t count, DType t) {
  host_.check_collective("all_to_all", count, t, -1);
  const std::size_t block = count * dtype_size(t);
  return launch("all_to_all", block * static_cast<std::size_t>(size_), [&] {
    // One send and one receive per peer, fused into one launch (NCCL groups nest).
    ZERO_NCCL_CHECK(settle(ncclGroupStart()));
    for (int j = 0; j < size_; ++j) {
      const std::size_t at = static_cast<std::size_t>(j) * block;
      ZERO_NCCL_CHECK(
          settle(ncclSend(static_cast<const char*>(send) + at, count, nccl_type(t), j, comm_, streams_.comm)));
      ZERO_NCCL_CHECK(settle(ncclRecv(static_cast<char*>(recv) + at, count, nccl_type(t), j, comm_, streams_.comm)));
    }
    ZERO_NCCL_CHECK(settle(ncclGroupEnd()));
  });
}

Work NcclCommunicator::broadcast_async(void* buf, std::size_t bytes, int root) {
  ZERO_CHECK(root >= 0 && root < size_, fmt::format("broadcast: root {} is not a rank", root));
  host_.check_collective("broadcast", bytes, DType::f32, root);
  return launch("broadcast", bytes, [&] {
    ZERO_NCCL_CHECK(settle(ncclBroadcast(buf, buf, bytes, ncclUint8, root, comm_, streams_.comm)));
  });
}

Work NcclCommunicator::send_async(const void* buf, std::size_t count, DType t, int peer) {
  ZERO_CHECK(peer >= 0 && peer < size_ && peer != rank_,
             fmt::format("send: peer {} is not another rank of this communicator of {} ranks", peer, size_));
  host_.note_p2p("send", count, t, peer);
  return launch("send", count * dtype_size(t),
                [&] { ZERO_NCCL_CHECK(settle(ncclSend(buf, count, nccl_type(t), peer, comm_, streams_.comm))); });
}

Work NcclCommunicator::recv_async(void* buf, std::size_t count, DType t, int peer) {
  ZERO_CHECK(peer >= 0 && peer < size_ && peer != rank_,
             fmt::format("recv: peer {} is not another rank of this communicator of {} ranks", peer, size_));
  host_.note_p2p("recv", count, t, peer);
  return launch("recv", count * dtype_size(t),
                [&] { ZERO_NCCL_CHECK(settle(ncclRecv(buf, count, nccl_type(t), peer, comm_, streams_.comm))); });
}

Work NcclCommunicator::barrier_async() { return host_.barrier_async(); }

double NcclCommunicator::all_reduce_scalar(double v, ReduceOp op) { return host_.all_reduce_scalar(v, op); }

void NcclCommunicator::group_begin() {
  // NCCL's groups nest: every begin is an ncclGroupStart, every end an ncclGroupEnd.
  ZERO_NCCL_CHECK(ncclGroupStart());
  ++group_depth_;
  ++thread_group().depth;
}

void NcclCommunicator::group_end() {
  ZERO_CHECK(group_depth_ > 0, "group_end() without a matching group_begin()");
  use_device(device_);
  --group_depth_;
  ThreadGroup& g = thread_group();
  const ncclResult_t rc = ncclGroupEnd();
  if (--g.depth > 0) {
    ZERO_NCCL_CHECK(rc);
    return;
  }
  // The outermost end: every member's collectives are enqueued now (or failed). Each member
  // closes, even when another's fails, so none keeps a group that no longer exists.
  std::vector<NcclCommunicator*> members = std::move(g.members);
  g.members.clear();
  std::exception_ptr first;
  for (NcclCommunicator* m : members) {
    try {
      m->close_group(rc);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
  // A group with no collective of this communicator still reports a failed ncclGroupEnd.
  if (members.empty()) ZERO_NCCL_CHECK(settle(rc));
}

void NcclCommunicator::join_group() {
  if (group_ticket_) return;
  thread_group().members.push_back(this);
  group_ticket_ = std::make_shared<std::uint64_t>(0);
  group_what_ = nullptr;
  group_bytes_ = 0;
  group_ops_ = 0;
  group_dropped_ = false;
  group_divides_.clear();
}

void NcclCommunicator::close_group(ncclResult_t rc) {
  const std::shared_ptr<std::uint64_t> ticket = std::move(group_ticket_);
  group_ticket_.reset();
  const std::vector<Divide> divides = std::move(group_divides_);
  group_divides_.clear();
  const bool dropped = group_dropped_;
  group_dropped_ = false;
  use_device(device_);
  // A non-blocking communicator's ncclGroupEnd may return ncclInProgress: each communicator of
  // the group is then polled until its part is enqueued.
  ZERO_NCCL_CHECK(settle(rc));
  for (const Divide& d : divides) run_divide(d);
  if (group_ops_ == 0) return;
  *ticket = watchdog_->record(streams_.comm, group_what_, group_bytes_, group_ops_);
  if (dropped) {
    refuse_capture(streams_.compute, "group_end() (a Work of the group was dropped before it closed)");
    watchdog_->stream_wait(streams_.compute, *ticket);
  }
}

void NcclCommunicator::wait_when_group_closes(const std::shared_ptr<const std::uint64_t>& group) {
  if (group_ticket_ && group == group_ticket_) group_dropped_ = true;
}

void NcclCommunicator::leave_thread_group() {
  auto& members = thread_group().members;
  members.erase(std::remove(members.begin(), members.end(), this), members.end());
}

}  // namespace zero::cuda
