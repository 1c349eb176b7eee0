#include "cuda/nccl_comm.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include <mpi.h>

#include "comm/mpi_comm.hpp"
#include "runtime/log.hpp"
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

namespace {

using Clock = std::chrono::steady_clock;

Clock::time_point deadline_after(double s) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(std::min(s, 1e9)));
}

// Who reached ncclCommInitRank: every rank sends a one-byte "arrived" to every other when it
// starts its NCCL setup and posts a receive from each, all nonblocking, so a rank whose setup
// timed out can name the ranks it never heard from. Only over an MPI host communicator.
class Arrivals {
 public:
  explicit Arrivals(Communicator& host) {
    auto* mpi = dynamic_cast<MpiCommunicator*>(&host);
    if (!mpi) return;
    comm_ = mpi->handle();
    const int n = host.size(), me = host.rank();
    recv_.assign(static_cast<std::size_t>(n), MPI_REQUEST_NULL);
    send_.assign(static_cast<std::size_t>(n), MPI_REQUEST_NULL);
    flags_.assign(static_cast<std::size_t>(n), 0);
    for (int r = 0; r < n; ++r) {
      if (r == me) continue;
      MPI_Irecv(&flags_[static_cast<std::size_t>(r)], 1, MPI_CHAR, r, kTag, comm_, &recv_[static_cast<std::size_t>(r)]);
      MPI_Isend(&kOne, 1, MPI_CHAR, r, kTag, comm_, &send_[static_cast<std::size_t>(r)]);
    }
  }
  // Every rank arrived (NCCL's setup succeeded): the messages complete at once.
  void complete() {
    if (!recv_.empty()) {
      MPI_Waitall(static_cast<int>(recv_.size()), recv_.data(), MPI_STATUSES_IGNORE);
      MPI_Waitall(static_cast<int>(send_.size()), send_.data(), MPI_STATUSES_IGNORE);
    }
    recv_.clear();
    send_.clear();
  }
  // The ranks not heard from, as "3, 7"; the pending requests are cancelled.
  std::string missing() {
    std::string out;
    for (std::size_t r = 0; r < recv_.size(); ++r) {
      if (recv_[r] == MPI_REQUEST_NULL) continue;
      int done = 0;
      MPI_Test(&recv_[r], &done, MPI_STATUS_IGNORE);
      if (done) continue;
      out += fmt::format("{}{}", out.empty() ? "" : ", ", r);
      MPI_Cancel(&recv_[r]);
      MPI_Request_free(&recv_[r]);
    }
    for (auto& q : send_)
      if (q != MPI_REQUEST_NULL) MPI_Request_free(&q);
    recv_.clear();
    send_.clear();
    return out;
  }
  bool known() const { return comm_ != MPI_COMM_NULL; }

 private:
  static constexpr int kTag = 0x2e1c;
  static constexpr char kOne = 1;
  MPI_Comm comm_ = MPI_COMM_NULL;
  std::vector<MPI_Request> recv_, send_;
  std::vector<char> flags_;
};

}  // namespace

NcclCommunicator::NcclCommunicator(Communicator& host, StreamSet& streams, int device)
    : host_(host), streams_(streams), rank_(host.rank()), size_(host.size()), device_(device) {
  ready_ = Event::create();
  timeout_s_ = Watchdog::timeout_from_env();
  ncclUniqueId id{};
  if (rank_ == 0) ZERO_NCCL_CHECK(ncclGetUniqueId(&id));
  host_.broadcast(&id, sizeof id, 0);
  Arrivals arrivals(host_);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  finish_setup(ncclCommInitRankConfig(&comm_, size_, id, rank_, &config), arrivals, nullptr);
}

NcclCommunicator::NcclCommunicator(NcclCommunicator& parent, Communicator& group, int color)
    : host_(group), streams_(parent.streams_), rank_(group.rank()), size_(group.size()), device_(parent.device_) {
  ready_ = Event::create();
  timeout_s_ = Watchdog::timeout_from_env();
  Arrivals arrivals(host_);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  config.splitShare = 1;
  finish_setup(ncclCommSplit(parent.comm_, color, rank_, &comm_, &config), arrivals, parent.comm_);
  int count = 0;
  ZERO_NCCL_CHECK(ncclCommCount(comm_, &count));
  ZERO_CHECK(count == size_, fmt::format("[rank {}] the NCCL communicator split for a group of {} ranks has {}: the "
                                         "groups passed to the split do not partition its parent's ranks",
                                         rank_, size_, count));
}

std::unique_ptr<NcclCommunicator> NcclCommunicator::split(NcclCommunicator& parent, Communicator& group) {
  use_device(parent.device_);
  if (group.size() == 1) {  // no communicator, but the split is collective over the parent
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t none = nullptr;
    ncclResult_t rc = ncclCommSplit(parent.comm_, NCCL_SPLIT_NOCOLOR, 0, &none, &config);
    const auto deadline = deadline_after(parent.timeout_s_);
    while (rc == ncclInProgress && (parent.timeout_s_ <= 0.0 || Clock::now() <= deadline)) {
      if (ncclCommGetAsyncError(parent.comm_, &rc) != ncclSuccess) rc = ncclInternalError;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ZERO_CHECK(rc == ncclSuccess,
               fmt::format("[rank {}] NCCL could not take part in a communicator split: {}", parent.rank_,
                           rc == ncclInProgress ? std::string("not done within ZERO_NCCL_TIMEOUT_S")
                                                : std::string(ncclGetErrorString(rc))));
    return nullptr;
  }
  // One color per group: the largest parent rank in it (the groups are disjoint).
  const int color = static_cast<int>(group.all_reduce_scalar(parent.rank_, ReduceOp::max));
  return std::unique_ptr<NcclCommunicator>(new NcclCommunicator(parent, group, color));
}

template <class Arrivals>
void NcclCommunicator::finish_setup(ncclResult_t rc, Arrivals& arrivals, ncclComm_t parent) {
  // Non-blocking setup, polled against the collective timeout: a rank that never joins (dead,
  // stuck before this point, on an unreachable node) ends the job with its name instead of a
  // silent hang inside NCCL. A split is done when the parent's part of it is done too.
  const auto deadline = deadline_after(timeout_s_);
  bool timed_out = false;
  while (rc == ncclInProgress) {
    ncclResult_t state = ncclInProgress;
    if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) state = ncclInternalError;
    if (state == ncclSuccess && parent != nullptr && ncclCommGetAsyncError(parent, &state) != ncclSuccess)
      state = ncclInternalError;
    rc = state;
    if (rc != ncclInProgress) break;
    if (timeout_s_ > 0.0 && Clock::now() > deadline) {
      timed_out = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (rc == ncclSuccess) {
    arrivals.complete();
  } else {
    const char* last = ncclGetLastError(comm_);
    const std::string nccl_says =
        timed_out ? std::string()
                  : std::string(": ") + ncclGetErrorString(rc) + (last && *last ? std::string(": ") + last : "");
    const std::string missing = arrivals.missing();
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
    if (timed_out)
      ZERO_THROW(fmt::format(
          "[rank {}] NCCL could not set up the communicator of {} ranks within the collective timeout of {:g} s "
          "(ZERO_NCCL_TIMEOUT_S); {}. Raise ZERO_NCCL_TIMEOUT_S if the cluster is legitimately that slow",
          rank_, size_, timeout_s_,
          !arrivals.known() ? std::string("the host communicator cannot tell which ranks are missing")
          : missing.empty() ? std::string("every rank reached the setup, so the network between them is the likely "
                                          "cause (NCCL_DEBUG=INFO shows the transports)")
                            : fmt::format("ranks that never reached it: {} (check their logs)", missing)));
    ZERO_THROW(
        fmt::format("NCCL could not set up the communicator of {} ranks on device {}{}. NCCL needs one GPU per "
                    "rank; to run several ranks on one GPU set comm: mpi. Run with NCCL_DEBUG=WARN for NCCL's "
                    "account",
                    size_, device_, nccl_says));
  }
  WatchdogOptions o;
  o.timeout_s = timeout_s_;
  o.rank = rank_;
  o.world = size_;
  o.device = device_;
  o.async_error = [this] { return async_error(); };
  o.recent_collectives = [this] { return host_.recent_collectives(); };
  // The main thread may be stuck inside NCCL; an abort is exactly what unblocks it. The state
  // flag keeps it from racing a finalization in progress.
  o.abort_comm = [this] { abort_once(); };
  watchdog_ = std::make_unique<Watchdog>(std::move(o));
}

bool NcclCommunicator::abort_once() {
  // comm_mu_ is never held across a blocking NCCL call, so taking it here cannot deadlock.
  std::lock_guard<std::mutex> lock(comm_mu_);
  int expected = kOpen;
  if (!state_.compare_exchange_strong(expected, kAborted)) return false;
  ncclCommAbort(comm_);
  return true;
}

NcclCommunicator::~NcclCommunicator() {
  // Destroyed inside an open group (an error unwinding through it): the group's end must not
  // reach this communicator.
  auto& members = thread_group().members;
  members.erase(std::remove(members.begin(), members.end(), this), members.end());
  if (!comm_) return;
  if (std::uncaught_exceptions() > 0) {
    // Unwinding from an error: collectives this rank enqueued may never be matched by the
    // others, so finalizing could wait forever. Abort instead (the job is ending anyway).
    abort_once();
    watchdog_.reset();
    return;
  }
  {
    // Under the lock, so the watchdog's error polling never overlaps the finalization.
    std::lock_guard<std::mutex> lock(comm_mu_);
    int expected = kOpen;
    if (!state_.compare_exchange_strong(expected, kClosing)) {
      // The watchdog aborted the communicator and is ending the job; nothing is left to close.
      watchdog_.reset();
      return;
    }
  }
  // Outstanding collectives are flushed, then NCCL finalizes (non-blocking: polled), both
  // within the collective timeout; past it, the communicator is aborted, from this thread, so
  // nothing races the finalization.
  const auto deadline = deadline_after(timeout_s_);
  bool clean = stream_drain(streams_.comm, timeout_s_);
  if (clean) {
    ncclResult_t rc = ncclCommFinalize(comm_);
    while (rc == ncclInProgress) {
      if (timeout_s_ > 0.0 && Clock::now() > deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (ncclCommGetAsyncError(comm_, &rc) != ncclSuccess) rc = ncclInternalError;
    }
    clean = rc == ncclSuccess;
  }
  watchdog_.reset();
  if (clean) {
    ncclCommDestroy(comm_);
  } else {
    log_warning("the NCCL communicator did not close cleanly within {:g} s (ZERO_NCCL_TIMEOUT_S); aborting it",
                timeout_s_);
    ncclCommAbort(comm_);
  }
  comm_ = nullptr;
}

std::string NcclCommunicator::async_error() {
  std::lock_guard<std::mutex> lock(comm_mu_);
  if (state_.load() != kOpen) return "";
  ncclResult_t err = ncclSuccess;
  if (ncclCommGetAsyncError(comm_, &err) != ncclSuccess) return "";
  if (err == ncclSuccess || err == ncclInProgress) return "";
  const char* last = ncclGetLastError(comm_);
  return std::string("NCCL reported an asynchronous error: ") + ncclGetErrorString(err) +
         (last && *last ? std::string(" (") + last + ")" : "");
}

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

ncclResult_t NcclCommunicator::settle(ncclResult_t rc) {
  // The communicator is non-blocking (for the bounded setup), so a call may return while NCCL
  // is still enqueueing it (ncclInProgress): poll until it is on the stream, or failed.
  const auto deadline = deadline_after(timeout_s_);
  while (rc == ncclInProgress) {
    if (timeout_s_ > 0.0 && Clock::now() > deadline) return ncclInProgress;
    std::this_thread::yield();
    if (ncclCommGetAsyncError(comm_, &rc) != ncclSuccess) return ncclInternalError;
  }
  return rc;
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

}  // namespace zero::cuda
