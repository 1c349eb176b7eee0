#include "nccl_comm.hpp"

#include <exception>
#include <string>

#include "cuda_check.hpp"
#include "zero/error.hpp"

namespace zero::cuda {

namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclFloat16;
  }
  ZERO_THROW("NCCL: unsupported dtype " + std::to_string(static_cast<int>(t)));
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::max: return ncclMax;
    case ReduceOp::avg: return ncclAvg;
  }
  return ncclSum;
}

// A collective (or a group's member): complete when its ticket is.
class NcclWork final : public Work::Impl {
 public:
  NcclWork(NcclCommunicator* c, std::uint64_t ticket, std::shared_ptr<const std::uint64_t> group)
      : c_(c), ticket_(ticket), group_(std::move(group)) {}
  void wait() override {
    const std::uint64_t t = ticket();
    ZERO_CHECK(t != 0, "Work::wait() on a collective of a communicator group that is still open; close the group "
                       "(group_end() or CommGroup::end()) before waiting on its collectives");
    c_->watchdog().stream_wait(c_->streams().compute, t);
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
};

}  // namespace

NcclCommunicator::NcclCommunicator(Communicator& host, StreamSet& streams, int device)
    : host_(host), streams_(streams), rank_(host.rank()), size_(host.size()), device_(device) {
  ready_ = Event::create();
  ncclUniqueId id{};
  if (rank_ == 0) ZERO_NCCL_CHECK(ncclGetUniqueId(&id));
  host_.broadcast(&id, sizeof id, 0);
  const ncclResult_t rc = ncclCommInitRank(&comm_, size_, id, rank_);
  if (rc != ncclSuccess) {
    const char* last = ncclGetLastError(nullptr);
    ZERO_THROW("NCCL could not set up the communicator of " + std::to_string(size_) + " ranks on device " +
               std::to_string(device_) + ": " + ncclGetErrorString(rc) + (last && *last ? std::string(": ") + last : "") +
               ". NCCL needs one GPU per rank; to run several ranks on one GPU set comm: mpi. Run with NCCL_DEBUG=WARN "
               "for NCCL's account");
  }
  WatchdogOptions o;
  o.timeout_s = Watchdog::timeout_from_env();
  o.rank = rank_;
  o.world = size_;
  o.device = device_;
  o.async_error = [this] { return async_error(); };
  o.abort_comm = [this] {
    // No lock: the main thread may be stuck inside NCCL holding nothing of ours, and an abort
    // is exactly what unblocks it.
    if (comm_) ncclCommAbort(comm_);
  };
  watchdog_ = std::make_unique<Watchdog>(std::move(o));
}

NcclCommunicator::~NcclCommunicator() {
  if (!comm_) return;
  if (std::uncaught_exceptions() > 0) {
    // Unwinding from an error: collectives this rank enqueued may never be matched by the
    // others, so finalizing could wait forever. Abort instead (the job is ending anyway).
    watchdog_.reset();
    ncclCommAbort(comm_);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(comm_mu_);
    closing_ = true;
  }
  // The watchdog keeps checking deadlines while outstanding work is flushed.
  cudaStreamSynchronize(streams_.comm);
  ncclCommFinalize(comm_);
  watchdog_.reset();
  ncclCommDestroy(comm_);
}

std::string NcclCommunicator::async_error() {
  std::lock_guard<std::mutex> lock(comm_mu_);
  if (closing_) return "";
  ncclResult_t err = ncclSuccess;
  if (ncclCommGetAsyncError(comm_, &err) != ncclSuccess) return "";
  if (err == ncclSuccess || err == ncclInProgress) return "";
  const char* last = ncclGetLastError(comm_);
  return std::string("NCCL reported an asynchronous error: ") + ncclGetErrorString(err) +
         (last && *last ? std::string(" (") + last + ")" : "");
}

template <class Issue>
Work NcclCommunicator::launch(const char* what, std::size_t bytes, Issue&& issue) {
  stream_after(streams_.comm, streams_.compute, ready_.get());
  issue();
  if (group_depth_ > 0) {
    if (!group_what_) group_what_ = what;
    group_bytes_ += bytes;
    ++group_ops_;
    return Work(std::make_unique<NcclWork>(this, 0, group_ticket_));
  }
  return Work(std::make_unique<NcclWork>(this, watchdog_->record(streams_.comm, what, bytes, 1), nullptr));
}

Work NcclCommunicator::all_reduce_async(void* buf, std::size_t count, DType t, ReduceOp op) {
  return launch("all_reduce", count * dtype_size(t), [&] {
    ZERO_NCCL_CHECK(ncclAllReduce(buf, buf, count, nccl_type(t), nccl_op(op), comm_, streams_.comm));
  });
}

Work NcclCommunicator::reduce_scatter_async(const void* send, void* recv, std::size_t recv_count, DType t,
                                            ReduceOp op) {
  return launch("reduce_scatter", recv_count * static_cast<std::size_t>(size_) * dtype_size(t), [&] {
    ZERO_NCCL_CHECK(ncclReduceScatter(send, recv, recv_count, nccl_type(t), nccl_op(op), comm_, streams_.comm));
  });
}

Work NcclCommunicator::all_gather_async(const void* send, void* recv, std::size_t send_count, DType t) {
  // NCCL's in-place form is exactly ours: send == recv + rank * send_count.
  return launch("all_gather", send_count * static_cast<std::size_t>(size_) * dtype_size(t), [&] {
    ZERO_NCCL_CHECK(ncclAllGather(send, recv, send_count, nccl_type(t), comm_, streams_.comm));
  });
}

Work NcclCommunicator::broadcast_async(void* buf, std::size_t bytes, int root) {
  ZERO_CHECK(root >= 0 && root < size_, "broadcast: root " + std::to_string(root) + " is not a rank");
  return launch("broadcast", bytes, [&] {
    ZERO_NCCL_CHECK(ncclBroadcast(buf, buf, bytes, ncclUint8, root, comm_, streams_.comm));
  });
}

Work NcclCommunicator::barrier_async() { return host_.barrier_async(); }

double NcclCommunicator::all_reduce_scalar(double v, ReduceOp op) { return host_.all_reduce_scalar(v, op); }

void NcclCommunicator::group_begin() {
  if (group_depth_++ > 0) return;
  ZERO_NCCL_CHECK(ncclGroupStart());
  group_ticket_ = std::make_shared<std::uint64_t>(0);
  group_what_ = nullptr;
  group_bytes_ = 0;
  group_ops_ = 0;
}

void NcclCommunicator::group_end() {
  ZERO_CHECK(group_depth_ > 0, "group_end() without a matching group_begin()");
  if (--group_depth_ > 0) return;
  std::shared_ptr<std::uint64_t> ticket = std::move(group_ticket_);
  ZERO_NCCL_CHECK(ncclGroupEnd());
  if (group_ops_ > 0) *ticket = watchdog_->record(streams_.comm, group_what_, group_bytes_, group_ops_);
}

}  // namespace zero::cuda
