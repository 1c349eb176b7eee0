// AVX-512 kernels of Adafactor: sixteen lanes of the portable loops in host_adafactor.cpp, the
// same operations in the same order (built with -ffp-contract=off), and the matrix sums eight
// rows at a time.
#include "host_avx512_util.hpp"

namespace zero::offload::detail {
namespace {

template <int G, bool Factored, bool Moment, bool Out>
std::size_t apply_loop(float* master, const float* v, float* m1, const void* grad, float* out, std::size_t i,
                       std::size_t end, float rf, const float* cf, const AdafactorApply& a) {
  const std::size_t seg = i;
  const __m512 gs = _mm512_set1_ps(a.grad_scale), scale = _mm512_set1_ps(a.scale), row = _mm512_set1_ps(rf);
  const __m512 decay = _mm512_set1_ps(a.neg_decay), b1 = _mm512_set1_ps(a.beta1),
               nb1 = _mm512_set1_ps(a.one_minus_beta1);
  for (; i + 16 <= end; i += 16) {
    const __m512 g = _mm512_mul_ps(grad16<G>(grad, i), gs);
    __m512 u = Factored ? _mm512_mul_ps(_mm512_mul_ps(g, row), _mm512_loadu_ps(cf + (i - seg)))
                        : _mm512_div_ps(g, _mm512_sqrt_ps(_mm512_loadu_ps(v + i)));
    u = _mm512_mul_ps(u, scale);
    if constexpr (Moment) {
      u = _mm512_add_ps(_mm512_mul_ps(b1, _mm512_loadu_ps(m1 + i)), _mm512_mul_ps(nb1, u));
      _mm512_storeu_ps(m1 + i, u);
    }
    __m512 p = _mm512_loadu_ps(master + i);
    p = _mm512_add_ps(p, _mm512_mul_ps(decay, p));
    p = _mm512_sub_ps(p, u);
    _mm512_storeu_ps(master + i, p);
    if constexpr (Out) _mm512_storeu_ps(out + i, p);
  }
  return i;
}

template <int G, bool Factored>
std::size_t apply_cases(float* master, const float* v, float* m1, const void* grad, float* out, std::size_t b,
                        std::size_t e, float rf, const float* cf, const AdafactorApply& a) {
  if (a.first_moment)
    return out != nullptr ? apply_loop<G, Factored, true, true>(master, v, m1, grad, out, b, e, rf, cf, a)
                          : apply_loop<G, Factored, true, false>(master, v, m1, grad, out, b, e, rf, cf, a);
  return out != nullptr ? apply_loop<G, Factored, false, true>(master, v, m1, grad, out, b, e, rf, cf, a)
                        : apply_loop<G, Factored, false, false>(master, v, m1, grad, out, b, e, rf, cf, a);
}

// Transposes eight rows of eight doubles in place: afterwards x[j] holds column j.
inline void transpose8(__m512d x[8]) {
  __m512d t[8];
  for (int k = 0; k < 8; k += 2) {
    t[k] = _mm512_unpacklo_pd(x[k], x[k + 1]);      // columns 0, 2, 4, 6 of rows k, k+1
    t[k + 1] = _mm512_unpackhi_pd(x[k], x[k + 1]);  // columns 1, 3, 5, 7
  }
  // Four rows of columns j and j + 4: pairs from t[k] and t[k + 2].
  const __m512i even = _mm512_set_epi64(13, 12, 5, 4, 9, 8, 1, 0);
  const __m512i odd = _mm512_set_epi64(15, 14, 7, 6, 11, 10, 3, 2);
  __m512d q[8];
  for (int h = 0; h < 2; ++h) {
    const int k = 4 * h;
    q[k] = _mm512_permutex2var_pd(t[k], even, t[k + 2]);          // columns 0 | 4
    q[k + 1] = _mm512_permutex2var_pd(t[k], odd, t[k + 2]);       // columns 2 | 6
    q[k + 2] = _mm512_permutex2var_pd(t[k + 1], even, t[k + 3]);  // columns 1 | 5
    q[k + 3] = _mm512_permutex2var_pd(t[k + 1], odd, t[k + 3]);   // columns 3 | 7
  }
  // Rows 0-3 from q[0..3], rows 4-7 from q[4..7]: the low halves give columns 0-3, the high 4-7.
  const int column[4] = {0, 2, 1, 3};
  for (int k = 0; k < 4; ++k) {
    x[column[k]] = _mm512_shuffle_f64x2(q[k], q[k + 4], 0x44);
    x[column[k] + 4] = _mm512_shuffle_f64x2(q[k], q[k + 4], 0xee);
  }
}

// Eight whole rows from `first`, columns [c0, c1): s = g^2 + eps1 in double; each column adds
// the eight rows in row order, each row its columns in column order (a transposed block of
// eight columns per step, so the eight row chains advance together).
template <int G>
void eight_rows(const void* grad, std::size_t first, std::size_t c0, std::size_t c1, std::size_t cols, float grad_scale,
                float eps1, double* rows, double* col_sums) {
  const __m256 gs = _mm256_set1_ps(grad_scale);
  const __m512d eps = _mm512_set1_pd(static_cast<double>(eps1));
  __m512d row_acc = _mm512_loadu_pd(rows);
  std::size_t c = c0;
  for (; c + 8 <= c1; c += 8) {
    __m512d s[8];
    __m512d col = _mm512_loadu_pd(col_sums + c);
    for (int k = 0; k < 8; ++k) {
      const std::size_t at = first + static_cast<std::size_t>(k) * cols + c;
      __m256 g;
      if constexpr (G == kF32) {
        g = _mm256_loadu_ps(static_cast<const float*>(grad) + at);
      } else {
        const auto* h = reinterpret_cast<const __m128i*>(static_cast<const std::uint16_t*>(grad) + at);
        const __m128i bits = _mm_loadu_si128(h);
        g = G == kBF16 ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16))
                       : _mm256_cvtph_ps(bits);
      }
      const __m512d d = _mm512_cvtps_pd(_mm256_mul_ps(g, gs));
      s[k] = _mm512_add_pd(_mm512_mul_pd(d, d), eps);
      col = _mm512_add_pd(col, s[k]);
    }
    _mm512_storeu_pd(col_sums + c, col);
    transpose8(s);
    for (int j = 0; j < 8; ++j) row_acc = _mm512_add_pd(row_acc, s[j]);
  }
  _mm512_storeu_pd(rows, row_acc);
  // Columns past the last group of eight: row by row, each row's in column order.
  for (int k = 0; k < 8 && c < c1; ++k)
    for (std::size_t j = c; j < c1; ++j) {
      const std::size_t at = first + static_cast<std::size_t>(k) * cols + j;
      float x;
      if constexpr (G == kF32) {
        x = static_cast<const float*>(grad)[at];
      } else {
        alignas(32) float one[8];
        const __m128i bits = _mm_cvtsi32_si128(static_cast<const std::uint16_t*>(grad)[at]);
        _mm256_store_ps(one, G == kBF16 ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16))
                                        : _mm256_cvtph_ps(bits));
        x = one[0];
      }
      const float g = x * grad_scale;
      const double sq = static_cast<double>(g) * g + eps1;
      rows[k] += sq;
      col_sums[j] += sq;
    }
}

}  // namespace

std::size_t adafactor_apply_avx512(float* master, const float* v, float* m1, const void* grad, int grad_code,
                                   float* out, std::size_t begin, std::size_t end, float rf, const float* cf,
                                   const AdafactorApply& a) {
  return by_grad(grad_code, [&]<int G>() {
    return cf != nullptr ? apply_cases<G, true>(master, v, m1, grad, out, begin, end, rf, cf, a)
                         : apply_cases<G, false>(master, v, m1, grad, out, begin, end, rf, cf, a);
  });
}

std::size_t adafactor_vector_avx512(float* v, const void* grad, int grad_code, std::size_t begin, std::size_t end,
                                    const AdafactorConstants& c, double* u_lanes) {
  return by_grad(grad_code, [&]<int G>() {
    const __m512 gs = _mm512_set1_ps(c.grad_scale), b2 = _mm512_set1_ps(c.beta2t),
                 nb2 = _mm512_set1_ps(c.one_minus_beta2t), eps = _mm512_set1_ps(c.eps1);
    __m512d us = _mm512_loadu_pd(u_lanes);
    std::size_t i = begin;
    for (; i + 16 <= end; i += 16) {
      const __m512 g = _mm512_mul_ps(grad16<G>(grad, i), gs);
      const __m512 s = _mm512_add_ps(_mm512_mul_ps(g, g), eps);
      const __m512 vi = _mm512_add_ps(_mm512_mul_ps(b2, _mm512_loadu_ps(v + i)), _mm512_mul_ps(nb2, s));
      _mm512_storeu_ps(v + i, vi);
      us = fold_squares(us, _mm512_div_ps(g, _mm512_sqrt_ps(vi)));
    }
    _mm512_storeu_pd(u_lanes, us);
    return i;
  });
}

std::size_t square_fold_avx512(const float* x, std::size_t begin, std::size_t end, double* lanes) {
  __m512d acc = _mm512_loadu_pd(lanes);
  std::size_t i = begin;
  for (; i + 16 <= end; i += 16) acc = fold_squares(acc, _mm512_loadu_ps(x + i));
  _mm512_storeu_pd(lanes, acc);
  return i;
}

std::size_t matrix_rms_avx512(const void* grad, int grad_code, std::size_t begin, std::size_t end, float grad_scale,
                              float rf, const float* cf, double* u_lanes) {
  return by_grad(grad_code, [&]<int G>() {
    const __m512 gs = _mm512_set1_ps(grad_scale), row = _mm512_set1_ps(rf);
    __m512d us = _mm512_loadu_pd(u_lanes);
    std::size_t i = begin;
    for (; i + 16 <= end; i += 16) {
      const __m512 g = _mm512_mul_ps(grad16<G>(grad, i), gs);
      us = fold_squares(us, _mm512_mul_ps(_mm512_mul_ps(g, row), _mm512_loadu_ps(cf + (i - begin))));
    }
    _mm512_storeu_pd(u_lanes, us);
    return i;
  });
}

void matrix_sums_avx512(const void* grad, int grad_code, std::size_t begin, std::int64_t rows, std::int64_t cols,
                        std::int64_t c0, std::int64_t c1, float grad_scale, float eps1, double* row_sums,
                        double* col_sums) {
  const auto c = static_cast<std::size_t>(cols);
  by_grad(grad_code, [&]<int G>() {
    for (std::int64_t r = 0; r + 8 <= rows; r += 8)
      eight_rows<G>(grad, begin + static_cast<std::size_t>(r) * c, static_cast<std::size_t>(c0),
                    static_cast<std::size_t>(c1), c, grad_scale, eps1, row_sums + r, col_sums);
    return std::size_t{0};
  });
}

}  // namespace zero::offload::detail
