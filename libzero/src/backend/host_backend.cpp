// HostBackend: the engine on host memory and MPI. Optimizer arithmetic is the offload
// engine's fused host Adam (one implementation for plain host training and for offload).
#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "backend/backend.hpp"
#include "backend/host_staging.hpp"
#include "zero/error.hpp"
#include "offload/host_optimizer.hpp"

namespace zero {

Buffer BufferPool::acquire(std::size_t bytes, bool zeroed) {
  Buffer b;
  if (auto it = free_.find(bytes); it != free_.end()) {
    b = std::move(it->second);
    free_.erase(it);
    if (zeroed) backend_->zero(b.get(), bytes);
  } else {
    b = backend_->alloc(bytes);  // alloc zero-fills
    held_ += static_cast<std::int64_t>(bytes);
    if (held_ > held_peak_) held_peak_ = held_;
  }
  in_use_ += static_cast<std::int64_t>(bytes);
  if (in_use_ > peak_) peak_ = in_use_;
  return b;
}

void BufferPool::trim() {
  for (const auto& [bytes, b] : free_) held_ -= static_cast<std::int64_t>(bytes);
  free_.clear();
}

void BufferPool::give_back(Buffer&& b) {
  if (!b) return;
  in_use_ -= static_cast<std::int64_t>(b.bytes());
  std::size_t bytes = b.bytes();
  free_.emplace(bytes, std::move(b));
}

namespace {

class HostBackend final : public Backend {
 public:
  explicit HostBackend(Communicator& c) : comm_(c) {
    // Test hook: stage offloaded steps as a device backend does (backend/host_staging.hpp).
    const char* env = std::getenv("ZERO_HOST_STAGING");
    if (env != nullptr && std::string(env) == "1") staging_ = std::make_unique<HostOffloadStaging>();
  }
  const char* name() const override { return "host"; }

  Buffer alloc(std::size_t bytes) override {
    if (bytes == 0) return Buffer();
    // 128-byte alignment keeps every slice start on a cache line for the vector paths.
    std::size_t rounded = (bytes + 127) / 128 * 128;
    void* p = std::aligned_alloc(128, rounded);
    ZERO_CHECK(p != nullptr,
               fmt::format("host allocation of {} bytes failed; reduce the model, micro-batch or bucket sizes", bytes));
    std::memset(p, 0, rounded);
    note_alloc(bytes);
    return Buffer(this, p, bytes);
  }
  void release(void* p, std::size_t bytes) override {
    std::free(p);
    note_free(bytes);
  }
  // Empty ranges may come with null pointers (an empty pooled buffer), which the C library's
  // memset and memmove must not be given even for zero bytes.
  void zero(void* p, std::size_t bytes) override {
    if (bytes) std::memset(p, 0, bytes);
  }
  void copy(void* dst, const void* src, std::size_t bytes) override {
    if (bytes) std::memmove(dst, src, bytes);
  }
  void convert(const void* src, DType st, void* dst, DType dt, std::size_t n) override {
    zero::convert(src, st, dst, dt, n);
  }
  using Backend::accumulate;
  void accumulate(void* dst, DType dt, const void* src, DType st, std::size_t n) override {
    check_accumulate(dt, st);
    if (dt == DType::f32 && st == DType::f32) {
      float* d = static_cast<float*>(dst);
      const float* s = static_cast<const float*>(src);
      for (std::size_t i = 0; i < n; ++i) d[i] += s[i];
      return;
    }
    for (std::size_t i = 0; i < n; ++i) store_from_f32(dst, i, dt, load_as_f32(dst, i, dt) + load_as_f32(src, i, st));
  }

  void stats_begin() override { sumsq_ = 0.0; }
  void stats_add(const void* g, DType t, std::size_t n) override {
    double s = 0.0;
    for (std::size_t i = 0; i < n; ++i) {
      double v = load_as_f32(g, i, t);
      s += v * v;
    }
    sumsq_ += s;
  }
  double stats_finish() override { return sumsq_; }

  void adam(float* master, float* m, float* v, const void* grad, DType gt, void* param_out, DType pt, std::size_t n,
            const AdamHyper& h) override {
    offload::adam_step(master, m, v, grad, gt, param_out, pt, n, h);
  }
  void sgd(float* master, float* mom, const void* grad, DType gt, void* param_out, DType pt, std::size_t n,
           const SgdHyper& h) override {
    offload::sgd_step(master, mom, grad, gt, param_out, pt, n, h);
  }
  void quantize_int8(const void* src, DType t, std::size_t n, std::size_t block, void* out) override {
    quant::quantize_int8(src, t, n, block, out);
  }
  // The batched forms, message by message: the device's single launches must equal these.
  using Backend::dequantize_add;
  using Backend::dequantize_int8;
  using Backend::quantize_keep_error;
  void dequantize_int8(const void* in, std::size_t count, std::size_t n, std::size_t block, void* dst,
                       DType t) override {
    const std::size_t packed = quant::packed_bytes(n, block, quant::Bits::int8);
    for (std::size_t k = 0; k < count; ++k)
      quant::dequantize_int8(static_cast<const char*>(in) + k * packed, n, block,
                             static_cast<char*>(dst) + k * n * dtype_size(t), t);
  }
  void quantize_keep_error(float* v, std::size_t count, std::size_t n, std::size_t block, quant::Bits bits, void* out,
                           std::size_t skip) override {
    const std::size_t packed = quant::packed_bytes(n, block, bits);
    auto* o = static_cast<char*>(out);
    if (skip <= count) std::memset(o + skip * packed, 0, packed);
    for (std::size_t k = 0; k < count; ++k)
      quant::quantize_keep_error(v + k * n, n, block, bits, o + (k < skip ? k : k + 1) * packed);
  }
  void dequantize_add(const void* in, std::size_t first, std::size_t last, std::size_t n, std::size_t block,
                      quant::Bits bits, float* acc) override {
    const std::size_t packed = quant::packed_bytes(n, block, bits);
    for (std::size_t s = first; s < last; ++s)
      quant::dequantize_add(static_cast<const char*>(in) + s * packed, n, block, bits, acc);
  }
  void gather_rows(float* dst, const void* src, DType t, std::size_t row, const std::int32_t* rows, std::size_t count,
                   bool add) override {
    for (std::size_t r = 0; r < count; ++r) {
      const void* from = static_cast<const char*>(src) + static_cast<std::size_t>(rows[r]) * row * dtype_size(t);
      if (add)
        accumulate(dst + r * row, DType::f32, from, t, row);
      else
        convert(from, t, dst + r * row, DType::f32, row);
    }
  }

  bool host_accessible() const override { return true; }
  void to_host(void* dst, const void* src, std::size_t bytes) override { copy(dst, src, bytes); }
  void from_host(void* dst, const void* src, std::size_t bytes) override { copy(dst, src, bytes); }
  Communicator& comm() override { return comm_; }
  OffloadStaging* offload_staging() override { return staging_.get(); }

 private:
  Communicator& comm_;
  std::unique_ptr<HostOffloadStaging> staging_;
  double sumsq_ = 0.0;
};

}  // namespace

std::unique_ptr<Backend> make_host_backend(Communicator& comm) { return std::make_unique<HostBackend>(comm); }

}  // namespace zero
