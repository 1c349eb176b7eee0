// What the AVX-512 kernels of SGD, LAMB and Adafactor share: sixteen gradients in fp32 from
// any gradient type, and the lane fold of sixteen squares. Included only by translation units
// built with the AVX-512 flags; everything here has internal linkage (host_simd_kernels.hpp
// says why).
#pragma once

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC bug 105593 in AVX-512 intrinsics
#endif
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "host_adam_kernels.hpp"  // the element codes
#include "host_simd_kernels.hpp"

namespace zero::offload::detail {
namespace {

// Sixteen gradients from element i, widened to fp32 exactly (bf16: the bits moved up; fp16:
// the conversion instruction, exact for every non-NaN value).
template <int G>
inline __m512 grad16(const void* grad, std::size_t i) {
  if constexpr (G == kF32) {
    return _mm512_loadu_ps(static_cast<const float*>(grad) + i);
  } else {
    const auto* h = reinterpret_cast<const __m256i*>(static_cast<const std::uint16_t*>(grad) + i);
    const __m256i bits = _mm256_loadu_si256(h);
    if constexpr (G == kBF16) {
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
    } else {
      return _mm512_cvtph_ps(bits);
    }
  }
}

// The low and high eight floats of x, each widened to double.
inline __m512d low_pd(__m512 x) { return _mm512_cvtps_pd(_mm512_castps512_ps256(x)); }
inline __m512d high_pd(__m512 x) {
  return _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
}

// Folds the squares of sixteen floats (in double, exact) into eight lanes: the first eight
// elements, then the next eight, as the scalar fold visits them.
inline __m512d fold_squares(__m512d lanes, __m512 x) {
  const __m512d lo = low_pd(x), hi = high_pd(x);
  lanes = _mm512_add_pd(lanes, _mm512_mul_pd(lo, lo));
  return _mm512_add_pd(lanes, _mm512_mul_pd(hi, hi));
}

// Calls f.template operator()<G>() for the gradient's element code.
template <class F>
inline std::size_t by_grad(int grad_code, F&& f) {
  if (grad_code == kBF16) return f.template operator()<kBF16>();
  if (grad_code == kF16) return f.template operator()<kF16>();
  return f.template operator()<kF32>();
}

}  // namespace
}  // namespace zero::offload::detail
