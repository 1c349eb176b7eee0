// AVX2 Adam kernel: 8 lanes of the scalar reference in host_adam.cpp, same operations in the same
// order. AVX2 has no 16-bit masked loads, so the tail (fewer than 8 elements) is copied into
// zero-padded stack vectors, stepped by the same vector code and copied back.
//
// Compiled with -mavx2 -mfma -mf16c -ffp-contract=off. Everything except the exported entry point
// has internal linkage and no library templates are used (see host_adam_kernels.hpp).
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "host_adam_kernels.hpp"

namespace zero::offload::detail {
namespace {

struct Vec {
  __m256 grad_scale, weight_decay, decay, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, neg_step_size,
      inv_sqrt_bias_c2;
  bool l2, decoupled;
  std::size_t prefetch;  // software prefetch distance, elements (prefetch_elements())
};

inline __m128i load_u16x8(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }

template <int G>
inline __m256 load_grad(const void* grad, std::size_t i) {
  if constexpr (G == kF32) {
    return _mm256_loadu_ps(static_cast<const float*>(grad) + i);
  } else if constexpr (G == kBF16) {
    const __m128i h = load_u16x8(static_cast<const std::uint16_t*>(grad) + i);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  } else {
    return _mm256_cvtph_ps(load_u16x8(static_cast<const std::uint16_t*>(grad) + i));
  }
}

// Narrows 8 x 32-bit lanes holding values <= 0xffff to 8 x 16-bit, in order.
inline __m128i narrow(__m256i x) { return _mm_packus_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1)); }

// Same rounding and NaN rule as zero::f32_to_bf16_bits (see the AVX-512 kernel).
inline __m128i to_bf16(__m256 p) {
  const __m256i u = _mm256_castps_si256(p);
  const __m256i hi = _mm256_srli_epi32(u, 16);
  const __m256i bias = _mm256_add_epi32(_mm256_and_si256(hi, _mm256_set1_epi32(1)), _mm256_set1_epi32(0x7fff));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
  // Signed compare is safe: both sides have the sign bit clear.
  const __m256i nan =
      _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
  const __m256i quiet = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
  return narrow(_mm256_blendv_epi8(rounded, quiet, nan));
}

// vcvtps2ph rounds to nearest even like zero::f32_to_f16_bits; NaN lanes get sign | 0x7e00.
inline __m128i to_fp16(__m256 p) {
  const __m128i h = _mm256_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT);
  const __m256i nan32 = _mm256_castps_si256(_mm256_cmp_ps(p, p, _CMP_UNORD_Q));
  const __m128i nan16 = _mm_packs_epi32(_mm256_castsi256_si128(nan32), _mm256_extracti128_si256(nan32, 1));
  const __m128i quiet =
      _mm_or_si128(_mm_and_si128(h, _mm_set1_epi16(static_cast<short>(0x8000))), _mm_set1_epi16(0x7e00));
  return _mm_blendv_epi8(h, quiet, nan16);
}

template <int O>
inline void store_param(void* out, std::size_t i, __m256 p) {
  if constexpr (O == kF32) {
    _mm256_storeu_ps(static_cast<float*>(out) + i, p);
  } else if constexpr (O == kBF16) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<std::uint16_t*>(out) + i), to_bf16(p));
  } else if constexpr (O == kF16) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<std::uint16_t*>(out) + i), to_fp16(p));
  }
}

template <int G, int O>
inline void step8(float* master, float* m, float* v, const void* grad, void* out, std::size_t i, const Vec& c) {
  __m256 p = _mm256_loadu_ps(master + i);
  __m256 g = _mm256_mul_ps(load_grad<G>(grad, i), c.grad_scale);
  if (c.l2) g = _mm256_fmadd_ps(c.weight_decay, p, g);
  if (c.decoupled) p = _mm256_mul_ps(p, c.decay);
  const __m256 mi = _mm256_fmadd_ps(c.beta1, _mm256_loadu_ps(m + i), _mm256_mul_ps(c.one_minus_beta1, g));
  const __m256 vi =
      _mm256_fmadd_ps(c.beta2, _mm256_loadu_ps(v + i), _mm256_mul_ps(_mm256_mul_ps(c.one_minus_beta2, g), g));
  const __m256 denom = _mm256_fmadd_ps(_mm256_sqrt_ps(vi), c.inv_sqrt_bias_c2, c.eps);
  p = _mm256_fmadd_ps(c.neg_step_size, _mm256_div_ps(mi, denom), p);
  _mm256_storeu_ps(m + i, mi);
  _mm256_storeu_ps(v + i, vi);
  _mm256_storeu_ps(master + i, p);
  store_param<O>(out, i, p);
}

// One cache line of each stream, `ahead` elements ahead (see host_adam_kernels.hpp).
template <int G>
inline void prefetch_ahead(const float* master, const float* m, const float* v, const void* grad, std::size_t i,
                           std::size_t ahead) {
  // Addresses are formed as integers: they may lie past the end of the arrays, where a
  // prefetch is harmless but pointer arithmetic would not be.
  const std::uintptr_t j = i + ahead;
  const std::uintptr_t gsize = G == kF32 ? 4 : 2;
  _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<std::uintptr_t>(master) + 4 * j), _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<std::uintptr_t>(m) + 4 * j), _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<std::uintptr_t>(v) + 4 * j), _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<std::uintptr_t>(grad) + gsize * j), _MM_HINT_T0);
}

template <int G, int O>
void range(float* master, float* m, float* v, const void* grad, void* out, std::size_t begin, std::size_t end,
           const Vec& c) {
  std::size_t i = begin;
  for (; i + 16 <= end; i += 16) {
    prefetch_ahead<G>(master, m, v, grad, i, c.prefetch);
    step8<G, O>(master, m, v, grad, out, i, c);
    step8<G, O>(master, m, v, grad, out, i + 8, c);
  }
  for (; i + 8 <= end; i += 8) step8<G, O>(master, m, v, grad, out, i, c);
  if (i == end) return;
  const std::size_t r = end - i;
  const std::size_t gsize = G == kF32 ? 4 : 2;
  const std::size_t osize = O == kF32 ? 4 : 2;
  alignas(32) float tp[8] = {}, tm[8] = {}, tv[8] = {};
  alignas(32) unsigned char tg[32] = {}, to[32] = {};
  std::memcpy(tp, master + i, r * 4);
  std::memcpy(tm, m + i, r * 4);
  std::memcpy(tv, v + i, r * 4);
  std::memcpy(tg, static_cast<const unsigned char*>(grad) + i * gsize, r * gsize);
  step8<G, O>(tp, tm, tv, tg, to, 0, c);
  std::memcpy(master + i, tp, r * 4);
  std::memcpy(m + i, tm, r * 4);
  std::memcpy(v + i, tv, r * 4);
  if constexpr (O != kNone) {
    std::memcpy(static_cast<unsigned char*>(out) + i * osize, to, r * osize);
  }
}

template <int G>
void range_out(float* master, float* m, float* v, const void* grad, void* out, int oc, std::size_t b, std::size_t e,
               const Vec& c) {
  switch (oc) {
    case kF32: return range<G, kF32>(master, m, v, grad, out, b, e, c);
    case kBF16: return range<G, kBF16>(master, m, v, grad, out, b, e, c);
    case kF16: return range<G, kF16>(master, m, v, grad, out, b, e, c);
    default: return range<G, kNone>(master, m, v, grad, out, b, e, c);
  }
}

}  // namespace

void adam_range_avx2(float* master, float* m, float* v, const void* grad, int grad_code, void* out, int out_code,
                     std::size_t begin, std::size_t end, const AdamConstants& s, std::size_t prefetch) {
  const Vec c{_mm256_set1_ps(s.grad_scale),
              _mm256_set1_ps(s.weight_decay),
              _mm256_set1_ps(s.decay),
              _mm256_set1_ps(s.beta1),
              _mm256_set1_ps(s.one_minus_beta1),
              _mm256_set1_ps(s.beta2),
              _mm256_set1_ps(s.one_minus_beta2),
              _mm256_set1_ps(s.eps),
              _mm256_set1_ps(s.neg_step_size),
              _mm256_set1_ps(s.inv_sqrt_bias_c2),
              s.l2,
              s.decoupled,
              prefetch};
  switch (grad_code) {
    case kF32: return range_out<kF32>(master, m, v, grad, out, out_code, begin, end, c);
    case kBF16: return range_out<kBF16>(master, m, v, grad, out, out_code, begin, end, c);
    default: return range_out<kF16>(master, m, v, grad, out, out_code, begin, end, c);
  }
}

}  // namespace zero::offload::detail
