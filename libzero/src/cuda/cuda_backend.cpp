#include "cuda/cuda_backend.hpp"

#include <cuda_runtime_api.h>

#include <fmt/format.h>

#include <exception>
#include <string>

#include "runtime/log.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/device_allocator.hpp"
#include "cuda/kernels.hpp"
#include "cuda/mpi_staged_comm.hpp"
#include "cuda/nccl_comm.hpp"
#include "cuda/newton_schulz.hpp"
#include "cuda/offload_staging.hpp"
#include "cuda/streams.hpp"
#include "cuda/watchdog.hpp"
#include "zero/config.hpp"
#include "zero/context.hpp"
#include "zero/error.hpp"
#include "offload/pinned_pool.hpp"

namespace zero {

namespace cuda {

namespace {

bool valid(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }

// Host memory pinned by the driver, for offload::PinnedPool (which calls no CUDA itself).
void* pin_host(std::size_t bytes, std::string* why) {
  void* p = nullptr;
  const cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
  if (e == cudaSuccess) return p;
  cudaGetLastError();  // reset the error state so the next CUDA call does not report this one
  *why = std::string("cudaHostAlloc failed: ") + cudaGetErrorString(e);
  return nullptr;
}
void unpin_host(void* p) { cudaFreeHost(p); }

class CudaBackend final : public Backend {
 public:
  CudaBackend(Context& ctx, const Config& cfg, Communicator& ranks)
      : device_(ctx.device()), comm_kind_(cfg.comm), alloc_(ctx.device()) {
    ZERO_CUDA_CHECK(cudaSetDevice(device_));
    offload::enable_cuda_pinning({pin_host, unpin_host});  // the context exists now; pinned memory may use it
    timeout_s_ = Watchdog::timeout_from_env();
    comm_stream_ = Stream::create(true);
    copy_stream_ = Stream::create(false);
    upload_stream_ = Stream::create(false);
    streams_.comm = comm_stream_.get();
    streams_.copy = copy_stream_.get();
    streams_.upload = upload_stream_.get();
    alloc_.set_drain([this] {
      bool idle = true;
      for (cudaStream_t s : streams_.all()) idle = stream_drain(s, timeout_s_) && idle;
      return idle;
    });
    switch_ = Event::create();
    stats_done_ = Event::create();
    sumsq_blocks_ = sumsq_blocks();
    stats_ = static_cast<double*>(alloc_.allocate(stats_bytes()));
    stats_host_ = pinned_.acquire(sizeof(double));
    comm_ = group_comm(ranks);
    staging_ = std::make_unique<CudaOffloadStaging>(streams_, pinned_);
  }

  // A destructor must not throw (std::terminate would end the process without the error that
  // led here). After a sticky CUDA error (an illegal address, a launch failure) every CUDA call
  // fails, this one's included: what goes wrong here is logged, and the device memory is left to
  // the process exit.
  ~CudaBackend() override {
    try {
      shutdown();
    } catch (const std::exception& e) {
      log_error(
          "device {}: the CUDA backend did not shut down cleanly ({}); its device memory is left to the "
          "process exit",
          device_, e.what());
      alloc_.abandon();
    } catch (...) {
      alloc_.abandon();
    }
  }

  // The first error a stream of the backend reports (a failed kernel's sticky error), or success.
  cudaError_t stream_error() const {
    for (cudaStream_t s : streams_.all()) {
      const cudaError_t q = cudaStreamQuery(s);
      if (q != cudaSuccess && q != cudaErrorNotReady) return q;
    }
    return cudaSuccess;
  }

  void shutdown() {
    const cudaError_t set = cudaSetDevice(device_);
    const cudaError_t failed = set != cudaSuccess ? set : stream_error();
    if (failed != cudaSuccess) {
      // Nothing queued can complete, and freeing would only report the error again.
      log_error("device {}: {}; the backend's device memory is left to the process exit", device_,
                cuda_error_text("the CUDA backend's streams at shutdown", failed));
      comm_.reset();  // communicators and staging release their host resources; their CUDA calls fail quietly
      staging_.reset();
      alloc_.abandon();
      return;
    }
    // Unwinding from an error: collectives this rank enqueued may never be matched by the other
    // ranks, and the streams would wait on them forever. The communicator goes first (NCCL
    // aborts when destroyed during unwinding), so the waits below can end.
    const bool unwinding = std::uncaught_exceptions() > 0;
    if (unwinding) comm_.reset();
    // Kernels and copies may still use our memory; wait for them before anything is freed, but
    // no longer than the collective timeout. Past it the device memory is abandoned (freeing it
    // would synchronize the device and hang the same way); the process is ending with an error.
    const double limit = timeout_s_;
    bool idle = true;
    for (cudaStream_t s : streams_.all()) idle = stream_drain(s, limit) && idle;
    if (!idle) {
      log_warning(
          "device {}: work on the backend's streams did not finish within {:g} s (ZERO_NCCL_TIMEOUT_S) at "
          "shutdown; its device memory is left to the process exit",
          device_, limit);
      alloc_.abandon();
    }
    staging_.reset();
    comm_.reset();
    if (idle) alloc_.release(stats_, stats_bytes());
    if (idle && sum_scratch_ != nullptr) alloc_.release(sum_scratch_, sum_scratch_bytes());
    if (idle && newton_schulz_) newton_schulz_->release();
  }

  const char* name() const override { return "cuda"; }

  Buffer alloc(std::size_t bytes) override {
    use_device(device_);
    if (bytes == 0) return Buffer();
    void* p = alloc_.allocate(bytes);
    ZERO_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, streams_.compute));
    note_alloc(bytes);
    return Buffer(this, p, bytes);
  }
  void release(void* p, std::size_t bytes) override {
    alloc_.release(p, bytes);
    note_free(bytes);
  }
  void zero(void* p, std::size_t bytes) override {
    use_device(device_);
    if (bytes) ZERO_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, streams_.compute));
  }
  void copy(void* dst, const void* src, std::size_t bytes) override {
    use_device(device_);
    if (bytes && dst != src)
      ZERO_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, streams_.compute));
  }
  void convert(const void* src, DType st, void* dst, DType dt, std::size_t n) override {
    use_device(device_);
    launch_convert(src, st, dst, dt, n, streams_.compute);
  }
  using Backend::accumulate;
  void accumulate(void* dst, DType dt, const void* src, DType st, std::size_t n) override {
    check_accumulate(dt, st);
    use_device(device_);
    launch_accumulate(dst, dt, src, st, n, streams_.compute);
  }

  void stats_begin() override {
    use_device(device_);
    ZERO_CUDA_CHECK(
        cudaMemsetAsync(stats_, 0, static_cast<std::size_t>(sumsq_blocks_) * sizeof(double), streams_.compute));
  }
  void stats_add(const void* g, DType t, std::size_t n) override {
    use_device(device_);
    launch_sumsq_add(g, t, n, stats_, sumsq_blocks_, streams_.compute);
  }
  double stats_finish() override {
    use_device(device_);
    // The step's one host wait: the norm decides clipping and overflow skipping on the host.
    launch_sumsq_finish(stats_, sumsq_blocks_, stats_ + sumsq_blocks_, streams_.compute);
    ZERO_CUDA_CHECK(cudaMemcpyAsync(stats_host_.data(), stats_ + sumsq_blocks_, sizeof(double), cudaMemcpyDeviceToHost,
                                    streams_.compute));
    ZERO_CUDA_CHECK(cudaEventRecord(stats_done_.get(), streams_.compute));
    ZERO_CUDA_CHECK(cudaEventSynchronize(stats_done_.get()));
    return *stats_host_.as<double>();
  }

  void adam(float* master, float* m, float* v, const void* grad, DType gt, void* param_out, DType pt, std::size_t n,
            const AdamHyper& h) override {
    if (n == 0) return;
    use_device(device_);
    check(master, grad, gt, param_out, pt, "adam");
    ZERO_CHECK(m && v, "cuda adam: the moment buffers m and v must not be null");
    ZERO_CHECK(h.step >= 1, fmt::format("cuda adam: step is 1-based (got {})", h.step));
    ZERO_CHECK(h.beta1 >= 0.0f && h.beta1 < 1.0f && h.beta2 >= 0.0f && h.beta2 < 1.0f,
               "cuda adam: betas must lie in [0, 1); check optimizer.params.betas");
    launch_adam(master, m, v, grad, gt, param_out, pt, n, adam_constants(h), streams_.compute);
  }
  void sgd(float* master, float* mom, const void* grad, DType gt, void* param_out, DType pt, std::size_t n,
           const SgdHyper& h) override {
    if (n == 0) return;
    use_device(device_);
    check(master, grad, gt, param_out, pt, "sgd");
    ZERO_CHECK(h.momentum == 0.0f || mom, "cuda sgd: momentum needs a momentum buffer");
    launch_sgd(master, mom, grad, gt, param_out, pt, n, h, streams_.compute);
  }
  void lion(float* master, float* m, const void* grad, DType gt, void* param_out, DType pt, std::size_t n,
            const offload::LionConstants& c) override {
    if (n == 0) return;
    use_device(device_);
    check(master, grad, gt, param_out, pt, "lion");
    ZERO_CHECK(m != nullptr, "cuda lion: the momentum buffer must not be null");
    launch_lion(master, m, grad, gt, param_out, pt, n, c, streams_.compute);
  }
  void lamb_moments(const float* master, float* m, float* v, const void* grad, DType gt, std::size_t n,
                    const offload::LambConstants& c, double* sums) override {
    if (n == 0) return;
    use_device(device_);
    check(master, grad, gt, nullptr, DType::f32, "lamb_moments");
    ZERO_CHECK(m && v && sums, "cuda lamb_moments: the moments and the sums must not be null");
    launch_lamb_moments(master, m, v, grad, gt, n, c, sums, sum_scratch(), streams_.compute);
  }
  void lamb_apply(float* master, const float* m, const float* v, void* param_out, DType pt, std::size_t n,
                  const offload::LambConstants& c, float step) override {
    if (n == 0) return;
    use_device(device_);
    ZERO_CHECK(master && m && v, "cuda lamb_apply: null state");
    ZERO_CHECK(!param_out || valid(pt), "cuda lamb_apply: parameters are fp32, bf16 or fp16");
    launch_lamb_apply(master, m, v, param_out, pt, n, c, step, streams_.compute);
  }
  void adafactor_vector(const float* master, float* v, const void* grad, DType gt, std::size_t n,
                        const offload::AdafactorConstants& c, double* sums) override {
    if (n == 0) return;
    use_device(device_);
    check(master, grad, gt, nullptr, DType::f32, "adafactor_vector");
    ZERO_CHECK(v && sums, "cuda adafactor_vector: V and the sums must not be null");
    launch_adafactor_vector(master, v, grad, gt, n, c, sums, sum_scratch(), streams_.compute);
  }
  void adafactor_matrix_sums(const float* master, const void* grad, DType gt, std::int64_t at, std::size_t n,
                             std::int64_t cols, const offload::AdafactorConstants& c, double* row_sums,
                             double* col_sums, double* p_sum) override {
    if (n == 0) return;
    use_device(device_);
    check(master, grad, gt, nullptr, DType::f32, "adafactor_matrix_sums");
    ZERO_CHECK(row_sums && col_sums && p_sum && cols > 0 && at >= 0,
               "cuda adafactor_matrix_sums: null sums, or a run outside its matrix");
    launch_adafactor_matrix_sums(master, grad, gt, at, n, cols, c, row_sums, col_sums, p_sum, sum_scratch(),
                                 streams_.compute);
  }
  void adafactor_matrix_rms(const void* grad, DType gt, std::int64_t at, std::size_t n, std::int64_t cols,
                            float grad_scale, const float* row_factor, const float* col_factor,
                            double* u_sum) override {
    if (n == 0) return;
    use_device(device_);
    ZERO_CHECK(grad && valid(gt), "cuda adafactor_matrix_rms: a null gradient, or not fp32, bf16 or fp16");
    ZERO_CHECK(row_factor && col_factor && u_sum && cols > 0 && at >= 0,
               "cuda adafactor_matrix_rms: null factors or sum, or a run outside its matrix");
    launch_adafactor_matrix_rms(grad, gt, at, n, cols, grad_scale, row_factor, col_factor, u_sum, sum_scratch(),
                                streams_.compute);
  }
  void adafactor_apply(float* master, const float* v, float* m1, const void* grad, DType gt, void* param_out, DType pt,
                       std::int64_t at, std::size_t n, std::int64_t cols, const float* row_factor,
                       const float* col_factor, const offload::AdafactorApply& a) override {
    if (n == 0) return;
    use_device(device_);
    check(master, grad, gt, param_out, pt, "adafactor_apply");
    ZERO_CHECK((row_factor ? col_factor != nullptr && cols > 0 && at >= 0 : v != nullptr) && (!a.first_moment || m1),
               "cuda adafactor_apply: V (vectors), the factors (matrices) or the first moment is null");
    launch_adafactor_apply(master, v, m1, grad, gt, param_out, pt, at, n, cols, row_factor, col_factor, a,
                           streams_.compute);
  }
  void muon_momentum(float* buf, const void* grad, DType gt, std::size_t n, float grad_scale, float momentum,
                     bool nesterov, float* x_out) override {
    if (n == 0) return;
    use_device(device_);
    check(buf, grad, gt, nullptr, DType::f32, "muon_momentum");
    ZERO_CHECK(x_out != nullptr, "cuda muon_momentum: the output must not be null");
    launch_muon_momentum(buf, grad, gt, n, grad_scale, momentum, nesterov, x_out, streams_.compute);
  }
  void newton_schulz(float* x, std::int64_t rows, std::int64_t cols, int steps) override {
    use_device(device_);
    ZERO_CHECK(x != nullptr, "cuda newton_schulz: null matrix");
    if (!newton_schulz_) newton_schulz_ = std::make_unique<NewtonSchulz>(alloc_);
    newton_schulz_->run(x, rows, cols, steps, sum_scratch(), streams_.compute);
  }
  void newton_schulz_batch(float* const* xs, std::size_t count, std::int64_t rows, std::int64_t cols,
                           int steps) override {
    use_device(device_);
    ZERO_CHECK(xs != nullptr || count == 0, "cuda newton_schulz_batch: null matrix list");
    for (std::size_t i = 0; i < count; ++i) ZERO_CHECK(xs[i] != nullptr, "cuda newton_schulz_batch: null matrix");
    if (!newton_schulz_) newton_schulz_ = std::make_unique<NewtonSchulz>(alloc_);
    newton_schulz_->run_batch(xs, count, rows, cols, steps, sum_scratch(), streams_.compute);
  }
  void muon_apply(float* master, const float* o, void* param_out, DType pt, std::size_t n, float decay,
                  float step) override {
    if (n == 0) return;
    use_device(device_);
    ZERO_CHECK(master && o, "cuda muon_apply: null state");
    ZERO_CHECK(!param_out || valid(pt), "cuda muon_apply: parameters are fp32, bf16 or fp16");
    launch_muon_apply(master, o, param_out, pt, n, decay, step, streams_.compute);
  }
  void onebit_worker(float* x, const float* shared, const void* grad, DType gt, std::size_t n, float b1,
                     float one_minus_b1, float grad_scale, bool add_error) override {
    if (n == 0) return;
    use_device(device_);
    check(x, grad, gt, nullptr, DType::f32, "onebit_worker");
    launch_onebit_worker(x, shared, grad, gt, n, b1, one_minus_b1, grad_scale, add_error, streams_.compute);
  }
  void onebit_compress(float* x, const OneBitChunks& c, std::uint8_t* bits, float* scales) override {
    use_device(device_);
    launch_onebit_compress(x, c.chunk, c.numel, c.count, bits, c.bits_stride, scales, c.scale_stride, streams_.compute);
  }
  void onebit_decode(const std::uint8_t* bits, const float* scales, const OneBitChunks& c, float* out) override {
    use_device(device_);
    launch_onebit_decode(bits, c.bits_stride, scales, c.scale_stride, c.chunk, c.numel, c.count, out, streams_.compute);
  }
  void onebit_server(const std::uint8_t* worker_bits, std::size_t stride, const float* worker_scales,
                     std::size_t scale_stride, int workers, float* error, std::size_t n, std::size_t chunk,
                     std::uint8_t* bits, float* scale) override {
    use_device(device_);
    launch_onebit_server(worker_bits, stride, worker_scales, scale_stride, workers, error, n, chunk, bits, scale,
                         streams_.compute);
  }
  void onebit_scale(float* x, std::size_t n, float c) override {
    use_device(device_);
    launch_onebit_scale(x, n, c, streams_.compute);
  }
  void onebit_adam_apply(float* master, float* m, const float* v, const float* m_new, void* param_out, DType pt,
                         std::size_t n, float decay, float neg_lr, float eps) override {
    if (n == 0) return;
    use_device(device_);
    ZERO_CHECK(!param_out || valid(pt), "cuda onebit_adam_apply: parameters are fp32, bf16 or fp16");
    launch_onebit_adam_apply(master, m, v, m_new, param_out, pt, n, decay, neg_lr, eps, streams_.compute);
  }
  void onebit_lamb_moments(const float* master, float* m, const float* v, float* v_fresh, const float* m_new,
                           std::size_t n, const offload::OneBitLambConstants& c, double* sums) override {
    if (n == 0) return;
    use_device(device_);
    launch_onebit_lamb_moments(master, m, v, v_fresh, m_new, n, c, sums, sum_scratch(), streams_.compute);
  }

  void quantize_int8(const void* src, DType t, std::size_t n, std::size_t block, void* out) override {
    use_device(device_);
    launch_quantize_int8(src, t, n, block, out, streams_.compute);
  }
  using Backend::dequantize_add;
  using Backend::dequantize_int8;
  using Backend::quantize_keep_error;
  void dequantize_int8(const void* in, std::size_t count, std::size_t n, std::size_t block, void* dst,
                       DType t) override {
    use_device(device_);
    launch_dequantize_int8(in, count, n, block, dst, t, streams_.compute);
  }
  void quantize_keep_error(float* v, std::size_t count, std::size_t n, std::size_t block, quant::Bits bits, void* out,
                           std::size_t skip) override {
    use_device(device_);
    launch_quantize_keep_error(v, count, n, block, bits == quant::Bits::int8, out, skip, streams_.compute);
  }
  void dequantize_add(const void* in, std::size_t first, std::size_t last, std::size_t n, std::size_t block,
                      quant::Bits bits, float* acc) override {
    use_device(device_);
    launch_dequantize_add(in, first, last, n, block, bits == quant::Bits::int8, acc, streams_.compute);
  }
  void gather_rows(float* dst, const void* src, DType t, std::size_t row, const std::int32_t* rows, std::size_t count,
                   bool add) override {
    use_device(device_);
    launch_gather_rows(dst, src, t, row, rows, count, add, streams_.compute);
  }

  bool host_accessible() const override { return false; }

  // Outside the training loop only: these wait for the compute stream, so the host buffer is
  // complete (to_host) or free to reuse (from_host) when they return.
  void to_host(void* dst, const void* src, std::size_t bytes) override {
    use_device(device_);
    if (bytes == 0) return;
    ZERO_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, streams_.compute));
    ZERO_CUDA_CHECK(cudaStreamSynchronize(streams_.compute));
  }
  void from_host(void* dst, const void* src, std::size_t bytes) override {
    use_device(device_);
    if (bytes == 0) return;
    ZERO_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, streams_.compute));
    ZERO_CUDA_CHECK(cudaStreamSynchronize(streams_.compute));
  }

  // Batched round trips (PowerSGD's host compression): pinned memory from the backend's pool,
  // copies on the compute stream, one stream wait for all of them.
  offload::PinnedBuffer staging_buffer(std::size_t bytes) override { return pinned_.acquire(bytes); }
  void to_host_async(void* dst, const void* src, std::size_t bytes) override {
    use_device(device_);
    if (bytes == 0) return;
    ZERO_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, streams_.compute));
  }
  void from_host_async(void* dst, const void* src, std::size_t bytes) override {
    use_device(device_);
    if (bytes == 0) return;
    ZERO_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, streams_.compute));
  }
  void wait_copies() override {
    use_device(device_);
    ZERO_CUDA_CHECK(cudaStreamSynchronize(streams_.compute));
  }

  Communicator& comm() override { return *comm_; }
  // Every rank of `group` calls this at the same point (the NCCL setup is collective over it).
  // The new communicator shares the backend's streams, so its collectives are ordered with the
  // backend's other communicators' on the one comm stream.
  std::unique_ptr<Communicator> group_comm(Communicator& group) override {
    use_device(device_);
    if (comm_kind_ == CommKind::nccl) return std::make_unique<NcclCommunicator>(group, streams_, device_);
    return std::make_unique<MpiStagedCommunicator>(group, streams_, pinned_);
  }

  std::unique_ptr<Communicator> split_comm(Communicator& group) override {
    use_device(device_);
    auto* parent = dynamic_cast<NcclCommunicator*>(comm_.get());
    if (parent != nullptr) return NcclCommunicator::split(*parent, group);
    return group.size() > 1 ? group_comm(group) : nullptr;
  }

  void* compute_stream() const override { return static_cast<void*>(streams_.compute); }
  void set_compute_stream(void* stream) override {
    use_device(device_);
    cudaStream_t next = stream ? static_cast<cudaStream_t>(stream) : cudaStreamLegacy;
    stream_after(next, streams_.compute, switch_.get());
    streams_.compute = next;
  }
  OffloadStaging* offload_staging() override { return staging_.get(); }
  std::int64_t bytes_reserved() const override { return static_cast<std::int64_t>(alloc_.bytes_reserved()); }
  void release_cached() override {
    use_device(device_);
    alloc_.trim();
  }

 private:
  // Scratch of the gradient statistics: per-block partials, then the total.
  std::size_t stats_bytes() const { return (static_cast<std::size_t>(sumsq_blocks_) + 1) * sizeof(double); }
  // Scratch of the fixed-order sums (LAMB's, Adafactor's, the Newton-Schulz norm: the block
  // partials of one run), made at the first use.
  static std::size_t sum_scratch_bytes() { return (2 * kSumBlocks + 1) * sizeof(double); }
  double* sum_scratch() {
    if (sum_scratch_ == nullptr) sum_scratch_ = static_cast<double*>(alloc_.allocate(sum_scratch_bytes()));
    return sum_scratch_;
  }
  static void check(const float* master, const void* grad, DType gt, const void* out, DType pt, const char* who) {
    ZERO_CHECK(master && grad, std::string("cuda ") + who + ": master and grad must not be null");
    ZERO_CHECK(valid(gt) && (!out || valid(pt)),
               std::string("cuda ") + who + ": unsupported dtype; gradients and parameters are fp32, bf16 or fp16");
  }

  // Declaration order is destruction order reversed: streams and events outlive the allocator
  // and the pinned pool, which outlive the communicator and the staging that use them.
  int device_;
  CommKind comm_kind_;        // comm: nccl or mpi, for the backend's communicator and its groups'
  double timeout_s_ = 600.0;  // ZERO_NCCL_TIMEOUT_S bounds the shutdown's waits too
  Stream comm_stream_, copy_stream_, upload_stream_;
  StreamSet streams_;
  Event switch_, stats_done_;
  DeviceAllocator alloc_;
  offload::PinnedPool pinned_{false};
  int sumsq_blocks_ = 1;
  double* stats_ = nullptr;
  double* sum_scratch_ = nullptr;
  std::unique_ptr<NewtonSchulz> newton_schulz_;  // Muon's products, made at the first use
  offload::PinnedBuffer stats_host_;
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<CudaOffloadStaging> staging_;
};

}  // namespace

}  // namespace cuda

std::unique_ptr<Backend> make_cuda_backend(Context& ctx, const Config& cfg, Communicator& ranks) {
  if (ctx.device() < 0) {
    int count = 0;
    const cudaError_t rc = cudaGetDeviceCount(&count);
    cudaGetLastError();
    ZERO_THROW(
        fmt::format("backend: cuda, but rank {} has no CUDA device (cudaGetDeviceCount: {}); run on a GPU node, "
                    "check CUDA_VISIBLE_DEVICES and the driver (nvidia-smi), or set backend: host",
                    ctx.rank(), rc == cudaSuccess ? fmt::format("{} devices", count) : cudaGetErrorName(rc)));
  }
  return std::make_unique<cuda::CudaBackend>(ctx, cfg, ranks);
}

}  // namespace zero
