// An Ops that forwards every call to HostOps: the base of the tests' instrumented Ops, which
// override only the calls they observe or alter (count the FLOPs, round to bf16) and then call
// the base. A change of the Ops interface is then made here once, not in every test's copy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "gpt/ops.hpp"

namespace zero::gpt::test {

class ForwardingOps : public Ops {
 public:
  zero::DType dtype() const override { return host_->dtype(); }
  bool host_memory() const override { return true; }
  void* allocate(std::size_t n) override { return host_->allocate(n); }
  void deallocate(void* p) noexcept override { host_->deallocate(p); }
  void upload(void* d, const void* s, std::size_t n) override { host_->upload(d, s, n); }
  void download(void* d, const void* s, std::size_t n) override { host_->download(d, s, n); }
  void fill_zero(void* p, std::size_t n) override { host_->fill_zero(p, n); }
  void synchronize() override {}
  void encoder_forward(Act* o, const std::int32_t* t, const Act* a, const Act* b, int B, int T, int C) override {
    host_->encoder_forward(o, t, a, b, B, T, C);
  }
  void encoder_backward(Act* a, Act* b, const Act* d, const std::int32_t* t, int B, int T, int C) override {
    host_->encoder_backward(a, b, d, t, B, T, C);
  }
  void encoder_forward_part(Act* o, const std::int32_t* t, const Act* a, const Act* b, int B, int T, int C, int v0,
                            int rows) override {
    host_->encoder_forward_part(o, t, a, b, B, T, C, v0, rows);
  }
  void encoder_backward_part(Act* a, Act* b, const Act* d, const std::int32_t* t, int B, int T, int C, int v0,
                             int rows) override {
    host_->encoder_backward_part(a, b, d, t, B, T, C, v0, rows);
  }
  void layernorm_forward(Act* o, float* m, float* r, const Act* i, const Act* w, const Act* b, int N, int C) override {
    host_->layernorm_forward(o, m, r, i, w, b, N, C);
  }
  void residual_layernorm_forward(Act* res, Act* o, float* m, float* r, const Act* a, const Act* b, const Act* w,
                                  const Act* bias, int N, int C) override {
    host_->residual_layernorm_forward(res, o, m, r, a, b, w, bias, N, C);
  }
  void layernorm_backward(Act* di, Act* dw, Act* db, const Act* d, const Act* i, const Act* w, const float* m,
                          const float* r, int N, int C) override {
    host_->layernorm_backward(di, dw, db, d, i, w, m, r, N, C);
  }
  void matmul_forward(Act* o, const Act* i, const Act* w, const Act* b, int N, int C, int OC, Act* pre_gelu) override {
    host_->matmul_forward(o, i, w, b, N, C, OC, pre_gelu);
  }
  void matmul_backward(Act* di, Act* dw, Act* db, const Act* d, const Act* i, const Act* w, int N, int C, int OC,
                       const Act* pre_gelu) override {
    host_->matmul_backward(di, dw, db, d, i, w, N, C, OC, pre_gelu);
  }
  std::size_t attention_stats_floats(int B, int T, int NH) const override {
    return host_->attention_stats_floats(B, T, NH);
  }
  std::size_t attention_scratch_floats(int B, int T, int NH) const override {
    return host_->attention_scratch_floats(B, T, NH);
  }
  void attention_forward(Act* o, float* st, const Act* qkv, const AttentionShape& s) override {
    host_->attention_forward(o, st, qkv, s);
  }
  void attention_backward(Act* dqkv, float* sc, const Act* d, const Act* qkv, const Act* o, const float* st,
                          const AttentionShape& s) override {
    host_->attention_backward(dqkv, sc, d, qkv, o, st, s);
  }
  void rmsnorm_forward(Act* o, float* r, const Act* i, const Act* w, int N, int C, float eps) override {
    host_->rmsnorm_forward(o, r, i, w, N, C, eps);
  }
  void rmsnorm_backward(Act* di, Act* dw, const Act* d, const Act* i, const Act* w, const float* r, int N,
                        int C) override {
    host_->rmsnorm_backward(di, dw, d, i, w, r, N, C);
  }
  void rotary_forward(Act* qkv, const AttentionShape& s, float theta) override { host_->rotary_forward(qkv, s, theta); }
  void rotary_backward(Act* dqkv, const AttentionShape& s, float theta) override {
    host_->rotary_backward(dqkv, s, theta);
  }
  void swiglu_forward(Act* o, const Act* i, int N, int F) override { host_->swiglu_forward(o, i, N, F); }
  void swiglu_backward(Act* di, const Act* d, const Act* i, int N, int F) override {
    host_->swiglu_backward(di, d, i, N, F);
  }
  void residual_forward(Act* o, const Act* a, const Act* b, std::size_t n) override {
    host_->residual_forward(o, a, b, n);
  }
  void logits_forward(Act* l, const Act* x, const Act* w, int N, int C, int Vp) override {
    host_->logits_forward(l, x, w, N, C, Vp);
  }
  void logits_backward(Act* dx, Act* dw, const Act* dl, const Act* x, const Act* w, int N, int C, int Vp) override {
    host_->logits_backward(dx, dw, dl, x, w, N, C, Vp);
  }
  void softmax_cross_entropy(float* l, Act* dl, const Act* lg, const std::int32_t* t, int N, int V, int Vp,
                             float dloss) override {
    host_->softmax_cross_entropy(l, dl, lg, t, N, V, Vp, dloss);
  }
  void cross_entropy_part_max(float* m, const Act* lg, int N, int Vl, int v0, int V) override {
    host_->cross_entropy_part_max(m, lg, N, Vl, v0, V);
  }
  void cross_entropy_part_sums(float* s, const Act* lg, const float* m, const std::int32_t* t, int N, int Vl, int v0,
                               int V) override {
    host_->cross_entropy_part_sums(s, lg, m, t, N, Vl, v0, V);
  }
  void cross_entropy_part_finish(float* l, Act* dl, const Act* lg, const float* m, const float* s,
                                 const std::int32_t* t, int N, int Vl, int v0, int V, float dloss) override {
    host_->cross_entropy_part_finish(l, dl, lg, m, s, t, N, Vl, v0, V, dloss);
  }
  void add_mean(double* total, const float* values, int n) override { host_->add_mean(total, values, n); }

 private:
  std::unique_ptr<Ops> host_ = make_host_ops();
};

}  // namespace zero::gpt::test
