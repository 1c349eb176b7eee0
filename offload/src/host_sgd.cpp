// Host SGD with momentum (PyTorch's semantics: dampening 0, L2 decay into the gradient).
#include "offload/host_optimizer.hpp"

#include "host_kernel_util.hpp"

namespace zero::offload {
namespace {

struct SgdConsts {
  float lr, momentum, weight_decay, grad_scale;
  bool first_step;
};

// One loop per case (weight decay or not; no momentum, its first step, or later), so the loop
// has no branch and vectorises; the same operations in each as in PyTorch's order.
enum Momentum { kNoMomentum, kFirst, kLater };

template <int G, int O, bool WD, int M>
void sgd_range(float* master, float* buf, const void* grad, void* out, std::size_t begin, std::size_t end,
               const SgdConsts& c) {
  for (std::size_t i = begin; i < end; ++i) {
    float p = master[i];
    float g = load_grad<G>(grad, i) * c.grad_scale;
    if constexpr (WD) g = g + c.weight_decay * p;
    if constexpr (M != kNoMomentum) {
      const float b = M == kFirst ? g : c.momentum * buf[i] + g;
      buf[i] = b;
      g = b;
    }
    p = p - c.lr * g;
    master[i] = p;
    store_param<O>(out, i, p);
  }
}

template <int G, int O>
void sgd_range_cases(float* master, float* buf, const void* grad, void* out, std::size_t b, std::size_t e,
                     const SgdConsts& c) {
  const int m = c.momentum == 0.0f ? kNoMomentum : c.first_step ? kFirst : kLater;
  const bool wd = c.weight_decay != 0.0f;
  if (m == kNoMomentum)
    return wd ? sgd_range<G, O, true, kNoMomentum>(master, buf, grad, out, b, e, c)
              : sgd_range<G, O, false, kNoMomentum>(master, buf, grad, out, b, e, c);
  if (m == kFirst)
    return wd ? sgd_range<G, O, true, kFirst>(master, buf, grad, out, b, e, c)
              : sgd_range<G, O, false, kFirst>(master, buf, grad, out, b, e, c);
  return wd ? sgd_range<G, O, true, kLater>(master, buf, grad, out, b, e, c)
            : sgd_range<G, O, false, kLater>(master, buf, grad, out, b, e, c);
}

template <int G>
void sgd_range_out(float* master, float* buf, const void* grad, void* out, int oc, std::size_t b, std::size_t e,
                   const SgdConsts& c) {
  switch (oc) {
    case detail::kF32: return sgd_range_cases<G, detail::kF32>(master, buf, grad, out, b, e, c);
    case detail::kBF16: return sgd_range_cases<G, detail::kBF16>(master, buf, grad, out, b, e, c);
    case detail::kF16: return sgd_range_cases<G, detail::kF16>(master, buf, grad, out, b, e, c);
    default: return sgd_range_cases<G, detail::kNone>(master, buf, grad, out, b, e, c);
  }
}

}  // namespace

void sgd_step(float* master, float* momentum_buf, const void* grad, DType grad_type, void* param_out, DType param_type,
              std::size_t n, const SgdHyper& h, int threads) {
  if (n == 0) return;
  check_common(master, grad, grad_type, param_out, param_type, "sgd_step");
  ZERO_CHECK(h.momentum == 0.0f || momentum_buf != nullptr,
             fmt::format("sgd_step: momentum {} needs a momentum buffer; pass one of n floats", h.momentum));
  const SgdConsts c{h.lr, h.momentum, h.weight_decay, h.grad_scale, h.first_step};
  const int oc = param_out != nullptr ? elem_code(param_type) : detail::kNone;
  auto range = grad_type == DType::f32    ? sgd_range_out<detail::kF32>
               : grad_type == DType::bf16 ? sgd_range_out<detail::kBF16>
                                          : sgd_range_out<detail::kF16>;
  // The AVX-512 kernel takes each tile's groups of sixteen, the portable loop what is left.
  const bool simd = avx512_kernels() && simd_out(oc);
  const detail::SgdKernel k{h.lr,
                            h.momentum,
                            h.weight_decay,
                            h.grad_scale,
                            h.momentum == 0.0f ? 0 : h.first_step ? 1 : 2,
                            h.weight_decay != 0.0f};
  const int gc = elem_code(grad_type);
  for_each_tile(n, threads, [&](std::size_t b, std::size_t e) {
    if (simd) b = detail::sgd_avx512(master, momentum_buf, grad, gc, f32_out(param_out, oc), b, e, k);
    range(master, momentum_buf, grad, param_out, oc, b, e, c);
  });
}

}  // namespace zero::offload
