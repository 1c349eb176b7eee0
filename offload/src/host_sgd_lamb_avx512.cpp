// AVX-512 kernels of SGD with momentum and LAMB: sixteen lanes of the portable loops in
// host_sgd.cpp and host_lamb.cpp, the same operations in the same order (no FMA: the file is
// built with -ffp-contract=off like the portable ones). Only whole groups of sixteen; the
// drivers finish a run with their own loops.
#include "host_avx512_util.hpp"

namespace zero::offload::detail {
namespace {

template <int G, bool Decay, int Kind, bool Out>
std::size_t sgd_loop(float* master, float* buf, const void* grad, float* out, std::size_t i, std::size_t end,
                     const SgdKernel& k) {
  const __m512 lr = _mm512_set1_ps(k.lr), mom = _mm512_set1_ps(k.momentum), wd = _mm512_set1_ps(k.weight_decay);
  const __m512 scale = _mm512_set1_ps(k.grad_scale);
  for (; i + 16 <= end; i += 16) {
    __m512 p = _mm512_loadu_ps(master + i);
    __m512 g = _mm512_mul_ps(grad16<G>(grad, i), scale);
    if constexpr (Decay) g = _mm512_add_ps(g, _mm512_mul_ps(wd, p));
    if constexpr (Kind != 0) {
      if constexpr (Kind == 2) g = _mm512_add_ps(_mm512_mul_ps(mom, _mm512_loadu_ps(buf + i)), g);
      _mm512_storeu_ps(buf + i, g);
    }
    p = _mm512_sub_ps(p, _mm512_mul_ps(lr, g));
    _mm512_storeu_ps(master + i, p);
    if constexpr (Out) _mm512_storeu_ps(out + i, p);
  }
  return i;
}

template <int G, bool Decay, bool Out>
std::size_t sgd_kind(float* master, float* buf, const void* grad, float* out, std::size_t b, std::size_t e,
                     const SgdKernel& k) {
  if (k.momentum_kind == 0) return sgd_loop<G, Decay, 0, Out>(master, buf, grad, out, b, e, k);
  if (k.momentum_kind == 1) return sgd_loop<G, Decay, 1, Out>(master, buf, grad, out, b, e, k);
  return sgd_loop<G, Decay, 2, Out>(master, buf, grad, out, b, e, k);
}

// LAMB's direction, (m / c1) / (sqrt(v / c2) + eps) + wd * p, as lamb_direction computes it.
struct LambVec {
  __m512 inv_c1, inv_c2, eps, wd;
  explicit LambVec(const LambConstants& c)
      : inv_c1(_mm512_set1_ps(c.inv_bias_c1)),
        inv_c2(_mm512_set1_ps(c.inv_bias_c2)),
        eps(_mm512_set1_ps(c.eps)),
        wd(_mm512_set1_ps(c.weight_decay)) {}
  __m512 direction(__m512 m, __m512 v, __m512 p) const {
    const __m512 denom = _mm512_add_ps(_mm512_sqrt_ps(_mm512_mul_ps(v, inv_c2)), eps);
    return _mm512_add_ps(_mm512_div_ps(_mm512_mul_ps(m, inv_c1), denom), _mm512_mul_ps(wd, p));
  }
};

// LAMB's moments of sixteen elements from the stored ones, as lamb_moments computes them.
template <int G>
struct Moments {
  __m512 scale, b1, nb1, b2, nb2;
  explicit Moments(const LambConstants& c)
      : scale(_mm512_set1_ps(c.grad_scale)),
        b1(_mm512_set1_ps(c.beta1)),
        nb1(_mm512_set1_ps(c.one_minus_beta1)),
        b2(_mm512_set1_ps(c.beta2)),
        nb2(_mm512_set1_ps(c.one_minus_beta2)) {}
  void next(const float* m, const float* v, const void* grad, std::size_t i, __m512& mi, __m512& vi) const {
    const __m512 g = _mm512_mul_ps(grad16<G>(grad, i), scale);
    mi = _mm512_add_ps(_mm512_mul_ps(b1, _mm512_loadu_ps(m + i)), _mm512_mul_ps(nb1, g));
    vi = _mm512_add_ps(_mm512_mul_ps(b2, _mm512_loadu_ps(v + i)), _mm512_mul_ps(_mm512_mul_ps(nb2, g), g));
  }
};

template <bool Out>
std::size_t lamb_apply_loop(float* master, const float* m, const float* v, float* out, std::size_t i, std::size_t end,
                            const LambConstants& c, float step) {
  const LambVec d(c);
  const __m512 s = _mm512_set1_ps(step);
  for (; i + 16 <= end; i += 16) {
    const __m512 p0 = _mm512_loadu_ps(master + i);
    const __m512 p =
        _mm512_sub_ps(p0, _mm512_mul_ps(s, d.direction(_mm512_loadu_ps(m + i), _mm512_loadu_ps(v + i), p0)));
    _mm512_storeu_ps(master + i, p);
    if constexpr (Out) _mm512_storeu_ps(out + i, p);
  }
  return i;
}

}  // namespace

std::size_t sgd_avx512(float* master, float* buf, const void* grad, int grad_code, float* out, std::size_t begin,
                       std::size_t end, const SgdKernel& k) {
  return by_grad(grad_code, [&]<int G>() {
    if (k.decay)
      return out != nullptr ? sgd_kind<G, true, true>(master, buf, grad, out, begin, end, k)
                            : sgd_kind<G, true, false>(master, buf, grad, out, begin, end, k);
    return out != nullptr ? sgd_kind<G, false, true>(master, buf, grad, out, begin, end, k)
                          : sgd_kind<G, false, false>(master, buf, grad, out, begin, end, k);
  });
}

std::size_t lamb_apply_avx512(float* master, const float* m, const float* v, float* out, std::size_t begin,
                              std::size_t end, const LambConstants& c, float step) {
  return out != nullptr ? lamb_apply_loop<true>(master, m, v, out, begin, end, c, step)
                        : lamb_apply_loop<false>(master, m, v, out, begin, end, c, step);
}

std::size_t lamb_moments_avx512(const float* master, float* m, float* v, const void* grad, int grad_code,
                                std::size_t begin, std::size_t end, const LambConstants& c, double* p_lanes,
                                double* u_lanes) {
  return by_grad(grad_code, [&]<int G>() {
    const LambVec d(c);
    const Moments<G> k(c);
    __m512d ps = _mm512_loadu_pd(p_lanes), us = _mm512_loadu_pd(u_lanes);
    std::size_t i = begin;
    for (; i + 16 <= end; i += 16) {
      __m512 mi, vi;
      k.next(m, v, grad, i, mi, vi);
      _mm512_storeu_ps(m + i, mi);
      _mm512_storeu_ps(v + i, vi);
      const __m512 p = _mm512_loadu_ps(master + i);
      ps = fold_squares(ps, p);
      us = fold_squares(us, d.direction(mi, vi, p));
    }
    _mm512_storeu_pd(p_lanes, ps);
    _mm512_storeu_pd(u_lanes, us);
    return i;
  });
}

}  // namespace zero::offload::detail
