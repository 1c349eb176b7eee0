// NcclCommunicator's setup (init and split, bounded by the collective timeout, naming the ranks
// that never arrived), its teardown, and the polling of its non-blocking calls.
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
#include "zero/error.hpp"

namespace zero::cuda {

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
  leave_thread_group();
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

}  // namespace zero::cuda
