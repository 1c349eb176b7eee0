// MpiCommunicator's waits and their deadline: a rank whose wait outlives collective_timeout_s()
// asks every peer what it waits in, reports the collective and the ranks that did not arrive,
// and ends the job (comm/mpi_comm.hpp says how; comm/collective_timeout.hpp how long).
#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "comm/collective_timeout.hpp"
#include "comm/mpi_calls.hpp"
#include "comm/mpi_comm.hpp"
#include "runtime/log.hpp"
#include "zero/error.hpp"

namespace zero {

namespace {

using namespace mpi_calls;

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string describe(const MpiCommunicator::Call& c) {
  const std::string s = fmt::format("{} #{}", kind_name(c.kind), c.seq);
  if (c.kind == kBarrier) return s;
  if (c.kind == kAllReduceScalar) return s + " of one double";
  if (c.kind == kBroadcast) return fmt::format("{} of {} bytes", s, c.count);
  if (c.kind == kSend || c.kind == kRecv)
    return fmt::format("{} {} rank {} of {} {}", s, c.kind == kSend ? "to" : "from", c.peer, c.count,
                       dtype_name(c.dtype));
  return fmt::format("{} of {} {} ({} bytes)", s, c.count, dtype_name(c.dtype), c.count * dtype_size(c.dtype));
}

}  // namespace

void MpiCommunicator::wait(MPI_Request& req, const Call& call) {
  int flag = 0;
  ZERO_MPI_CHECK(MPI_Test(&req, &flag, MPI_STATUS_IGNORE));
  if (flag) return;
  const Clock::time_point start = Clock::now();
  Backoff backoff;
  for (;;) {
    backoff.pause();
    ZERO_MPI_CHECK(MPI_Test(&req, &flag, MPI_STATUS_IGNORE));
    if (flag) return;
    if (backoff.spinning()) continue;  // fast collectives never pay for the checks below
    const double waited = seconds_since(start);
    // A peer's query means its deadline passed while this rank waits too: report alongside it.
    if (answer_queries(call) || (timeout_s_ > 0.0 && waited >= timeout_s_)) report_stall(call, waited);
  }
}

bool MpiCommunicator::answer_queries(const Call& waiting) {
  // The answer's buffer must outlive the freed sends; every answer says the same.
  static std::array<std::int64_t, 2> answer;
  answer = {waiting.seq, waiting.kind};
  bool asked = false;
  for (;;) {
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kQueryTag, side_, &flag, &st) != MPI_SUCCESS || !flag) return asked;
    std::array<std::int64_t, 2> query{};
    MPI_Recv(query.data(), 2, MPI_INT64_T, st.MPI_SOURCE, kQueryTag, side_, MPI_STATUS_IGNORE);
    MPI_Request r;
    if (MPI_Isend(answer.data(), 2, MPI_INT64_T, st.MPI_SOURCE, kAnswerTag, side_, &r) == MPI_SUCCESS)
      MPI_Request_free(&r);
    asked = true;
  }
}

void MpiCommunicator::report_stall(const Call& call, double waited_s) {
  // Ask every peer what it waits in; give them a short grace to answer (waiting ranks poll at
  // least every millisecond), answering their own queries meanwhile. Errors are ignored: the
  // job ends either way, and the message matters more than a clean exit.
  static std::array<std::int64_t, 2> query;
  query = {call.seq, call.kind};
  std::vector<std::array<std::int64_t, 2>> answers(static_cast<std::size_t>(size_), {-1, -1});
  std::vector<MPI_Request> recvs(static_cast<std::size_t>(size_), MPI_REQUEST_NULL);
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    MPI_Request q;
    if (MPI_Isend(query.data(), 2, MPI_INT64_T, r, kQueryTag, side_, &q) == MPI_SUCCESS) MPI_Request_free(&q);
    MPI_Irecv(answers[static_cast<std::size_t>(r)].data(), 2, MPI_INT64_T, r, kAnswerTag, side_,
              &recvs[static_cast<std::size_t>(r)]);
  }
  std::vector<bool> answered(static_cast<std::size_t>(size_), false);
  answered[static_cast<std::size_t>(rank_)] = true;
  const double grace = std::clamp(timeout_s_ / 10.0, 0.5, 2.0);
  const Clock::time_point start = Clock::now();
  int pending = size_ - 1;
  while (pending > 0 && seconds_since(start) < grace) {
    answer_queries(call);
    for (int r = 0; r < size_; ++r) {
      int flag = 0;
      if (answered[static_cast<std::size_t>(r)] ||
          MPI_Test(&recvs[static_cast<std::size_t>(r)], &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS || !flag)
        continue;
      answered[static_cast<std::size_t>(r)] = true;
      --pending;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  answer_queries(call);  // late queries still get their answer before this rank goes

  std::vector<int> missing, with_me;
  std::string elsewhere;
  for (int r = 0; r < size_; ++r) {
    const auto& a = answers[static_cast<std::size_t>(r)];
    if (!answered[static_cast<std::size_t>(r)])
      missing.push_back(r);
    else if (r == rank_ || (a[0] == call.seq && a[1] == call.kind))
      with_me.push_back(r);
    else if (a[0] < call.seq)  // this rank's part of it is done; the data for that rank may not be
      elsewhere += fmt::format(
          "; {} is still in {} #{}, which this rank has finished (what it waits for may be in flight on a slow or "
          "broken link)",
          located({r}), kind_name(a[1]), a[0]);
    else if (a[0] > call.seq)
      elsewhere += fmt::format("; {} is already in {} #{}", located({r}), kind_name(a[1]), a[0]);
    else
      elsewhere += fmt::format("; {} waits in {} #{} instead (the ranks issue different collectives)", located({r}),
                               kind_name(a[1]), a[0]);
  }
  // Every rank of another node missing: the host or the network to it, more likely than the program.
  std::vector<int> lost_nodes;
  for (int r : missing) {
    const int node = node_of_[static_cast<std::size_t>(r)];
    if (node == node_of_[static_cast<std::size_t>(rank_)] ||
        std::find(lost_nodes.begin(), lost_nodes.end(), node) != lost_nodes.end())
      continue;
    bool all = true;
    for (int q = 0; q < size_; ++q)
      all = all && (node_of_[static_cast<std::size_t>(q)] != node ||
                    std::find(missing.begin(), missing.end(), q) != missing.end());
    if (all) lost_nodes.push_back(node);
  }
  const std::string limit =
      timeout_s_ > 0.0
          ? fmt::format("did not complete within the collective deadline (ZERO_TIMEOUT_S={:g} s; waited {:.1f} s)",
                        timeout_s_, waited_s)
          : fmt::format("was abandoned after {:.1f} s: a peer's collective deadline passed", waited_s);
  const std::string arrivals =
      missing.empty() ? std::string("every rank answered")
                      : located(missing) + " did not arrive (no answer: stopped, hung, or busy outside collectives)";
  std::string advice =
      "Find what the missing ranks are doing (gdb -p PID, or their last log lines), or raise ZERO_TIMEOUT_S if "
      "such a wait is expected (0 disables the deadline)";
  if (!lost_nodes.empty()) {
    std::string which;
    for (int n : lost_nodes) which += fmt::format("{}{}", which.empty() ? "" : ", ", n);
    advice = fmt::format(
        "No rank of node{} {} answered: check that host and the network to it first (a cut link, a host that is "
        "down or frozen); a network outage shorter than the deadline can still end the job, as TCP's "
        "retransmission backoff stretches it. Otherwise find what those ranks are doing (gdb -p PID), or raise "
        "ZERO_TIMEOUT_S (0 disables the deadline)",
        lost_nodes.size() > 1 ? "s" : "", which);
  }
  // Every rank in this very collective: nothing is missing, its data is late. Across nodes that is
  // the network between them (a slow or broken link, or TCP's backoff after an outage); the
  // waiting ranks are then named by node and host.
  const bool all_here = static_cast<int>(with_me.size()) == size_;
  const bool nodes = spans_nodes();
  if (all_here)
    advice = nodes ? "Every rank is in it, so its data is what is late: check the network between the nodes first (a "
                     "slow or broken link; after an outage TCP's retransmission backoff can outlast the deadline), or "
                     "raise ZERO_TIMEOUT_S (0 disables the deadline)"
                   : "Every rank is in it, so its data is what is late: a transport that stopped moving (shared "
                     "memory, a NIC), or a wait longer than the deadline; raise ZERO_TIMEOUT_S if such a wait is "
                     "expected (0 disables the deadline)";
  std::vector<int> everyone;
  for (int r = 0; r < size_; ++r) everyone.push_back(r);
  const std::string where =
      group_.empty() ? std::string() : fmt::format(" on the {} ({})", group_, ranks_text(everyone));
  // Not log(): the job aborts next, so the report must get out whatever ZERO_LOG_LEVEL says and
  // without waiting on stdio's lock. The layout is the log's ("[rank r/n] error: ..."), as the
  // CUDA watchdog's report.
  write_last_words(log_line_text(LogLevel::error,
                                 fmt::format("{}{} {}: {}; waiting in it: {}{}. {}. This rank's last collectives: {}",
                                             describe(call), where, limit, arrivals,
                                             all_here && nodes ? located(with_me) : ranks_text(with_me), elsewhere,
                                             advice, check_->recent())) +
                   '\n');
  // A peer that this rank's query woke started its own grace a moment later: linger as long,
  // still answering, so it prints its report too before MPI_Abort ends everyone.
  const Clock::time_point printed = Clock::now();
  while (seconds_since(printed) < grace) {
    answer_queries(call);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  MPI_Abort(MPI_COMM_WORLD, kCollectiveTimeoutExit);
  std::_Exit(kCollectiveTimeoutExit);
}

}  // namespace zero
