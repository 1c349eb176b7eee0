#include "comm/mpi_comm.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <string>
#include <string_view>
#include <thread>

#include "comm/collective_timeout.hpp"
#include "comm/topology.hpp"
#include "runtime/log.hpp"
#include "runtime/strings.hpp"
#include "zero/error.hpp"

namespace zero {

namespace {

int checked_count(std::size_t n, const char* what) {
  ZERO_CHECK(n <= static_cast<std::size_t>(INT_MAX),
             fmt::format("{}: {} elements exceed MPI's int count; use smaller buckets (reduce_bucket_size / "
                         "allgather_bucket_size)",
                         what, n));
  return static_cast<int>(n);
}

MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::max ? MPI_MAX : MPI_SUM; }

enum Kind : int {
  kAllReduce, kReduceScatter, kAllGather, kBroadcast, kBarrier, kAllReduceScalar, kSend, kRecv, kAllToAll, kKinds
};
const char* kind_name(std::int64_t k) {
  static const char* names[kKinds] = {"all_reduce", "reduce_scatter",    "all_gather", "broadcast", "barrier",
                                      "all_reduce_scalar", "send",       "recv",       "all_to_all"};
  return k >= 0 && k < kKinds ? names[k] : "an unknown collective";
}
// Side-channel tags: a rank past its deadline sends a query; a waiting rank answers with the
// collective it waits in.
constexpr int kQueryTag = 1, kAnswerTag = 2;
// Point to point: the payload on the communicator, its header on the side channel.
constexpr int kP2PTag = 3;

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string describe(const MpiCommunicator::Call& c) {
  const std::string s = fmt::format("{} #{}", kind_name(c.kind), c.seq);
  if (c.kind == kBarrier) return s;
  if (c.kind == kAllReduceScalar) return s + " of one double";
  if (c.kind == kBroadcast) return fmt::format("{} of {} bytes", s, c.count);
  if (c.kind == kSend || c.kind == kRecv)
    return fmt::format("{} {} rank {} of {} {}", s, c.kind == kSend ? "to" : "from", c.peer, c.count, dtype_name(c.dtype));
  return fmt::format("{} of {} {} ({} bytes)", s, c.count, dtype_name(c.dtype), c.count * dtype_size(c.dtype));
}

// A request plus what must happen once it completes (narrowing staged 16-bit results,
// averaging, returning scratch to the pool).
class MpiWork final : public Work::Impl {
 public:
  MpiWork(MpiCommunicator* comm, const MpiCommunicator::Call& call, MPI_Request req, std::function<void()> finish)
      : comm_(comm), call_(call), req_(req), finish_(std::move(finish)) {}
  void wait() override {
    if (done_) return;
    comm_->wait(req_, call_);
    complete();
  }
  bool test() override {
    if (done_) return true;
    int flag = 0;
    ZERO_MPI_CHECK(MPI_Test(&req_, &flag, MPI_STATUS_IGNORE));
    if (flag) complete();
    return done_;
  }

 private:
  void complete() {
    done_ = true;
    if (finish_) finish_();
  }
  MpiCommunicator* comm_;
  MpiCommunicator::Call call_;
  MPI_Request req_;
  std::function<void()> finish_;
  bool done_ = false;
};

// A point-to-point transfer: the payload's request and, with the check on, the header's. A
// receive compares the header with what it posted before it waits for the payload, so a
// mismatched pair is reported instead of truncating or misreading the buffer.
class P2PWork final : public Work::Impl {
 public:
  using Header = std::array<std::int64_t, 3>;  // count, dtype, sender's rank
  P2PWork(MpiCommunicator* comm, const MpiCommunicator::Call& call, bool receiving)
      : comm_(comm), call_(call), receiving_(receiving) {}
  MPI_Request payload = MPI_REQUEST_NULL, header_req = MPI_REQUEST_NULL;
  Header header{};

  void wait() override {
    if (done_) return;
    if (header_req != MPI_REQUEST_NULL) comm_->wait(header_req, call_);
    header_arrived();
    comm_->wait(payload, call_);
    done_ = true;
  }
  bool test() override {
    if (done_) return true;
    int flag = 1;
    if (header_req != MPI_REQUEST_NULL) ZERO_MPI_CHECK(MPI_Test(&header_req, &flag, MPI_STATUS_IGNORE));
    if (!flag) return false;
    header_arrived();
    ZERO_MPI_CHECK(MPI_Test(&payload, &flag, MPI_STATUS_IGNORE));
    done_ = flag != 0;
    return done_;
  }

 private:
  // The header is in (or there is none): a receive checks it once.
  void header_arrived() {
    if (!receiving_ || checked_ || !comm_->checks_p2p()) return;
    checked_ = true;
    const auto count = static_cast<std::size_t>(header[0]);
    const auto t = static_cast<DType>(header[1]);
    if (count == call_.count && t == call_.dtype) return;
    // The payload would not fit or would be misread: drop the posted receive and stop.
    MPI_Cancel(&payload);
    MPI_Request_free(&payload);
    done_ = true;
    ZERO_THROW(fmt::format(
        "point-to-point mismatch: {} sent {} {} ({} bytes), but {} posted a receive of {} {} ({} bytes) from "
        "it. The two ranks must pair each send_async with a recv_async of the same count and dtype, in the same order "
        "(the pipeline schedule of both stages, or the activation shapes, differ)",
        comm_->ranks_text({static_cast<int>(header[2])}), count, dtype_name(t), count * dtype_size(t),
        comm_->ranks_text({comm_->rank()}), call_.count, dtype_name(call_.dtype),
        call_.count * dtype_size(call_.dtype)));
  }
  MpiCommunicator* comm_;
  MpiCommunicator::Call call_;
  bool receiving_;
  bool checked_ = false;
  bool done_ = false;
};

// Averaging divides (rather than multiplying by 1/size) so the result is the correctly
// rounded mean of the fp32 sum.
void divide_f32(float* p, std::size_t n, float d) {
  for (std::size_t i = 0; i < n; ++i) p[i] /= d;
}

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm) {
  ZERO_MPI_CHECK(MPI_Comm_dup(comm, &comm_));
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  ZERO_MPI_CHECK(MPI_Comm_dup(comm, &side_));
  MPI_Comm_set_errhandler(side_, MPI_ERRORS_RETURN);
  timeout_s_ = collective_timeout_s();
  check_ = std::make_unique<CollectiveCheck>(comm);
  node_of_ = node_of_ranks(comm_);
}

MpiCommunicator::~MpiCommunicator() {
  check_.reset();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) {
    MPI_Comm_free(&side_);
    MPI_Comm_free(&comm_);
  }
}

MpiCommunicator::Call MpiCommunicator::next_call(int kind, std::size_t count, DType t, int root) {
  const Call call{seq_, kind, count, t};
  check_->agree(kind_name(kind), count, t, root, [&](MPI_Request& r) { wait(r, call); });
  count_traffic(kind, count, t, root);
  ++seq_;
  return call;
}

void MpiCommunicator::count_traffic(int kind, std::size_t count, DType t, int root) {
  if (size_ == 1) return;
  const std::int64_t n = size_, esize = static_cast<std::int64_t>(dtype_size(t));
  const std::int64_t c = static_cast<std::int64_t>(count);
  std::int64_t bytes = 0;
  if (kind == kAllToAll) {  // each block goes straight to its rank
    for (int j = 0; j < size_; ++j)
      if (j != rank_)
        (node_of_[static_cast<std::size_t>(j)] == node_of_[static_cast<std::size_t>(rank_)] ? traffic_.intra_node
                                                                                             : traffic_.inter_node) +=
            c * esize;
    return;
  }
  switch (kind) {
    case kAllGather:
    case kReduceScatter: bytes = ring_gather_bytes(n, c, esize); break;
    case kAllReduce: bytes = ring_all_reduce_bytes(n, c, esize); break;
    case kAllReduceScalar: bytes = ring_all_reduce_bytes(n, n, static_cast<std::int64_t>(sizeof(double))); break;
    case kBroadcast: bytes = (rank_ + 1) % size_ == root ? 0 : c; break;  // count is bytes
    default: break;  // barrier: no payload
  }
  const int next = (rank_ + 1) % size_;
  (node_of_[static_cast<std::size_t>(next)] == node_of_[static_cast<std::size_t>(rank_)] ? traffic_.intra_node
                                                                                          : traffic_.inter_node) += bytes;
}

std::unique_ptr<MpiCommunicator> MpiCommunicator::split(int color, int key) const {
  MPI_Comm c = MPI_COMM_NULL;
  ZERO_MPI_CHECK(MPI_Comm_split(comm_, color, key, &c));
  auto sub = std::make_unique<MpiCommunicator>(c);  // keeps its own duplicate
  MPI_Comm_free(&c);
  return sub;
}

void MpiCommunicator::set_group(std::string name) {
  group_ = std::move(name);
  MPI_Group mine = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
  ZERO_MPI_CHECK(MPI_Comm_group(comm_, &mine));
  ZERO_MPI_CHECK(MPI_Comm_group(MPI_COMM_WORLD, &world));
  std::vector<int> local(static_cast<std::size_t>(size_));
  for (int r = 0; r < size_; ++r) local[static_cast<std::size_t>(r)] = r;
  world_rank_.assign(static_cast<std::size_t>(size_), -1);
  ZERO_MPI_CHECK(MPI_Group_translate_ranks(mine, size_, local.data(), world, world_rank_.data()));
  MPI_Group_free(&mine);
  MPI_Group_free(&world);
}

std::string MpiCommunicator::ranks_text(const std::vector<int>& ranks) const {
  if (group_.empty()) return rank_list(ranks);
  std::vector<int> w;
  for (int r : ranks) w.push_back(world_rank_[static_cast<std::size_t>(r)]);
  return "world " + rank_list(w);
}

void MpiCommunicator::check_collective(const char* kind, std::size_t count, DType t, int root) {
  // A device communicator's collective: stalls in its check are reported as this kind.
  int k = 0;
  while (k < kKinds && std::string_view(kind_name(k)) != kind) ++k;
  const Call call{seq_, k, count, t};
  check_->agree(kind, count, t, root, [&](MPI_Request& r) { wait(r, call); });
  // Its traffic counts here: the device communicator spans the same ranks.
  count_traffic(k, count, t, root);
}

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
    else
      elsewhere += fmt::format("; {} waits in {} #{} instead (the ranks issue different collectives)",
                               ranks_text({r}), kind_name(a[1]), a[0]);
  }
  const std::string limit =
      timeout_s_ > 0.0
          ? fmt::format("did not complete within the collective deadline (ZERO_TIMEOUT_S={:g} s; waited {:.1f} s)",
                        timeout_s_, waited_s)
          : fmt::format("was abandoned after {:.1f} s: a peer's collective deadline passed", waited_s);
  const std::string arrivals =
      missing.empty() ? std::string("every rank answered")
                      : ranks_text(missing) + " did not arrive (no answer: stopped, hung, or busy outside collectives)";
  std::vector<int> everyone;
  for (int r = 0; r < size_; ++r) everyone.push_back(r);
  const std::string where =
      group_.empty() ? std::string() : fmt::format(" on the {} ({})", group_, ranks_text(everyone));
  // Not log(): the job aborts next, so the report must get out whatever ZERO_LOG_LEVEL says and
  // without waiting on stdio's lock. The layout is the log's ("[rank r/n] error: ..."), as the
  // CUDA watchdog's report.
  write_last_words(log_line_text(
      LogLevel::error,
      fmt::format("{}{} {}: {}; waiting in it: {}{}. Find what the missing ranks are doing (gdb -p PID, or their "
                  "last log lines), or raise ZERO_TIMEOUT_S if such a wait is expected (0 disables the deadline). "
                  "This rank's last collectives: {}",
                  describe(call), where, limit, arrivals, ranks_text(with_me), elsewhere, check_->recent())) +
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

std::vector<float> MpiCommunicator::take_scratch(std::size_t n) {
  std::lock_guard<std::mutex> lock(scratch_mu_);
  for (auto it = scratch_.begin(); it != scratch_.end(); ++it) {
    if (it->capacity() >= n) {
      std::vector<float> v = std::move(*it);
      scratch_.erase(it);
      v.resize(n);
      return v;
    }
  }
  return std::vector<float>(n);
}

void MpiCommunicator::give_scratch(std::vector<float>&& v) {
  std::lock_guard<std::mutex> lock(scratch_mu_);
  scratch_.push_back(std::move(v));
}

Work MpiCommunicator::all_reduce_async(void* buf, std::size_t count, DType t, ReduceOp op) {
  int n = checked_count(count, "all_reduce");
  const Call call = next_call(kAllReduce, count, t);
  float avg = op == ReduceOp::avg ? static_cast<float>(size_) : 1.0f;
  MPI_Request req;
  if (t == DType::f32) {
    ZERO_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buf, n, MPI_FLOAT, mpi_op(op), comm_, &req));
    std::function<void()> fin;
    if (op == ReduceOp::avg) fin = [=] { divide_f32(static_cast<float*>(buf), count, avg); };
    return Work(std::make_unique<MpiWork>(this, call, req, std::move(fin)));
  }
  auto wide = std::make_shared<std::vector<float>>(take_scratch(count));
  convert(buf, t, wide->data(), DType::f32, count);
  ZERO_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, wide->data(), n, MPI_FLOAT, mpi_op(op), comm_, &req));
  return Work(std::make_unique<MpiWork>(this, call, req, [=, this] {
    if (avg != 1.0f) divide_f32(wide->data(), count, avg);
    convert(wide->data(), DType::f32, buf, t, count);
    give_scratch(std::move(*wide));
  }));
}

Work MpiCommunicator::reduce_scatter_async(const void* send, void* recv, std::size_t recv_count,
                                           DType t, ReduceOp op) {
  int n = checked_count(recv_count, "reduce_scatter");
  checked_count(recv_count * static_cast<std::size_t>(size_), "reduce_scatter (send buffer)");
  const Call call = next_call(kReduceScatter, recv_count, t);
  float avg = op == ReduceOp::avg ? static_cast<float>(size_) : 1.0f;
  MPI_Request req;
  if (t == DType::f32) {
    ZERO_MPI_CHECK(MPI_Ireduce_scatter_block(send, recv, n, MPI_FLOAT, mpi_op(op), comm_, &req));
    std::function<void()> fin;
    if (op == ReduceOp::avg) fin = [=] { divide_f32(static_cast<float*>(recv), recv_count, avg); };
    return Work(std::make_unique<MpiWork>(this, call, req, std::move(fin)));
  }
  std::size_t total = recv_count * static_cast<std::size_t>(size_);
  auto wide = std::make_shared<std::vector<float>>(take_scratch(total + recv_count));
  convert(send, t, wide->data(), DType::f32, total);
  float* out = wide->data() + total;
  ZERO_MPI_CHECK(MPI_Ireduce_scatter_block(wide->data(), out, n, MPI_FLOAT, mpi_op(op), comm_, &req));
  return Work(std::make_unique<MpiWork>(this, call, req, [=, this] {
    if (avg != 1.0f) divide_f32(out, recv_count, avg);
    convert(out, DType::f32, recv, t, recv_count);
    give_scratch(std::move(*wide));
  }));
}

Work MpiCommunicator::all_gather_async(const void* send, void* recv, std::size_t send_count, DType t) {
  std::size_t esize = dtype_size(t);
  int bytes = checked_count(send_count * esize, "all_gather (bytes)");
  checked_count(send_count * esize * static_cast<std::size_t>(size_), "all_gather (bytes)");
  const void* own = static_cast<const char*>(recv) + static_cast<std::size_t>(rank_) * send_count * esize;
  const void* src = send == own ? MPI_IN_PLACE : send;
  const Call call = next_call(kAllGather, send_count, t);
  MPI_Request req;
  ZERO_MPI_CHECK(MPI_Iallgather(src, bytes, MPI_BYTE, recv, bytes, MPI_BYTE, comm_, &req));
  return Work(std::make_unique<MpiWork>(this, call, req, nullptr));
}

Work MpiCommunicator::all_to_all_async(const void* send, void* recv, std::size_t count, DType t) {
  const int bytes = checked_count(count * dtype_size(t), "all_to_all (bytes per rank)");
  checked_count(count * dtype_size(t) * static_cast<std::size_t>(size_), "all_to_all (bytes)");
  const Call call = next_call(kAllToAll, count, t);
  MPI_Request req;
  ZERO_MPI_CHECK(MPI_Ialltoall(send, bytes, MPI_BYTE, recv, bytes, MPI_BYTE, comm_, &req));
  return Work(std::make_unique<MpiWork>(this, call, req, nullptr));
}

Work MpiCommunicator::broadcast_async(void* buf, std::size_t bytes, int root) {
  ZERO_CHECK(root >= 0 && root < size_, fmt::format("broadcast: root {} is not a rank", root));
  const int n = checked_count(bytes, "broadcast (bytes)");
  const Call call = next_call(kBroadcast, bytes, DType::f32, root);
  MPI_Request req;
  ZERO_MPI_CHECK(MPI_Ibcast(buf, n, MPI_BYTE, root, comm_, &req));
  return Work(std::make_unique<MpiWork>(this, call, req, nullptr));
}

Work MpiCommunicator::barrier_async() {
  const Call call = next_call(kBarrier, 0, DType::f32);
  MPI_Request req;
  ZERO_MPI_CHECK(MPI_Ibarrier(comm_, &req));
  return Work(std::make_unique<MpiWork>(this, call, req, nullptr));
}

double MpiCommunicator::all_reduce_scalar(double v, ReduceOp op) {
  double out = 0.0;
  const Call call = next_call(kAllReduceScalar, 1, DType::f32);
  MPI_Request req;
  ZERO_MPI_CHECK(MPI_Iallreduce(&v, &out, 1, MPI_DOUBLE, mpi_op(op), comm_, &req));
  wait(req, call);
  return op == ReduceOp::avg ? out / size_ : out;
}

MpiCommunicator::Call MpiCommunicator::p2p_call(int kind, std::size_t count, DType t, int peer) {
  ZERO_CHECK(peer >= 0 && peer < size_ && peer != rank_,
             fmt::format("{}: peer {} is not another rank of this communicator of {} ranks (this is rank {})",
                         kind_name(kind), peer, size_, rank_));
  check_->note(kind_name(kind), count, t, peer);
  if (kind == kSend) {
    const auto bytes = static_cast<std::int64_t>(count * dtype_size(t));
    (node_of_[static_cast<std::size_t>(peer)] == node_of_[static_cast<std::size_t>(rank_)] ? traffic_.intra_node
                                                                                          : traffic_.inter_node) += bytes;
  }
  Call call{p2p_seq_++, kind, count, t};
  call.peer = peer;
  return call;
}

void MpiCommunicator::note_p2p(const char* kind, std::size_t count, DType t, int peer) {
  (void)p2p_call(std::string_view(kind) == "send" ? kSend : kRecv, count, t, peer);
}

Work MpiCommunicator::send_async(const void* buf, std::size_t count, DType t, int peer) {
  const int bytes = checked_count(count * dtype_size(t), "send (bytes)");
  auto w = std::make_unique<P2PWork>(this, p2p_call(kSend, count, t, peer), false);
  if (checks_p2p()) {
    w->header = {static_cast<std::int64_t>(count), static_cast<std::int64_t>(t), rank_};
    ZERO_MPI_CHECK(MPI_Isend(w->header.data(), 3, MPI_INT64_T, peer, kP2PTag, side_, &w->header_req));
  }
  ZERO_MPI_CHECK(MPI_Isend(buf, bytes, MPI_BYTE, peer, kP2PTag, comm_, &w->payload));
  return Work(std::move(w));
}

Work MpiCommunicator::recv_async(void* buf, std::size_t count, DType t, int peer) {
  const int bytes = checked_count(count * dtype_size(t), "recv (bytes)");
  auto w = std::make_unique<P2PWork>(this, p2p_call(kRecv, count, t, peer), true);
  if (checks_p2p()) ZERO_MPI_CHECK(MPI_Irecv(w->header.data(), 3, MPI_INT64_T, peer, kP2PTag, side_, &w->header_req));
  ZERO_MPI_CHECK(MPI_Irecv(buf, bytes, MPI_BYTE, peer, kP2PTag, comm_, &w->payload));
  return Work(std::move(w));
}

}  // namespace zero
