// HostOps: the Ops interface on the CPU, fp32, forwarding to the kernels in host_kernels.cpp.
#include <cblas.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "gpt/host_kernels.hpp"
#include "gpt/ops.hpp"
#include "zero/error.hpp"

namespace zero::gpt {

namespace {

// HostOps computes in fp32: Act is float.
inline float* F(Act* p) { return reinterpret_cast<float*>(p); }
inline const float* F(const Act* p) { return reinterpret_cast<const float*>(p); }

class HostOps final : public Ops {
 public:
  const char* name() const override { return "host-fp32"; }
  DType dtype() const override { return DType::f32; }
  bool host_memory() const override { return true; }

  void* allocate(std::size_t bytes) override {
    if (bytes == 0) return nullptr;
    // 64-byte alignment: whole cache lines, and what AVX-512 loads prefer.
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    ZERO_CHECK(p, fmt::format("HostOps: could not allocate {} bytes of activations; reduce the micro-batch size or "
                              "seq_len, or turn on model.activation_checkpointing",
                              bytes));
    return p;
  }
  void deallocate(void* p) noexcept override { std::free(p); }
  void upload(void* dst, const void* src, std::size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void download(void* dst, const void* src, std::size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void fill_zero(void* p, std::size_t bytes) override {
    if (bytes) std::memset(p, 0, bytes);
  }
  void synchronize() override {}

  void encoder_forward(Act* out, const std::int32_t* tokens, const Act* wte, const Act* wpe, int B, int T,
                       int C) override {
    host::encoder_forward(F(out), tokens, F(wte), F(wpe), B, T, C);
  }
  void encoder_backward(Act* dwte, Act* dwpe, const Act* dout, const std::int32_t* tokens, int B, int T,
                        int C) override {
    host::encoder_backward(F(dwte), F(dwpe), F(dout), tokens, B, T, C);
  }
  void encoder_forward_part(Act* out, const std::int32_t* tokens, const Act* wte, const Act* wpe, int B, int T, int C,
                            int vocab_begin, int vocab_rows) override {
    host::encoder_forward(F(out), tokens, F(wte), F(wpe), B, T, C, vocab_begin, vocab_rows);
  }
  void encoder_backward_part(Act* dwte, Act* dwpe, const Act* dout, const std::int32_t* tokens, int B, int T, int C,
                             int vocab_begin, int vocab_rows) override {
    host::encoder_backward(F(dwte), F(dwpe), F(dout), tokens, B, T, C, vocab_begin, vocab_rows);
  }
  void layernorm_forward(Act* out, float* mean, float* rstd, const Act* inp, const Act* w, const Act* b, int N,
                         int C) override {
    host::layernorm_forward(F(out), mean, rstd, F(inp), F(w), F(b), N, C);
  }
  void residual_layernorm_forward(Act* residual, Act* out, float* mean, float* rstd, const Act* a, const Act* b,
                                  const Act* w, const Act* bias, int N, int C) override {
    host::residual_forward(F(residual), F(a), F(b), static_cast<std::size_t>(N) * C);
    host::layernorm_forward(F(out), mean, rstd, F(residual), F(w), F(bias), N, C);
  }
  void layernorm_backward(Act* dinp, Act* dw, Act* db, const Act* dout, const Act* inp, const Act* w, const float* mean,
                          const float* rstd, int N, int C) override {
    host::layernorm_backward(F(dinp), F(dw), F(db), F(dout), F(inp), F(w), mean, rstd, N, C);
  }
  void matmul_forward(Act* out, const Act* inp, const Act* w, const Act* bias, int N, int C, int OC,
                      Act* pre_gelu) override {
    if (!pre_gelu) {
      host::matmul_forward(F(out), F(inp), F(w), F(bias), N, C, OC);
      return;
    }
    host::matmul_forward(F(pre_gelu), F(inp), F(w), F(bias), N, C, OC);
    host::gelu_forward(F(out), F(pre_gelu), static_cast<std::size_t>(N) * OC);
  }
  void matmul_backward(Act* dinp, Act* dw, Act* dbias, const Act* dout, const Act* inp, const Act* w, int N, int C,
                       int OC, const Act* pre_gelu) override {
    if (pre_gelu && dinp) std::memset(dinp, 0, static_cast<std::size_t>(N) * C * sizeof(float));
    host::matmul_backward(F(dinp), F(dw), F(dbias), F(dout), F(inp), F(w), N, C, OC);
    if (pre_gelu && dinp) host::gelu_backward_inplace(F(dinp), F(pre_gelu), static_cast<std::size_t>(N) * C);
  }
  std::size_t attention_stats_floats(int B, int T, int NH) const override {
    return static_cast<std::size_t>(B) * NH * T * T;  // the probabilities
  }
  std::size_t attention_scratch_floats(int B, int T, int NH) const override {
    return static_cast<std::size_t>(B) * NH * T * T;  // their gradient
  }
  void attention_forward(Act* out, float* stats, const Act* qkv, const AttentionShape& s) override {
    host::attention_forward(F(out), stats, F(qkv), s);
  }
  void attention_backward(Act* dqkv, float* scratch, const Act* dout, const Act* qkv, const Act* /*out*/,
                          const float* stats, const AttentionShape& s) override {
    host::attention_backward(F(dqkv), scratch, F(dout), F(qkv), stats, s);
  }
  void rmsnorm_forward(Act* out, float* rstd, const Act* inp, const Act* w, int N, int C, float eps) override {
    host::rmsnorm_forward(F(out), rstd, F(inp), F(w), N, C, eps);
  }
  void rmsnorm_backward(Act* dinp, Act* dw, const Act* dout, const Act* inp, const Act* w, const float* rstd, int N,
                        int C) override {
    host::rmsnorm_backward(F(dinp), F(dw), F(dout), F(inp), F(w), rstd, N, C);
  }
  void rotary_forward(Act* qkv, const AttentionShape& s, float theta) override { host::rotary(F(qkv), s, theta, 1); }
  void rotary_backward(Act* dqkv, const AttentionShape& s, float theta) override {
    host::rotary(F(dqkv), s, theta, -1);
  }
  void swiglu_forward(Act* out, const Act* inp, int N, int F_) override { host::swiglu_forward(F(out), F(inp), N, F_); }
  void swiglu_backward(Act* dinp, const Act* dout, const Act* inp, int N, int F_) override {
    host::swiglu_backward(F(dinp), F(dout), F(inp), N, F_);
  }
  void residual_forward(Act* out, const Act* a, const Act* b, std::size_t n) override {
    host::residual_forward(F(out), F(a), F(b), n);
  }
  void logits_forward(Act* logits, const Act* x, const Act* wte, int N, int C, int Vp) override {
    host::logits_forward(F(logits), F(x), F(wte), N, C, Vp);
  }
  void logits_backward(Act* dx, Act* dwte, const Act* dlogits, const Act* x, const Act* wte, int N, int C,
                       int Vp) override {
    host::logits_backward(F(dx), F(dwte), F(dlogits), F(x), F(wte), N, C, Vp);
  }
  void softmax_cross_entropy(float* losses, Act* dlogits, const Act* logits, const std::int32_t* targets, int N, int V,
                             int Vp, float dloss) override {
    host::softmax_cross_entropy(losses, F(dlogits), F(logits), targets, N, V, Vp, dloss);
  }
  void cross_entropy_part_max(float* row_max, const Act* logits, int N, int Vl, int v0, int V) override {
    host::cross_entropy_part_max(row_max, F(logits), N, Vl, v0, V);
  }
  void cross_entropy_part_sums(float* sums, const Act* logits, const float* row_max, const std::int32_t* targets, int N,
                               int Vl, int v0, int V) override {
    host::cross_entropy_part_sums(sums, F(logits), row_max, targets, N, Vl, v0, V);
  }
  void cross_entropy_part_finish(float* losses, Act* dlogits, const Act* logits, const float* row_max,
                                 const float* sums, const std::int32_t* targets, int N, int Vl, int v0, int V,
                                 float dloss) override {
    host::cross_entropy_part_finish(losses, F(dlogits), F(logits), row_max, sums, targets, N, Vl, v0, V, dloss);
  }
  void add_mean(double* total, const float* values, int n) override {
    double sum = 0.0;
    for (int i = 0; i < n; ++i) sum += values[i];
    *total += sum / n;
  }
};

}  // namespace

std::unique_ptr<Ops> make_host_ops() { return std::make_unique<HostOps>(); }

double measure_host_sgemm_tflops() {
  using Clock = std::chrono::steady_clock;
  auto time_one = [](int n, const std::vector<float>& a, std::vector<float>& c) {
    const auto t0 = Clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, a.data(), n, 0.0f, c.data(), n);
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  int n = 256;
  std::vector<float> a, c;
  double seconds = 0.0;
  for (;;) {
    const std::size_t nn = static_cast<std::size_t>(n) * static_cast<std::size_t>(n);
    a.assign(nn, 0.5f);
    c.assign(nn, 0.0f);
    seconds = time_one(n, a, c);  // also the warm-up of this size
    if (seconds > 0.05 || n >= 4096) break;
    n *= 2;
  }
  for (int rep = 0; rep < 3; ++rep) seconds = std::min(seconds, time_one(n, a, c));
  return 2.0 * n * n * static_cast<double>(n) / seconds / 1e12;
}

}  // namespace zero::gpt
