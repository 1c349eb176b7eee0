// CudaOps: the Ops interface over the launchers of gpt_kernels.hpp and the cuBLASLt products
// of matmul.hpp.
//
// The class is glue: it casts the model's untyped Act pointers to bf16 and forwards each call
// with its stream. What it owns besides the Matmul is one scratch buffer for the launchers
// that need one (encoder, LayerNorm, RMSNorm and bias backward, and attention when the model's
// buffer is too small, see attention_scratch_floats). The buffer grows to the largest size asked for
// and is then reused: all calls run in order on the one stream, so no two launchers ever use
// it at once. The model reserves it at its largest shapes when it is built (Ops::reserve), so
// no step allocates or frees it; a call at a larger shape would still grow it.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>

#include "gpt/cuda/cuda_ops.hpp"
#include "gpt/cuda/gpt_kernels.hpp"
#include "gpt/cuda/matmul.hpp"
#include "gpt/cuda/status_check.hpp"
#include "gpt/ops.hpp"
#include "zero/dtype.hpp"
#include "zero/error.hpp"

namespace zero::gpt {
namespace {

using cuda::bf16;

bf16* dev(Act* p) { return reinterpret_cast<bf16*>(p); }
const bf16* dev(const Act* p) { return reinterpret_cast<const bf16*>(p); }

cudaStream_t new_stream() {
  cudaStream_t s = nullptr;
  GPT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}

// cudaMalloc with a message that says how much was asked, how much was free and what to do.
void* device_malloc(std::size_t bytes, const char* what) {
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  const cudaError_t rc = cudaMalloc(&p, bytes);
  if (rc == cudaSuccess) return p;
  cudaGetLastError();  // an allocation failure is not sticky: clear it for the next call
  std::size_t free_bytes = 0, total_bytes = 0;
  const bool have_info = cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess;
  constexpr double kMiB = 1024.0 * 1024.0;
  std::ostringstream s;
  s << "CudaOps: cudaMalloc of " << bytes << " bytes (" << static_cast<double>(bytes) / kMiB << " MiB) for " << what
    << " failed: " << cudaGetErrorName(rc) << " (" << cudaGetErrorString(rc) << ")";
  if (have_info)
    s << "; the device has " << static_cast<double>(free_bytes) / kMiB << " MiB free of "
      << static_cast<double>(total_bytes) / kMiB << " MiB";
  s << ". Lower the micro-batch size or enable activation checkpointing";
  ZERO_THROW(s.str());
}

class CudaOps final : public Ops {
 public:
  // A null stream: the Ops creates its own non-blocking stream and destroys it at the end.
  explicit CudaOps(cudaStream_t stream)
      : owned_stream_{stream ? nullptr : new_stream()}, stream_(stream ? stream : owned_stream_.s), matmul_(stream_) {}
  ~CudaOps() override {
    cudaStreamSynchronize(stream_);
    for (Staging& s : staging_) {
      if (s.host) cudaFreeHost(s.host);
      if (s.done) cudaEventDestroy(s.done);
    }
    if (scratch_) cudaFree(scratch_);
  }
  CudaOps(const CudaOps&) = delete;
  CudaOps& operator=(const CudaOps&) = delete;

  const char* name() const override { return "cuda"; }
  void* stream() const override { return stream_; }
  DType dtype() const override { return DType::bf16; }
  bool host_memory() const override { return false; }

  void* allocate(std::size_t bytes) override { return device_malloc(bytes, "model buffers"); }
  void deallocate(void* p) noexcept override {
    if (p) cudaFree(p);
  }
  // Through a ring of pinned staging buffers: from pageable memory cudaMemcpyAsync first waits
  // for the stream, which would cost a host synchronisation per micro-batch. A slot is reused
  // kStagingSlots uploads later, after the copy that last read it (its event) is done, which
  // in a training loop has long happened.
  void upload(void* dst, const void* host_src, std::size_t bytes) override {
    if (bytes == 0) return;
    Staging& s = staging_[next_slot_];
    next_slot_ = (next_slot_ + 1) % kStagingSlots;
    if (s.done)
      GPT_CUDA_CHECK(cudaEventSynchronize(s.done));
    else
      GPT_CUDA_CHECK(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));
    if (s.bytes < bytes) {
      if (s.host) GPT_CUDA_CHECK(cudaFreeHost(s.host));
      s.host = nullptr;
      s.bytes = 0;
      GPT_CUDA_CHECK(cudaMallocHost(&s.host, bytes));
      s.bytes = bytes;
    }
    std::memcpy(s.host, host_src, bytes);
    GPT_CUDA_CHECK(cudaMemcpyAsync(dst, s.host, bytes, cudaMemcpyHostToDevice, stream_));
    GPT_CUDA_CHECK(cudaEventRecord(s.done, stream_));
  }
  void download(void* host_dst, const void* src, std::size_t bytes) override {
    if (bytes != 0) GPT_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    GPT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void fill_zero(void* p, std::size_t bytes) override {
    if (bytes == 0) return;
    GPT_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream_));
  }
  void synchronize() override { GPT_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

  void encoder_forward(Act* out, const std::int32_t* tokens, const Act* wte, const Act* wpe, int B, int T,
                       int C) override {
    cuda::encoder_forward(dev(out), tokens, dev(wte), dev(wpe), B, T, C, stream_);
  }
  void encoder_backward(Act* dwte, Act* dwpe, const Act* dout, const std::int32_t* tokens, int B, int T,
                        int C) override {
    void* s = scratch(cuda::encoder_backward_scratch_bytes(B, T, C));
    cuda::encoder_backward(dev(dwte), dev(dwpe), dev(dout), tokens, B, T, C, s, scratch_bytes_, stream_);
  }
  void encoder_forward_part(Act* out, const std::int32_t* tokens, const Act* wte, const Act* wpe, int B, int T, int C,
                            int vocab_begin, int vocab_rows) override {
    cuda::encoder_forward(dev(out), tokens, dev(wte), dev(wpe), B, T, C, stream_, vocab_begin, vocab_rows);
  }
  void encoder_backward_part(Act* dwte, Act* dwpe, const Act* dout, const std::int32_t* tokens, int B, int T, int C,
                             int vocab_begin, int vocab_rows) override {
    void* s = scratch(cuda::encoder_backward_scratch_bytes(B, T, C));
    cuda::encoder_backward(dev(dwte), dev(dwpe), dev(dout), tokens, B, T, C, s, scratch_bytes_, stream_, vocab_begin,
                           vocab_rows);
  }

  void layernorm_forward(Act* out, float* mean, float* rstd, const Act* inp, const Act* w, const Act* b, int N,
                         int C) override {
    cuda::layernorm_forward(dev(out), mean, rstd, dev(inp), dev(w), dev(b), N, C, stream_);
  }
  void residual_layernorm_forward(Act* residual, Act* out, float* mean, float* rstd, const Act* a, const Act* b,
                                  const Act* w, const Act* bias, int N, int C) override {
    cuda::residual_layernorm_forward(dev(residual), dev(out), mean, rstd, dev(a), dev(b), dev(w), dev(bias), N, C,
                                     stream_);
  }
  void layernorm_backward(Act* dinp, Act* dw, Act* db, const Act* dout, const Act* inp, const Act* w, const float* mean,
                          const float* rstd, int N, int C) override {
    void* s = scratch(cuda::layernorm_backward_scratch_bytes(N, C));
    cuda::layernorm_backward(dev(dinp), dev(dw), dev(db), dev(dout), dev(inp), dev(w), mean, rstd, N, C, s,
                             scratch_bytes_, stream_);
  }

  void matmul_forward(Act* out, const Act* inp, const Act* w, const Act* bias, int N, int C, int OC,
                      Act* pre_gelu) override {
    matmul_.forward(dev(out), dev(inp), dev(w), dev(bias), N, C, OC, dev(pre_gelu));
  }
  void matmul_backward(Act* dinp, Act* dw, Act* dbias, const Act* dout, const Act* inp, const Act* w, int N, int C,
                       int OC, const Act* pre_gelu) override {
    matmul_.backward(dev(dinp), dev(dw), dev(dout), dev(inp), dev(w), N, C, OC, dev(pre_gelu));
    if (dbias) {
      void* s = scratch(cuda::bias_backward_scratch_bytes(N, OC));
      cuda::bias_backward(dev(dbias), dev(dout), N, OC, s, scratch_bytes_, stream_);
    }
  }

  std::size_t attention_stats_floats(int B, int T, int NH) const override {
    return static_cast<std::size_t>(B) * static_cast<std::size_t>(NH) *
           static_cast<std::size_t>(T);  // one log-sum-exp per (b, h, t) row
  }
  // ops.hpp asks with (B, T, NH) only, and cuda::attention_backward_scratch_floats takes the
  // whole shape. What is promised here is one float per (b, h, t) row, the per-row dot(dout, out) the backward
  // computes first; attention_backward checks the launcher's real need and, when the model's
  // buffer is smaller, runs in this object's scratch instead (grown once, on the first step).
  std::size_t attention_scratch_floats(int B, int T, int NH) const override { return attention_stats_floats(B, T, NH); }
  void attention_forward(Act* out, float* stats, const Act* qkv, const AttentionShape& a) override {
    cuda::attention_forward(dev(out), stats, dev(qkv), a, stream_);
  }
  void attention_backward(Act* dqkv, float* scratch_floats, const Act* dout, const Act* qkv, const Act* out,
                          const float* stats, const AttentionShape& a) override {
    const std::size_t need = cuda::attention_backward_scratch_floats(a);
    float* s = scratch_floats;
    if (need > attention_scratch_floats(a.B, a.T, a.NH)) s = static_cast<float*>(scratch(need * sizeof(float)));
    cuda::attention_backward(dev(dqkv), s, dev(dout), dev(qkv), dev(out), stats, a, stream_);
  }

  void rmsnorm_forward(Act* out, float* rstd, const Act* inp, const Act* w, int N, int C, float eps) override {
    cuda::rmsnorm_forward(dev(out), rstd, dev(inp), dev(w), N, C, eps, stream_);
  }
  void rmsnorm_backward(Act* dinp, Act* dw, const Act* dout, const Act* inp, const Act* w, const float* rstd, int N,
                        int C) override {
    void* s = scratch(cuda::rmsnorm_backward_scratch_bytes(N, C));
    cuda::rmsnorm_backward(dev(dinp), dev(dw), dev(dout), dev(inp), dev(w), rstd, N, C, s, scratch_bytes_, stream_);
  }
  void rotary_forward(Act* qkv, const AttentionShape& a, float theta) override {
    cuda::rotary(dev(qkv), a, theta, 1, stream_);
  }
  void rotary_backward(Act* dqkv, const AttentionShape& a, float theta) override {
    cuda::rotary(dev(dqkv), a, theta, -1, stream_);
  }
  void swiglu_forward(Act* out, const Act* inp, int N, int F) override {
    cuda::swiglu_forward(dev(out), dev(inp), N, F, stream_);
  }
  void swiglu_backward(Act* dinp, const Act* dout, const Act* inp, int N, int F) override {
    cuda::swiglu_backward(dev(dinp), dev(dout), dev(inp), N, F, stream_);
  }

  void to_f32(float* dst, const Act* src, std::size_t n) override { cuda::widen_to_f32(dst, dev(src), n, stream_); }
  void from_f32(Act* dst, const float* src, std::size_t n) override { cuda::round_to_bf16(dev(dst), src, n, stream_); }
  void residual_forward(Act* out, const Act* a, const Act* b, std::size_t n) override {
    cuda::residual_forward(dev(out), dev(a), dev(b), n, stream_);
  }

  void logits_forward(Act* logits, const Act* x, const Act* wte, int N, int C, int Vp) override {
    matmul_.logits_forward(dev(logits), dev(x), dev(wte), N, C, Vp);
  }
  void logits_backward(Act* dx, Act* dwte, const Act* dlogits, const Act* x, const Act* wte, int N, int C,
                       int Vp) override {
    matmul_.logits_backward(dev(dx), dev(dwte), dev(dlogits), dev(x), dev(wte), N, C, Vp);
  }

  void softmax_cross_entropy(float* losses, Act* dlogits, const Act* logits, const std::int32_t* targets, int N, int V,
                             int Vp, float dloss) override {
    cuda::softmax_cross_entropy(losses, dev(dlogits), dev(logits), targets, N, V, Vp, dloss, stream_);
  }
  void cross_entropy_part_max(float* row_max, const Act* logits, int N, int Vl, int v0, int V) override {
    cuda::cross_entropy_part_max(row_max, dev(logits), N, Vl, v0, V, stream_);
  }
  void cross_entropy_part_sums(float* sums, const Act* logits, const float* row_max, const std::int32_t* targets, int N,
                               int Vl, int v0, int V) override {
    cuda::cross_entropy_part_sums(sums, dev(logits), row_max, targets, N, Vl, v0, V, stream_);
  }
  void cross_entropy_part_finish(float* losses, Act* dlogits, const Act* logits, const float* row_max,
                                 const float* sums, const std::int32_t* targets, int N, int Vl, int v0, int V,
                                 float dloss) override {
    cuda::cross_entropy_part_finish(losses, dev(dlogits), dev(logits), row_max, sums, targets, N, Vl, v0, V, dloss,
                                    stream_);
  }
  void add_mean(double* total, const float* values, int n) override { cuda::add_mean(total, values, n, stream_); }

 private:
  // The largest scratch any launcher asks for at these shapes: the encoder's sort over B*T
  // positions, the LayerNorm, RMSNorm and bias column sums over N rows (widths C, 3C and 4C),
  // and the attention backward beyond what the model hands it.
  void reserve(int max_rows, int T, int C, int NH) override {
    const int B = std::max(1, max_rows / std::max(T, 1));
    std::size_t need = cuda::encoder_backward_scratch_bytes(B, T, C);
    need = std::max(need, cuda::layernorm_backward_scratch_bytes(max_rows, C));
    need = std::max(need, cuda::rmsnorm_backward_scratch_bytes(max_rows, C));
    for (int oc : {C, 3 * C, 4 * C}) need = std::max(need, cuda::bias_backward_scratch_bytes(max_rows, oc));
    const std::size_t att = cuda::attention_backward_scratch_floats(B, T, C, NH);
    if (att > attention_scratch_floats(B, T, NH)) need = std::max(need, att * sizeof(float));
    scratch(need);
  }

  // The shared scratch, at least `bytes` long (scratch_bytes_ is what the launchers are told).
  void* scratch(std::size_t bytes) {
    if (bytes <= scratch_bytes_) return scratch_;
    // Rounded up so that near sizes (the bias backward of each width) share one growth.
    constexpr std::size_t kGranule = std::size_t{1} << 20;
    const std::size_t grown = (bytes + kGranule - 1) / kGranule * kGranule;
    if (scratch_) {
      // Work already enqueued may still read the old buffer.
      GPT_CUDA_CHECK(cudaStreamSynchronize(stream_));
      GPT_CUDA_CHECK(cudaFree(scratch_));
      scratch_ = nullptr;
      scratch_bytes_ = 0;
    }
    scratch_ = device_malloc(grown, "kernel scratch");
    scratch_bytes_ = grown;
    return scratch_;
  }

  struct Staging {
    void* host = nullptr;  // pinned
    std::size_t bytes = 0;
    cudaEvent_t done = nullptr;  // recorded after the copy that last read `host`
  };
  static constexpr int kStagingSlots = 4;  // two uploads (inputs, targets) per micro-batch
  std::array<Staging, kStagingSlots> staging_{};
  int next_slot_ = 0;
  // Destroyed after matmul_ (members go in reverse order), whose destructor still synchronizes
  // on the stream: destroying it in ~CudaOps' body left matmul_ a dangling stream handle. Null
  // when the caller's stream is used.
  struct OwnedStream {
    cudaStream_t s = nullptr;
    ~OwnedStream() {
      if (s) cudaStreamDestroy(s);
    }
  };
  OwnedStream owned_stream_;
  cudaStream_t stream_;
  cuda::Matmul matmul_;
  void* scratch_ = nullptr;
  std::size_t scratch_bytes_ = 0;
};

}  // namespace

std::unique_ptr<Ops> make_cuda_ops(cudaStream_t stream) { return std::make_unique<CudaOps>(stream); }

}  // namespace zero::gpt
