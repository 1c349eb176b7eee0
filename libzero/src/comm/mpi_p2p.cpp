// MpiCommunicator's point-to-point transfers: the payload on the communicator and, with the
// collective check on, a header the receiver compares with what it posted (comm/mpi_comm.hpp).
#include <fmt/format.h>
#include <mpi.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string_view>
#include <utility>

#include "comm/mpi_calls.hpp"
#include "comm/mpi_comm.hpp"
#include "zero/error.hpp"

namespace zero {

namespace {

using namespace mpi_calls;

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

}  // namespace

MpiCommunicator::Call MpiCommunicator::p2p_call(int kind, std::size_t count, DType t, int peer) {
  ZERO_CHECK(peer >= 0 && peer < size_ && peer != rank_,
             fmt::format("{}: peer {} is not another rank of this communicator of {} ranks (this is rank {})",
                         kind_name(kind), peer, size_, rank_));
  check_->note(kind_name(kind), count, t, peer);
  if (kind == kSend) {
    const auto bytes = static_cast<std::int64_t>(count * dtype_size(t));
    (node_of_[static_cast<std::size_t>(peer)] == node_of_[static_cast<std::size_t>(rank_)] ? traffic_.intra_node
                                                                                           : traffic_.inter_node) +=
        bytes;
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
