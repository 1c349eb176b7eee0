// MpiCommunicator's collectives (comm/mpi_comm.hpp): construction and sub-communicators, the
// collective check and the traffic count of each call, and the non-blocking collectives with
// their fp32 staging. Point to point is in comm/mpi_p2p.cpp, waits and deadlines in mpi_stall.cpp.
#include "comm/mpi_comm.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "comm/collective_timeout.hpp"
#include "comm/mpi_calls.hpp"
#include "comm/topology.hpp"
#include "runtime/strings.hpp"
#include "zero/error.hpp"

namespace zero {

namespace {

using namespace mpi_calls;

MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::max ? MPI_MAX : MPI_SUM; }

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
  // Host names, for a deadline report that says where the missing ranks run.
  std::array<char, 64> mine{};
  if (::gethostname(mine.data(), mine.size() - 1) != 0) std::snprintf(mine.data(), mine.size(), "?");
  std::vector<char> all(mine.size() * static_cast<std::size_t>(size_));
  ZERO_MPI_CHECK(MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_CHAR, all.data(),
                               static_cast<int>(mine.size()), MPI_CHAR, comm_));
  for (int r = 0; r < size_; ++r) host_.emplace_back(all.data() + static_cast<std::size_t>(r) * mine.size());
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
    default: break;                                                       // barrier: no payload
  }
  const int next = (rank_ + 1) % size_;
  (node_of_[static_cast<std::size_t>(next)] == node_of_[static_cast<std::size_t>(rank_)] ? traffic_.intra_node
                                                                                         : traffic_.inter_node) +=
      bytes;
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

bool MpiCommunicator::spans_nodes() const { return *std::max_element(node_of_.begin(), node_of_.end()) > 0; }

std::string MpiCommunicator::located(const std::vector<int>& ranks) const {
  const bool nodes = spans_nodes();
  std::string out;
  std::vector<bool> done(ranks.size(), false);
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (done[i]) continue;
    const int node = node_of_[static_cast<std::size_t>(ranks[i])];
    std::vector<int> same;
    for (std::size_t j = i; j < ranks.size(); ++j)
      if (!done[j] && node_of_[static_cast<std::size_t>(ranks[j])] == node) same.push_back(ranks[j]), done[j] = true;
    const std::string& host = host_[static_cast<std::size_t>(ranks[i])];
    out += fmt::format("{}{} ({}host {})", out.empty() ? "" : ", ", ranks_text(same),
                       nodes ? fmt::format("node {}, ", node) : std::string(), host);
  }
  return out;
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

Work MpiCommunicator::reduce_scatter_async(const void* send, void* recv, std::size_t recv_count, DType t, ReduceOp op) {
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

}  // namespace zero
