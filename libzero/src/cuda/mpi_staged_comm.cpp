#include "cuda/mpi_staged_comm.hpp"

#include <fmt/format.h>

#include <string>

#include "cuda/cuda_check.hpp"
#include "zero/error.hpp"

namespace zero::cuda {

namespace {

// The host collective on the staged bytes; on completion, the result goes back to the device.
class StagedWork final : public Work::Impl {
 public:
  StagedWork(MpiStagedCommunicator* c, Work host, offload::PinnedBuffer buf, const void* result, void* dst,
             std::size_t bytes)
      : c_(c), host_(std::move(host)), buf_(std::move(buf)), result_(result), dst_(dst), bytes_(bytes) {}
  void wait() override {
    if (done_) return;
    host_.wait();
    // Done only once the copy back is enqueued: a copy refused (a captured compute stream) is
    // tried again by the next wait().
    if (bytes_ > 0) c_->copy_back(dst_, result_, bytes_, std::move(buf_));
    done_ = true;
  }
  bool test() override { return done_ || host_.done(); }

 private:
  MpiStagedCommunicator* c_;
  Work host_;
  offload::PinnedBuffer buf_;
  const void* result_;
  void* dst_;
  std::size_t bytes_;
  bool done_ = false;
};

}  // namespace

MpiStagedCommunicator::MpiStagedCommunicator(Communicator& host, StreamSet& streams, offload::PinnedPool& pool)
    : host_(host), streams_(streams), pool_(pool) {
  ZERO_CUDA_CHECK(cudaGetDevice(&device_));  // the backend's, current at construction
  ready_ = Event::create();
}

MpiStagedCommunicator::~MpiStagedCommunicator() {
  // Copies back may still read the retired buffers.
  for (auto& r : retired_) cudaEventSynchronize(r.second.get());
}

offload::PinnedBuffer MpiStagedCommunicator::take(std::size_t bytes, const char* what) {
  // First CUDA call of every collective: the legacy compute stream is the current device's.
  use_device(device_);
  refuse_capture(streams_.compute, what);
  while (!retired_.empty() && cudaEventQuery(retired_.front().second.get()) == cudaSuccess) {
    spare_events_.push_back(std::move(retired_.front().second));
    retired_.pop_front();  // the buffer goes back to the pool
  }
  return pool_.acquire(bytes);
}

void MpiStagedCommunicator::stage_in(void* host_dst, const void* dev_src, std::size_t bytes) {
  if (bytes == 0) return;
  use_device(device_);
  stream_after(streams_.comm, streams_.compute, ready_.get());
  ZERO_CUDA_CHECK(cudaMemcpyAsync(host_dst, dev_src, bytes, cudaMemcpyDefault, streams_.comm));
  ZERO_CUDA_CHECK(cudaStreamSynchronize(streams_.comm));
}

void MpiStagedCommunicator::copy_back(void* dev_dst, const void* host_src, std::size_t bytes,
                                      offload::PinnedBuffer&& buf) {
  use_device(device_);
  // Captured, the copy would become a graph node that a replay repeats from a reused buffer.
  refuse_capture(streams_.compute, "Work::wait()");
  ZERO_CUDA_CHECK(cudaMemcpyAsync(dev_dst, host_src, bytes, cudaMemcpyDefault, streams_.compute));
  Event e;
  if (!spare_events_.empty()) {
    e = std::move(spare_events_.back());
    spare_events_.pop_back();
  } else {
    e = Event::create();
  }
  ZERO_CUDA_CHECK(cudaEventRecord(e.get(), streams_.compute));
  retired_.emplace_back(std::move(buf), std::move(e));
}

Work MpiStagedCommunicator::all_reduce_async(void* buf, std::size_t count, DType t, ReduceOp op) {
  const std::size_t bytes = count * dtype_size(t);
  offload::PinnedBuffer h = take(bytes, "all_reduce");
  stage_in(h.data(), buf, bytes);
  Work w = host_.all_reduce_async(h.data(), count, t, op);
  void* result = h.data();
  return Work(std::make_unique<StagedWork>(this, std::move(w), std::move(h), result, buf, bytes));
}

Work MpiStagedCommunicator::reduce_scatter_async(const void* send, void* recv, std::size_t recv_count, DType t,
                                                 ReduceOp op) {
  const std::size_t out_bytes = recv_count * dtype_size(t);
  const std::size_t in_bytes = out_bytes * static_cast<std::size_t>(size());
  offload::PinnedBuffer h = take(in_bytes + out_bytes, "reduce_scatter");
  char* in = h.as<char>();
  char* out = in + in_bytes;
  stage_in(in, send, in_bytes);
  Work w = host_.reduce_scatter_async(in, out, recv_count, t, op);
  return Work(std::make_unique<StagedWork>(this, std::move(w), std::move(h), out, recv, out_bytes));
}

Work MpiStagedCommunicator::all_gather_async(const void* send, void* recv, std::size_t send_count, DType t) {
  const std::size_t block = send_count * dtype_size(t);
  const std::size_t total = block * static_cast<std::size_t>(size());
  offload::PinnedBuffer h = take(total, "all_gather");
  char* own = h.as<char>() + static_cast<std::size_t>(rank()) * block;
  stage_in(own, send, block);
  Work w = host_.all_gather_async(own, h.data(), send_count, t);  // in place on the host
  void* result = h.data();
  return Work(std::make_unique<StagedWork>(this, std::move(w), std::move(h), result, recv, total));
}

Work MpiStagedCommunicator::all_to_all_async(const void* send, void* recv, std::size_t count, DType t) {
  const std::size_t total = count * dtype_size(t) * static_cast<std::size_t>(size());
  // One pinned buffer: what goes out in its first half, what comes in in its second.
  offload::PinnedBuffer h = take(2 * total, "all_to_all");
  stage_in(h.data(), send, total);
  Work w = host_.all_to_all_async(h.data(), h.as<char>() + total, count, t);
  void* result = h.as<char>() + total;
  return Work(std::make_unique<StagedWork>(this, std::move(w), std::move(h), result, recv, total));
}

Work MpiStagedCommunicator::broadcast_async(void* buf, std::size_t bytes, int root) {
  ZERO_CHECK(root >= 0 && root < size(), fmt::format("broadcast: root {} is not a rank", root));
  offload::PinnedBuffer h = take(bytes, "broadcast");
  if (rank() == root) stage_in(h.data(), buf, bytes);
  Work w = host_.broadcast_async(h.data(), bytes, root);
  void* result = h.data();
  // The root's device buffer already holds the bytes.
  return Work(std::make_unique<StagedWork>(this, std::move(w), std::move(h), result, buf, rank() == root ? 0 : bytes));
}

Work MpiStagedCommunicator::send_async(const void* buf, std::size_t count, DType t, int peer) {
  const std::size_t bytes = count * dtype_size(t);
  offload::PinnedBuffer h = take(bytes, "send");
  stage_in(h.data(), buf, bytes);
  Work w = host_.send_async(h.data(), count, t, peer);
  void* staged = h.data();
  // Nothing comes back; the Work keeps the staging buffer until the send is done.
  return Work(std::make_unique<StagedWork>(this, std::move(w), std::move(h), staged, nullptr, 0));
}

Work MpiStagedCommunicator::recv_async(void* buf, std::size_t count, DType t, int peer) {
  const std::size_t bytes = count * dtype_size(t);
  offload::PinnedBuffer h = take(bytes, "recv");
  Work w = host_.recv_async(h.data(), count, t, peer);
  void* staged = h.data();
  return Work(std::make_unique<StagedWork>(this, std::move(w), std::move(h), staged, buf, bytes));
}

}  // namespace zero::cuda
