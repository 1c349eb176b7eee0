// Backend: the memory, arithmetic and communication the engine needs, behind one interface.
//
// The engine's logic (what to gather, when to reduce, how to step) is written once against
// this interface. HostBackend runs it on host memory over MPI, which is how every stage is
// proved in CI; the CUDA backend supplies device memory, streams, kernels and NCCL.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "comm/quantize.hpp"
#include "offload/host_optimizer.hpp"
#include "offload/pinned_pool.hpp"
#include "zero/comm.hpp"
#include "zero/dtype.hpp"
#include "zero/error.hpp"
#include "zero/optim.hpp"

namespace zero {

class Backend;
class Context;
struct Config;

// Where one offloaded optimizer step's time went, sub-group by sub-group (a measurement aid:
// bench/offload_timeline.cpp sets it with OffloadStaging::set_timeline). Each group is one
// host_grads(range, begin, n) call, the engine's sub-group. Times are milliseconds from the
// origin: the moment the gradient copies could start in begin(). Copy times are device events
// measured from an origin event; host times are steady_clock readings from the instant the host
// saw that event complete. The event completed at most origin_uncertainty ms before that instant
// (the time between the host enqueuing it and seeing it complete), so a device time at or before
// a host instant reads at most origin_uncertainty later than it, and a device time after a host
// instant always reads after it.
struct OffloadTimeline {
  struct Group {
    std::size_t range = 0, begin = 0, n = 0;
    double d2h_start = -1, d2h_end = -1;  // its gradient chunks' copies out (device); -1: none
    double wait_start = 0;                // host_grads called: the host waits for those copies
    double host_start = 0;                // host_grads returned: the host optimizer starts
    double host_end = 0;                  // params_ready called: the host optimizer is done
    double h2d_start = -1, h2d_end = -1;  // its parameters' copy back (device); -1: none
  };
  double origin_s = 0;            // the origin on steady_clock, in seconds since that clock's epoch
  double origin_uncertainty = 0;  // ms: the origin event's record-to-seen interval
  double finish = 0;              // finish() called (host)
  std::vector<Group> groups;
};

// Offloaded optimizer steps on a backend whose memory the host cannot address (CUDA): the
// gradients of the owned ranges travel to pinned host memory and the updated parameters travel
// back, asynchronously on a copy stream, so the host AdamW steps one sub-group while the next
// one's gradients are still arriving and the next forward waits only on an event.
// One step: begin(), add() once per range (range r = the r-th add), then any number of
// host_grads / host_params / params_ready over sub-ranges, then finish(). The host copies of the
// gradients stay valid until finish(): an optimizer with several passes asks for each sub-range
// once per pass. Each parameter element is handed back by params_ready at most once a step.
class OffloadStaging {
 public:
  virtual ~OffloadStaging() = default;
  // A new step over gradients of `grad_esize` bytes an element (the accumulation dtype) and
  // parameters of `param_esize` (the compute dtype); gradient copies are issued in chunks of
  // `chunk` elements (the optimizer's sub_group_size), so a sub-group waits for its own chunk.
  virtual void begin(std::size_t grad_esize, std::size_t param_esize, std::size_t chunk) = 0;
  // Declares range r: n gradient elements to step and where its updated parameters go. Starts
  // the gradient copies after the work already enqueued on the compute stream.
  virtual void add(const void* grads, void* params, std::size_t n) = 0;
  // Host copy of range r's gradients [begin, begin + n), waiting for the chunks holding them.
  virtual const void* host_grads(std::size_t r, std::size_t begin, std::size_t n) = 0;
  // Host buffer for range r's updated parameters, element `begin` on.
  virtual void* host_params(std::size_t r, std::size_t begin) = 0;
  // The host wrote host_params(r, begin)[0, n): copy them back (asynchronously).
  virtual void params_ready(std::size_t r, std::size_t begin, std::size_t n) = 0;
  // Work enqueued on the compute stream from now on sees every parameter copied back.
  virtual void finish() = 0;
  // Records each step from the next begin() on into `sink` (null: stop), overwriting the
  // previous step's record; call it between steps. While a sink is set, begin() waits for the
  // origin event and finish() for both copy streams, so that every time can be read when
  // finish() returns; the step then loses its overlap with the next forward, which a benchmark
  // times separately. Without a sink nothing is recorded and nothing waits.
  virtual void set_timeline(OffloadTimeline* sink) { (void)sink; }
  // Host bytes its gradient and parameter buffers hold (pinned on a device; the bytes asked for,
  // before the pool's size classes): MemoryReport::offload_staging.
  virtual std::int64_t host_bytes() const { return 0; }
};

// Move-only storage owned by a backend (device memory for CUDA, host memory for the host).
class Buffer {
 public:
  Buffer() = default;
  Buffer(Backend* owner, void* ptr, std::size_t bytes) : owner_(owner), ptr_(ptr), bytes_(bytes) {}
  Buffer(Buffer&& o) noexcept { swap(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    Buffer tmp(std::move(o));
    swap(tmp);
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();

  void* get() const { return ptr_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  std::size_t bytes() const { return bytes_; }
  explicit operator bool() const { return ptr_ != nullptr; }

 private:
  void swap(Buffer& o) noexcept {
    std::swap(owner_, o.owner_);
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
  }
  Backend* owner_ = nullptr;
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

// Chunks of a 1-bit compression (Backend::onebit_compress, onebit_decode): `count` chunks of
// `chunk` values back to back, of which the first `numel` in all are real (the rest padding);
// chunk c's bits ((chunk + 7) / 8 bytes, bit i of byte i / 8) at bits + c bits_stride, its scale
// at scales[c scale_stride].
struct OneBitChunks {
  std::size_t chunk = 0, numel = 0, count = 0, bits_stride = 0, scale_stride = 1;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;

  // Zero-filled storage. Freed through Buffer's destructor.
  virtual Buffer alloc(std::size_t bytes) = 0;
  virtual void release(void* ptr, std::size_t bytes) = 0;

  virtual void zero(void* p, std::size_t bytes) = 0;
  virtual void copy(void* dst, const void* src, std::size_t bytes) = 0;
  virtual void convert(const void* src, DType st, void* dst, DType dt, std::size_t n) = 0;
  // dst[i] += src[i], added in fp32 and rounded once to dst's dtype dt. The dtypes are equal, or
  // dst is fp32 and src 16-bit (gradients accumulated in fp32: data_types.grad_accum_dtype).
  virtual void accumulate(void* dst, DType dt, const void* src, DType st, std::size_t n) = 0;
  void accumulate(void* dst, const void* src, DType t, std::size_t n) { accumulate(dst, t, src, t, n); }

  // Gradient statistics for one step: begin, add every owned range, finish (the one place the
  // host waits for the device per step). Returns the sum of squares (inf/nan on overflow).
  virtual void stats_begin() = 0;
  virtual void stats_add(const void* g, DType t, std::size_t n) = 0;
  virtual double stats_finish() = 0;

  // Optimizer updates over a flat range of backend memory (the host AdamW's semantics and
  // hyper-parameters). param_out (compute dtype) may be null.
  virtual void adam(float* master, float* m, float* v, const void* grad, DType gt, void* param_out, DType pt,
                    std::size_t n, const AdamHyper& h) = 0;
  virtual void sgd(float* master, float* mom, const void* grad, DType gt, void* param_out, DType pt, std::size_t n,
                   const SgdHyper& h) = 0;
  // Lion and LAMB (optim/lion.cpp, optim/lamb.cpp) with the host kernels' arithmetic
  // (offload::lion_step, lamb_moments, lamb_apply). A backend without the kernels refuses (the
  // host backend never gets these calls: its memory is stepped by the host kernels).
  virtual void lion(float* master, float* m, const void* grad, DType gt, void* param_out, DType pt, std::size_t n,
                    const offload::LionConstants& c) {
    (void)master, (void)m, (void)grad, (void)gt, (void)param_out, (void)pt, (void)n, (void)c;
    no_kernel("Lion");
  }
  // LAMB's first pass over a run of one tensor: m and v, and the run's sums of p^2 and u^2 added
  // to sums[0] and sums[1] (two doubles of backend memory) in a fixed order, so the same run
  // gives the same bits (not the host's eight-lane fold: they differ in rounding only).
  virtual void lamb_moments(const float* master, float* m, float* v, const void* grad, DType gt, std::size_t n,
                            const offload::LambConstants& c, double* sums) {
    (void)master, (void)m, (void)v, (void)grad, (void)gt, (void)n, (void)c, (void)sums;
    no_kernel("Lamb");
  }
  // LAMB's second pass: p -= step * u (step: lr x the tensor's trust ratio).
  virtual void lamb_apply(float* master, const float* m, const float* v, void* param_out, DType pt, std::size_t n,
                          const offload::LambConstants& c, float step) {
    (void)master, (void)m, (void)v, (void)param_out, (void)pt, (void)n, (void)c, (void)step;
    no_kernel("Lamb");
  }
  // Adafactor (optim/adafactor.cpp) with offload::adafactor_*'s arithmetic, element-wise results
  // bit for bit. A run is n elements of a [rows, cols] tensor from flat element `at`; sums are
  // backend doubles. Vectors, pass 1: V, and the run's sums of p^2 and u^2 added to sums[0] and
  // sums[1] in a fixed order (as lamb_moments').
  virtual void adafactor_vector(const float* master, float* v, const void* grad, DType gt, std::size_t n,
                                const offload::AdafactorConstants& c, double* sums) {
    (void)master, (void)v, (void)grad, (void)gt, (void)n, (void)c, (void)sums;
    no_kernel("Adafactor");
  }
  // Matrices, pass 1: row_sums[r] and col_sums[c] (by the tensor's row and column) continue their
  // folds of g^2 + eps1 in element order, the host's folds exactly; the run's sum of p^2 is added
  // to p_sum[0] in a fixed order.
  virtual void adafactor_matrix_sums(const float* master, const void* grad, DType gt, std::int64_t at, std::size_t n,
                                     std::int64_t cols, const offload::AdafactorConstants& c, double* row_sums,
                                     double* col_sums, double* p_sum) {
    (void)master, (void)grad, (void)gt, (void)at, (void)n, (void)cols, (void)c, (void)row_sums, (void)col_sums,
        (void)p_sum;
    no_kernel("Adafactor");
  }
  // Matrices, pass 2: the run's sum of u^2, u = g * row_factor[r] * col_factor[c] (backend
  // floats), added to u_sum[0] in a fixed order.
  virtual void adafactor_matrix_rms(const void* grad, DType gt, std::int64_t at, std::size_t n, std::int64_t cols,
                                    float grad_scale, const float* row_factor, const float* col_factor, double* u_sum) {
    (void)grad, (void)gt, (void)at, (void)n, (void)cols, (void)grad_scale, (void)row_factor, (void)col_factor,
        (void)u_sum;
    no_kernel("Adafactor");
  }
  // The update (offload::adafactor_apply): from V (row_factor null) or the factors.
  virtual void adafactor_apply(float* master, const float* v, float* m1, const void* grad, DType gt, void* param_out,
                               DType pt, std::int64_t at, std::size_t n, std::int64_t cols, const float* row_factor,
                               const float* col_factor, const offload::AdafactorApply& a) {
    (void)master, (void)v, (void)m1, (void)grad, (void)gt, (void)param_out, (void)pt, (void)at, (void)n, (void)cols,
        (void)row_factor, (void)col_factor, (void)a;
    no_kernel("Adafactor");
  }
  // Muon (optim/muon.cpp): offload::muon_momentum and muon_apply's arithmetic bit for bit, and
  // offload::newton_schulz's iteration (coefficients, normalisation, orientation) in place on a
  // [rows, cols] row-major matrix, its products in bf16 with fp32 accumulation: close to the
  // host's fp32 result, not equal to it.
  virtual void muon_momentum(float* buf, const void* grad, DType gt, std::size_t n, float grad_scale, float momentum,
                             bool nesterov, float* x_out) {
    (void)buf, (void)grad, (void)gt, (void)n, (void)grad_scale, (void)momentum, (void)nesterov, (void)x_out;
    no_kernel("Muon");
  }
  virtual void newton_schulz(float* x, std::int64_t rows, std::int64_t cols, int steps) {
    (void)x, (void)rows, (void)cols, (void)steps;
    no_kernel("Muon");
  }
  // newton_schulz on `count` matrices of one shape (xs: a host array of device pointers), each
  // with the result newton_schulz gives it; a backend may run their products together.
  virtual void newton_schulz_batch(float* const* xs, std::size_t count, std::int64_t rows, std::int64_t cols,
                                   int steps) {
    for (std::size_t i = 0; i < count; ++i) newton_schulz(xs[i], rows, cols, steps);
  }
  virtual void muon_apply(float* master, const float* o, void* param_out, DType pt, std::size_t n, float decay,
                          float step) {
    (void)master, (void)o, (void)param_out, (void)pt, (void)n, (void)decay, (void)step;
    no_kernel("Muon");
  }

  // 1-bit Adam and 1-bit LAMB (optim/onebit_exchange.cpp, onebit_adam.cpp, onebit_lamb.cpp)
  // with offload::onebit_*'s arithmetic, element-wise results bit for bit; a compression's scale
  // is the host's RMS with its sum of squares in a fixed order (a rounding of that sum apart), and
  // the bits and errors follow from it as the host's. Chunked forms: OneBitChunks.
  virtual void onebit_worker(float* x, const float* shared, const void* grad, DType gt, std::size_t n, float b1,
                             float one_minus_b1, float grad_scale, bool add_error) {
    (void)x, (void)shared, (void)grad, (void)gt, (void)n, (void)b1, (void)one_minus_b1, (void)grad_scale,
        (void)add_error;
    no_kernel("OneBitAdam / OneBitLamb");
  }
  virtual void onebit_compress(float* x, const OneBitChunks& c, std::uint8_t* bits, float* scales) {
    (void)x, (void)c, (void)bits, (void)scales;
    no_kernel("OneBitAdam / OneBitLamb");
  }
  // out's chunk c = its scale x its signs over the real values, 0 over the padding.
  virtual void onebit_decode(const std::uint8_t* bits, const float* scales, const OneBitChunks& c, float* out) {
    (void)bits, (void)scales, (void)c, (void)out;
    no_kernel("OneBitAdam / OneBitLamb");
  }
  // offload::onebit_server for one chunk of `chunk` values, n real: worker w's bits at
  // worker_bits + w stride, its scale at worker_scales[w scale_stride]; the scale into *scale.
  virtual void onebit_server(const std::uint8_t* worker_bits, std::size_t stride, const float* worker_scales,
                             std::size_t scale_stride, int workers, float* error, std::size_t n, std::size_t chunk,
                             std::uint8_t* bits, float* scale) {
    (void)worker_bits, (void)stride, (void)worker_scales, (void)scale_stride, (void)workers, (void)error, (void)n,
        (void)chunk, (void)bits, (void)scale;
    no_kernel("OneBitAdam / OneBitLamb");
  }
  // x[i] *= c, one fp32 product each.
  virtual void onebit_scale(float* x, std::size_t n, float c) {
    (void)x, (void)n, (void)c;
    no_kernel("OneBitLamb");
  }
  virtual void onebit_adam_apply(float* master, float* m, const float* v, const float* m_new, void* param_out, DType pt,
                                 std::size_t n, float decay, float neg_lr, float eps) {
    (void)master, (void)m, (void)v, (void)m_new, (void)param_out, (void)pt, (void)n, (void)decay, (void)neg_lr,
        (void)eps;
    no_kernel("OneBitAdam");
  }
  // sums (three backend doubles): [0] += the run's sum of u^2, [1] += of prelim^2 (fixed-order
  // sums, as lamb_moments'), [2] = the largest of itself and the run's ratios.
  virtual void onebit_lamb_moments(const float* master, float* m, const float* v, float* v_fresh, const float* m_new,
                                   std::size_t n, const offload::OneBitLambConstants& c, double* sums) {
    (void)master, (void)m, (void)v, (void)v_fresh, (void)m_new, (void)n, (void)c, (void)sums;
    no_kernel("OneBitLamb");
  }

  // Block quantization of backend memory for the quantized collectives (qwZ, qgZ), with
  // comm/quantize.hpp's packed layout, rounding and error bounds: the host quantizer on the host
  // backend, kernels with the same per-element arithmetic (comm/quantize_math.hpp) on the
  // device, so both give the same bytes. A packed message of n values takes
  // quant::packed_bytes(n, block, bits); the forms that take several (one launch for all of them
  // on a device) keep them back to back in numbered slots, that many bytes apart.
  virtual void quantize_int8(const void* src, DType t, std::size_t n, std::size_t block, void* out) = 0;
  // The `count` messages of `in` (slots 0..count-1) into dst's elements [k n, (k + 1) n).
  virtual void dequantize_int8(const void* in, std::size_t count, std::size_t n, std::size_t block, void* dst,
                               DType t) = 0;
  // The `count` fp32 vectors of v (n values each, back to back) quantized into out: vector k into
  // slot k before `skip` and slot k + 1 from it on, slot `skip` zero-filled (skip > count: none).
  // v keeps what the receivers will not get back (error feedback).
  virtual void quantize_keep_error(float* v, std::size_t count, std::size_t n, std::size_t block, quant::Bits bits,
                                   void* out, std::size_t skip) = 0;
  // acc[i] += the dequantized value i of each message in slots [first, last) of `in`, slot by
  // slot in order (the fp32 sums of one dequantize-add per message).
  virtual void dequantize_add(const void* in, std::size_t first, std::size_t last, std::size_t n, std::size_t block,
                              quant::Bits bits, float* acc) = 0;
  // One message each.
  void dequantize_int8(const void* in, std::size_t n, std::size_t block, void* dst, DType t) {
    dequantize_int8(in, 1, n, block, dst, t);
  }
  void quantize_keep_error(float* v, std::size_t n, std::size_t block, quant::Bits bits, void* out) {
    quantize_keep_error(v, 1, n, block, bits, out, ~std::size_t{0});
  }
  void dequantize_add(const void* in, std::size_t n, std::size_t block, quant::Bits bits, float* acc) {
    dequantize_add(in, 0, 1, n, block, bits, acc);
  }
  // Rows of `row` elements: dst's row r (fp32) = src's row rows[r] (dtype t, widened), or += it
  // (add; as accumulate() adds), for r < count. `rows` is backend memory (a small index table
  // made once): one launch gathers slices from wherever they lie.
  virtual void gather_rows(float* dst, const void* src, DType t, std::size_t row, const std::int32_t* rows,
                           std::size_t count, bool add) = 0;

  // True when backend memory is ordinary host memory (the host backend): the host optimizer
  // can then read gradients and write parameters in place, without staging copies.
  virtual bool host_accessible() const = 0;

  // Copies between backend memory and host memory (identity copies on the host backend).
  virtual void to_host(void* host_dst, const void* src, std::size_t bytes) = 0;
  virtual void from_host(void* dst, const void* host_src, std::size_t bytes) = 0;
  // Batched copies for a host round trip of many buffers: host memory from staging_buffer()
  // (page-locked on a device backend, so the copies need no bounce buffer), copies enqueued in
  // order without waiting, and wait_copies() once for all of them. After from_host_async the
  // caller may leave the copies in flight: later backend work is ordered after them, but the host
  // buffer must not be written until the next wait_copies(). The host backend copies at once.
  virtual offload::PinnedBuffer staging_buffer(std::size_t bytes);
  virtual void to_host_async(void* host_dst, const void* src, std::size_t bytes) { to_host(host_dst, src, bytes); }
  virtual void from_host_async(void* dst, const void* host_src, std::size_t bytes) { from_host(dst, host_src, bytes); }
  virtual void wait_copies() {}

  virtual Communicator& comm() = 0;
  // A communicator for this backend's memory over the ranks of `group`: a host (MPI)
  // communicator over some of the job's ranks (MiCS's groups, made by
  // MpiCommunicator::split, or a pipeline group, Engine::device_comm), each with a backend of
  // this kind; `group` must outlive the result and keeps counting its traffic and
  // checking its collectives. Device backends build one of their own kind over those ranks (NCCL
  // bootstrapped over `group`, or MPI-staged); null on the host backend, whose memory `group`
  // reaches as it is.
  virtual std::unique_ptr<Communicator> group_comm(Communicator& group) {
    (void)group;
    return nullptr;
  }
  // The same for a group of one partition of this backend's ranks, called by every rank of the
  // backend at the same point with its own group (hpZ's groups, qgZ's node and cross-node
  // groups): where the backend's communicator can be split (NCCL), the new one is split from it
  // and shares its resources. Null for a group of one rank (nothing to exchange) and on the host
  // backend.
  virtual std::unique_ptr<Communicator> split_comm(Communicator& group) { return group_comm(group); }

  // Device backends: the stream the backend's own work and the user's kernels are ordered on
  // (a cudaStream_t; the legacy default stream unless set). Setting it orders the new stream
  // after everything already enqueued on the old one. Host backend: null, and setting is an error.
  virtual void* compute_stream() const { return nullptr; }
  virtual void set_compute_stream(void* stream);
  // Staging for offloaded optimizer steps; null where host_accessible() (nothing to stage),
  // except the host backend's imitation of a device's, a test hook (backend/host_staging.hpp).
  virtual OffloadStaging* offload_staging() { return nullptr; }

  // Bytes requested and not yet released, and the peak of that.
  std::int64_t bytes_allocated() const { return allocated_; }
  std::int64_t max_bytes_allocated() const { return max_allocated_; }
  // Bytes held from the system (a caching allocator keeps freed blocks for reuse).
  virtual std::int64_t bytes_reserved() const { return allocated_; }
  // Returns cached, unused blocks to the system.
  virtual void release_cached() {}

 protected:
  // accumulate()'s dtype rule, the same on every backend.
  static void check_accumulate(DType dt, DType st) {
    ZERO_CHECK(dt == st || dt == DType::f32,
               "Backend::accumulate: a 16-bit accumulator adds its own dtype only; accumulate in fp32 instead");
  }
  void note_alloc(std::size_t b) {
    allocated_ += static_cast<std::int64_t>(b);
    if (allocated_ > max_allocated_) max_allocated_ = allocated_;
  }
  void note_free(std::size_t b) { allocated_ -= static_cast<std::int64_t>(b); }
  // The refusal of an optimizer kernel this backend does not have.
  [[noreturn]] void no_kernel(const char* optimizer) const {
    ZERO_THROW(std::string("the ") + name() + " backend has no " + optimizer +
               " kernels: its state is stepped on the host (offload_optimizer, or backend: host)");
  }

 private:
  std::int64_t allocated_ = 0, max_allocated_ = 0;
};

inline Buffer::~Buffer() {
  if (owner_ && ptr_) owner_->release(ptr_, bytes_);
}

// Reuses buffers of equal size (units of a transformer share sizes), and reports the peak.
class BufferPool {
 public:
  explicit BufferPool(Backend& b) : backend_(&b) {}
  // Zero-filled when zeroed is true.
  Buffer acquire(std::size_t bytes, bool zeroed);
  void give_back(Buffer&& b);
  std::int64_t in_use() const { return in_use_; }
  std::int64_t peak() const { return peak_; }  // the most bytes handed out at once
  // The most bytes the pool has held: those handed out plus the freed ones kept for reuse (a
  // freed buffer serves only a request of its own size). What it takes from the backend.
  std::int64_t held_peak() const { return held_peak_; }
  void trim();

 private:
  Backend* backend_;
  std::multimap<std::size_t, Buffer> free_;
  std::int64_t in_use_ = 0, peak_ = 0, held_ = 0, held_peak_ = 0;
};

std::unique_ptr<Backend> make_host_backend(Communicator& comm);

// The backend the config names (Config::backend): host, or cuda (with the communicator of
// Config::comm), over every rank of the job. backend cuda in a build without CUDA, or on a rank
// without a device, throws a zero::Error saying what to change. Defined in backend/factory.cpp.
std::unique_ptr<Backend> make_backend(Context& ctx, const Config& cfg);
// The same over the ranks of `ranks`, a host (MPI) communicator (the data-parallel group of a
// tensor x pipeline grid, a MiCS shard group), which must outlive the backend: the CUDA backend
// bootstraps its device communicator over it.
std::unique_ptr<Backend> make_backend(Context& ctx, const Config& cfg, Communicator& ranks);

}  // namespace zero
