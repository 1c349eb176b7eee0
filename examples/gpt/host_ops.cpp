// HostOps: the Ops interface on the CPU, fp32, forwarding to the kernels in host_kernels.cpp.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "host_kernels.hpp"
#include "ops.hpp"
#include "zero/error.hpp"

namespace zero::gpt {

namespace {

class HostOps final : public Ops {
 public:
  const char* name() const override { return "host-fp32"; }

  void* allocate(std::size_t bytes) override {
    if (bytes == 0) return nullptr;
    // 64-byte alignment: whole cache lines, and what AVX-512 loads prefer.
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    ZERO_CHECK(p, "HostOps: could not allocate " + std::to_string(bytes) +
                      " bytes of activations; reduce the micro-batch size or seq_len, or turn on "
                      "model.activation_checkpointing");
    return p;
  }
  void deallocate(void* p) noexcept override { std::free(p); }
  void upload(void* dst, const void* src, std::size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void download(void* dst, const void* src, std::size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void fill_zero(float* p, std::size_t n) override {
    if (n) std::memset(p, 0, n * sizeof(float));
  }

  void encoder_forward(float* out, const std::int32_t* tokens, const float* wte, const float* wpe,
                       int B, int T, int C) override {
    host::encoder_forward(out, tokens, wte, wpe, B, T, C);
  }
  void encoder_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens,
                        int B, int T, int C) override {
    host::encoder_backward(dwte, dwpe, dout, tokens, B, T, C);
  }
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                         const float* b, int N, int C) override {
    host::layernorm_forward(out, mean, rstd, inp, w, b, N, C);
  }
  void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                          const float* w, const float* mean, const float* rstd, int N,
                          int C) override {
    host::layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
  }
  void matmul_forward(float* out, const float* inp, const float* w, const float* bias, int N,
                      int C, int OC) override {
    host::matmul_forward(out, inp, w, bias, N, C, OC);
  }
  void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp,
                       const float* w, int N, int C, int OC) override {
    host::matmul_backward(dinp, dw, dbias, dout, inp, w, N, C, OC);
  }
  void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C,
                         int NH) override {
    host::attention_forward(out, att, qkv, B, T, C, NH);
  }
  void attention_backward(float* dqkv, float* datt, const float* dout, const float* qkv,
                          const float* att, int B, int T, int C, int NH) override {
    host::attention_backward(dqkv, datt, dout, qkv, att, B, T, C, NH);
  }
  void gelu_forward(float* out, const float* inp, std::size_t n) override {
    host::gelu_forward(out, inp, n);
  }
  void gelu_backward(float* dinp, const float* inp, const float* dout, std::size_t n) override {
    host::gelu_backward(dinp, inp, dout, n);
  }
  void residual_forward(float* out, const float* a, const float* b, std::size_t n) override {
    host::residual_forward(out, a, b, n);
  }
  void logits_forward(float* logits, const float* x, const float* wte, int N, int C,
                      int Vp) override {
    host::logits_forward(logits, x, wte, N, C, Vp);
  }
  void logits_backward(float* dx, float* dwte, const float* dlogits, const float* x,
                       const float* wte, int N, int C, int Vp) override {
    host::logits_backward(dx, dwte, dlogits, x, wte, N, C, Vp);
  }
  void softmax_cross_entropy(float* losses, float* dlogits, const float* logits,
                             const std::int32_t* targets, int N, int V, int Vp,
                             float dloss) override {
    host::softmax_cross_entropy(losses, dlogits, logits, targets, N, V, Vp, dloss);
  }
};

}  // namespace

std::unique_ptr<Ops> make_host_ops() { return std::make_unique<HostOps>(); }

double measure_host_sgemm_tflops() {
  using Clock = std::chrono::steady_clock;
  auto time_one = [](int n, const std::vector<float>& a, std::vector<float>& c) {
    const auto t0 = Clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, a.data(),
                n, 0.0f, c.data(), n);
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
