// The GPU model test's tolerances (test/support/gpt_model_compare.hpp) against bf16 rounding
// alone, on any machine: the fp32 host model whose every stored tensor is rounded to bf16 after
// the operation that wrote it, as the CUDA Ops store them, must stay within the tolerances the
// CUDA model is held to, on the same shapes. The CUDA kernels add only summation order inside
// fp32 accumulations, so a CUDA model that fails where this passes has a real error, not a
// tolerance that is too tight. And the emulation must differ from fp32 at all, or it would
// emulate nothing.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "gpt/gpt_model.hpp"
#include "forwarding_ops.hpp"
#include "gpt_model_compare.hpp"
#include "gpt/ops.hpp"

using namespace zero::gpt;
namespace cmp = zero::gpt::compare;

namespace {

float* f32(Act* p) { return reinterpret_cast<float*>(p); }

void round_all(Act* p, std::size_t n) {
  if (!p) return;
  float* f = f32(p);
  for (std::size_t i = 0; i < n; ++i) f[i] = cmp::round_bf16(f[i]);
}

// HostOps, then every Act tensor the operation wrote rounded to bf16 (statistics and losses stay
// fp32, as on the GPU). A gradient that is added into is rounded after the addition, which is
// what a bf16 read-add-write does.
class Bf16RoundingOps final : public test::ForwardingOps {
 public:
  const char* name() const override { return "host-bf16-rounding"; }
  void encoder_forward(Act* o, const std::int32_t* t, const Act* a, const Act* b, int B, int T, int C) override {
    ForwardingOps::encoder_forward(o, t, a, b, B, T, C);
    round_all(o, size(B) * T * C);
  }
  void encoder_backward(Act* dwte, Act* dwpe, const Act* d, const std::int32_t* t, int B, int T, int C) override {
    ForwardingOps::encoder_backward(dwte, dwpe, d, t, B, T, C);
    // Only the rows of the ids present were written (the padded ones must stay exactly 0).
    for (std::size_t i = 0; i < size(B) * T; ++i) round_all(act_offset(dwte, size(t[i]) * C, sizeof(float)), size(C));
    round_all(dwpe, size(T) * C);
  }
  void layernorm_forward(Act* o, float* m, float* r, const Act* i, const Act* w, const Act* b, int N, int C) override {
    ForwardingOps::layernorm_forward(o, m, r, i, w, b, N, C);
    round_all(o, size(N) * C);
  }
  void residual_layernorm_forward(Act* res, Act* o, float* m, float* r, const Act* a, const Act* b, const Act* w,
                                  const Act* bias, int N, int C) override {
    ForwardingOps::residual_layernorm_forward(res, o, m, r, a, b, w, bias, N, C);
    round_all(res, size(N) * C);
    round_all(o, size(N) * C);
  }
  void layernorm_backward(Act* di, Act* dw, Act* db, const Act* d, const Act* i, const Act* w, const float* m,
                          const float* r, int N, int C) override {
    ForwardingOps::layernorm_backward(di, dw, db, d, i, w, m, r, N, C);
    round_all(di, size(N) * C);
    round_all(dw, size(C));
    round_all(db, size(C));
  }
  void matmul_forward(Act* o, const Act* i, const Act* w, const Act* b, int N, int C, int OC, Act* pre_gelu) override {
    ForwardingOps::matmul_forward(o, i, w, b, N, C, OC, pre_gelu);
    round_all(o, size(N) * OC);
    round_all(pre_gelu, size(N) * OC);
  }
  void matmul_backward(Act* di, Act* dw, Act* db, const Act* d, const Act* i, const Act* w, int N, int C, int OC,
                       const Act* pre_gelu) override {
    ForwardingOps::matmul_backward(di, dw, db, d, i, w, N, C, OC, pre_gelu);
    round_all(di, size(N) * C);
    round_all(dw, size(C) * OC);
    round_all(db, size(OC));
  }
  void attention_forward(Act* o, float* st, const Act* qkv, const AttentionShape& s) override {
    ForwardingOps::attention_forward(o, st, qkv, s);
    round_all(o, size(s.B) * s.T * s.width());
  }
  void attention_backward(Act* dqkv, float* sc, const Act* d, const Act* qkv, const Act* o, const float* st,
                          const AttentionShape& s) override {
    ForwardingOps::attention_backward(dqkv, sc, d, qkv, o, st, s);
    round_all(dqkv, size(s.B) * s.T * s.qkv_width());
  }
  void residual_forward(Act* o, const Act* a, const Act* b, std::size_t n) override {
    ForwardingOps::residual_forward(o, a, b, n);
    round_all(o, n);
  }
  void logits_forward(Act* l, const Act* x, const Act* w, int N, int C, int Vp) override {
    ForwardingOps::logits_forward(l, x, w, N, C, Vp);
    round_all(l, size(N) * Vp);
  }
  void logits_backward(Act* dx, Act* dw, const Act* dl, const Act* x, const Act* w, int N, int C, int Vp) override {
    ForwardingOps::logits_backward(dx, dw, dl, x, w, N, C, Vp);
    round_all(dx, size(N) * C);
    round_all(dw, size(Vp) * C);
  }
  void softmax_cross_entropy(float* l, Act* dl, const Act* lg, const std::int32_t* t, int N, int V, int Vp,
                             float dloss) override {
    ForwardingOps::softmax_cross_entropy(l, dl, lg, t, N, V, Vp, dloss);
    round_all(dl, size(N) * Vp);
  }

 private:
  static std::size_t size(int n) { return static_cast<std::size_t>(n); }
};

}  // namespace

TEST_CASE("bf16 rounding alone stays within the GPU model test's tolerances", "[gpt][model]") {
  for (const cmp::ModelCase& mc : cmp::model_cases()) {
    const GptConfig cfg = cmp::config_of(mc);
    INFO(cmp::describe(mc));
    HostParams params(cfg);
    cmp::init_bf16(params, 2024);
    const cmp::Batch batch = cmp::random_batch(cfg, cmp::kBatch, 17);

    auto fp32_ops = make_host_ops();
    const cmp::HostStep exact = cmp::host_step(*fp32_ops, cfg, params, batch);
    Bf16RoundingOps bf16_ops;
    const cmp::HostStep rounded = cmp::host_step(bf16_ops, cfg, params, batch);

    const auto t = cmp::agreement_per_tensor(params.specs(), cmp::units_of(rounded.grads), cmp::units_of(exact.grads));
    cmp::print_summary("bf16 emulation", cmp::describe(mc), rounded.loss, exact.loss, t);
    CHECK(std::abs(rounded.loss - exact.loss) <= cmp::kLossRel * exact.loss);
    bool any_rounding = false;
    for (const auto& x : t) {
      INFO(x.name << ": |g| " << x.a.norm << ", rel " << x.a.rel << ", cosine " << x.a.cosine);
      CHECK(x.a.norm > 0);
      CHECK(x.a.rel <= cmp::kGradRel);
      CHECK(x.a.cosine >= cmp::kGradCos);
      any_rounding = any_rounding || x.a.rel > 0;
    }
    CHECK(any_rounding);
  }
}
