#include "comm_mpi.hpp"

#include <climits>
#include <string>

#include "zero/error.hpp"

namespace zero {

namespace {

int checked_count(std::size_t n, const char* what) {
  ZERO_CHECK(n <= static_cast<std::size_t>(INT_MAX),
             std::string(what) + ": " + std::to_string(n) +
                 " elements exceed MPI's int count; use smaller buckets (reduce_bucket_size / "
                 "allgather_bucket_size)");
  return static_cast<int>(n);
}

MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::max ? MPI_MAX : MPI_SUM; }

// A request plus what must happen once it completes (narrowing staged 16-bit results,
// averaging, returning scratch to the pool).
class MpiWork final : public Work::Impl {
 public:
  MpiWork(MPI_Request req, std::function<void()> finish) : req_(req), finish_(std::move(finish)) {}
  void wait() override {
    if (done_) return;
    ZERO_MPI_CHECK(MPI_Wait(&req_, MPI_STATUS_IGNORE));
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
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Comm_free(&comm_);
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
  float avg = op == ReduceOp::avg ? static_cast<float>(size_) : 1.0f;
  MPI_Request req;
  if (t == DType::f32) {
    ZERO_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buf, n, MPI_FLOAT, mpi_op(op), comm_, &req));
    std::function<void()> fin;
    if (op == ReduceOp::avg) fin = [=] { divide_f32(static_cast<float*>(buf), count, avg); };
    return Work(std::make_unique<MpiWork>(req, std::move(fin)));
  }
  auto wide = std::make_shared<std::vector<float>>(take_scratch(count));
  convert(buf, t, wide->data(), DType::f32, count);
  ZERO_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, wide->data(), n, MPI_FLOAT, mpi_op(op), comm_, &req));
  return Work(std::make_unique<MpiWork>(req, [=, this] {
    if (avg != 1.0f) divide_f32(wide->data(), count, avg);
    convert(wide->data(), DType::f32, buf, t, count);
    give_scratch(std::move(*wide));
  }));
}

Work MpiCommunicator::reduce_scatter_async(const void* send, void* recv, std::size_t recv_count,
                                           DType t, ReduceOp op) {
  int n = checked_count(recv_count, "reduce_scatter");
  checked_count(recv_count * static_cast<std::size_t>(size_), "reduce_scatter (send buffer)");
  float avg = op == ReduceOp::avg ? static_cast<float>(size_) : 1.0f;
  MPI_Request req;
  if (t == DType::f32) {
    ZERO_MPI_CHECK(MPI_Ireduce_scatter_block(send, recv, n, MPI_FLOAT, mpi_op(op), comm_, &req));
    std::function<void()> fin;
    if (op == ReduceOp::avg) fin = [=] { divide_f32(static_cast<float*>(recv), recv_count, avg); };
    return Work(std::make_unique<MpiWork>(req, std::move(fin)));
  }
  std::size_t total = recv_count * static_cast<std::size_t>(size_);
  auto wide = std::make_shared<std::vector<float>>(take_scratch(total + recv_count));
  convert(send, t, wide->data(), DType::f32, total);
  float* out = wide->data() + total;
  ZERO_MPI_CHECK(MPI_Ireduce_scatter_block(wide->data(), out, n, MPI_FLOAT, mpi_op(op), comm_, &req));
  return Work(std::make_unique<MpiWork>(req, [=, this] {
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
  MPI_Request req;
  ZERO_MPI_CHECK(MPI_Iallgather(src, bytes, MPI_BYTE, recv, bytes, MPI_BYTE, comm_, &req));
  return Work(std::make_unique<MpiWork>(req, nullptr));
}

Work MpiCommunicator::broadcast_async(void* buf, std::size_t bytes, int root) {
  ZERO_CHECK(root >= 0 && root < size_, "broadcast: root " + std::to_string(root) + " is not a rank");
  MPI_Request req;
  ZERO_MPI_CHECK(MPI_Ibcast(buf, checked_count(bytes, "broadcast (bytes)"), MPI_BYTE, root, comm_, &req));
  return Work(std::make_unique<MpiWork>(req, nullptr));
}

Work MpiCommunicator::barrier_async() {
  MPI_Request req;
  ZERO_MPI_CHECK(MPI_Ibarrier(comm_, &req));
  return Work(std::make_unique<MpiWork>(req, nullptr));
}

double MpiCommunicator::all_reduce_scalar(double v, ReduceOp op) {
  double out = 0.0;
  ZERO_MPI_CHECK(MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, mpi_op(op), comm_));
  return op == ReduceOp::avg ? out / size_ : out;
}

}  // namespace zero
