// AVX-512 Adam kernel: 16 lanes of the scalar reference in host_adam.cpp, same operations in the
// same order. The tail (n not a multiple of 16) runs the same vector code under a lane mask, so
// there is no second code path for the last elements.
//
// Compiled with -mavx512f -mavx512bw -mavx512vl -mfma -mf16c -ffp-contract=off. Everything except
// the exported entry point has internal linkage, and no library templates are used, so no
// AVX-512 instruction can leak into code that runs on other CPUs.
// GCC 12's AVX-512 intrinsics initialise their "undefined" pass-through operands with
// themselves, which -Wmaybe-uninitialized reports once they are inlined (GCC bug 105593).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "host_adam_kernels.hpp"

namespace zero::offload::detail {
namespace {

struct Vec {
  __m512 grad_scale, weight_decay, decay, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, neg_step_size,
      inv_sqrt_bias_c2;
  bool l2, decoupled;
  std::size_t prefetch;  // software prefetch distance, elements (prefetch_elements())
};

template <bool Masked>
inline __m512 load_f32(const float* p, __mmask16 k) {
  if constexpr (Masked) {
    return _mm512_maskz_loadu_ps(k, p);
  } else {
    return _mm512_loadu_ps(p);
  }
}

template <bool Masked>
inline void store_f32(float* p, __mmask16 k, __m512 x) {
  if constexpr (Masked) {
    _mm512_mask_storeu_ps(p, k, x);
  } else {
    _mm512_storeu_ps(p, x);
  }
}

template <bool Masked>
inline __m256i load_u16(const std::uint16_t* p, __mmask16 k) {
  if constexpr (Masked) {
    return _mm256_maskz_loadu_epi16(k, p);
  } else {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  }
}

template <bool Masked>
inline void store_u16(std::uint16_t* p, __mmask16 k, __m256i x) {
  if constexpr (Masked) {
    _mm256_mask_storeu_epi16(p, k, x);
  } else {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), x);
  }
}

template <int G, bool Masked>
inline __m512 load_grad(const void* grad, std::size_t i, __mmask16 k) {
  if constexpr (G == kF32) {
    return load_f32<Masked>(static_cast<const float*>(grad) + i, k);
  } else {
    const __m256i h = load_u16<Masked>(static_cast<const std::uint16_t*>(grad) + i, k);
    if constexpr (G == kBF16) {
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    } else {
      return _mm512_cvtph_ps(h);
    }
  }
}

// fp32 -> bf16 bits with round-to-nearest-even on the integer representation, NaN kept quiet:
// the same three cases as zero::f32_to_bf16_bits. (The AVX512-BF16 instruction is not used: it
// flushes subnormal inputs to zero, which the scalar conversion does not.)
inline __m256i to_bf16(__m512 p) {
  const __m512i u = _mm512_castps_si512(p);
  const __m512i hi = _mm512_srli_epi32(u, 16);
  const __m512i bias = _mm512_add_epi32(_mm512_and_si512(hi, _mm512_set1_epi32(1)), _mm512_set1_epi32(0x7fff));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
  const __mmask16 nan =
      _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  const __m512i quiet = _mm512_or_si512(hi, _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet));
}

// fp32 -> fp16 bits. vcvtps2ph with an explicit round-to-nearest-even immediate matches the
// scalar conversion for every finite, infinite and subnormal value; only NaN payloads differ
// (the instruction keeps payload bits), so NaN lanes are replaced by sign | 0x7e00 as in
// zero::f32_to_f16_bits.
inline __m256i to_fp16(__m512 p) {
  const __m256i h = _mm512_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __mmask16 nan = _mm512_cmp_ps_mask(p, p, _CMP_UNORD_Q);
  const __m256i quiet =
      _mm256_or_si256(_mm256_and_si256(h, _mm256_set1_epi16(static_cast<short>(0x8000))), _mm256_set1_epi16(0x7e00));
  return _mm256_mask_blend_epi16(nan, h, quiet);
}

template <int O, bool Masked>
inline void store_param(void* out, std::size_t i, __mmask16 k, __m512 p) {
  if constexpr (O == kF32) {
    store_f32<Masked>(static_cast<float*>(out) + i, k, p);
  } else if constexpr (O == kBF16) {
    store_u16<Masked>(static_cast<std::uint16_t*>(out) + i, k, to_bf16(p));
  } else if constexpr (O == kF16) {
    store_u16<Masked>(static_cast<std::uint16_t*>(out) + i, k, to_fp16(p));
  }
}

template <int G, int O, bool Masked>
inline void step16(float* master, float* m, float* v, const void* grad, void* out, std::size_t i, __mmask16 k,
                   const Vec& c) {
  __m512 p = load_f32<Masked>(master + i, k);
  __m512 g = _mm512_mul_ps(load_grad<G, Masked>(grad, i, k), c.grad_scale);
  if (c.l2) g = _mm512_fmadd_ps(c.weight_decay, p, g);
  if (c.decoupled) p = _mm512_mul_ps(p, c.decay);
  const __m512 mi = _mm512_fmadd_ps(c.beta1, load_f32<Masked>(m + i, k), _mm512_mul_ps(c.one_minus_beta1, g));
  const __m512 vi =
      _mm512_fmadd_ps(c.beta2, load_f32<Masked>(v + i, k), _mm512_mul_ps(_mm512_mul_ps(c.one_minus_beta2, g), g));
  const __m512 denom = _mm512_fmadd_ps(_mm512_sqrt_ps(vi), c.inv_sqrt_bias_c2, c.eps);
  p = _mm512_fmadd_ps(c.neg_step_size, _mm512_div_ps(mi, denom), p);
  store_f32<Masked>(m + i, k, mi);
  store_f32<Masked>(v + i, k, vi);
  store_f32<Masked>(master + i, k, p);
  store_param<O, Masked>(out, i, k, p);
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
    step16<G, O, false>(master, m, v, grad, out, i, 0xffff, c);
  }
  if (i < end) {
    const auto k = static_cast<__mmask16>((1u << (end - i)) - 1u);
    step16<G, O, true>(master, m, v, grad, out, i, k, c);
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

void adam_range_avx512(float* master, float* m, float* v, const void* grad, int grad_code, void* out, int out_code,
                       std::size_t begin, std::size_t end, const AdamConstants& s, std::size_t prefetch) {
  const Vec c{_mm512_set1_ps(s.grad_scale),
              _mm512_set1_ps(s.weight_decay),
              _mm512_set1_ps(s.decay),
              _mm512_set1_ps(s.beta1),
              _mm512_set1_ps(s.one_minus_beta1),
              _mm512_set1_ps(s.beta2),
              _mm512_set1_ps(s.one_minus_beta2),
              _mm512_set1_ps(s.eps),
              _mm512_set1_ps(s.neg_step_size),
              _mm512_set1_ps(s.inv_sqrt_bias_c2),
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
