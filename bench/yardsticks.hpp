// bench_host_optimizers' yardsticks (host_optimizers.cpp says what they measure): loops that
// move exactly the bytes a pass moves, R arrays only read and W arrays read and written, with an
// add and a multiply, AVX-512 where the CPU has it, on the library's static tiling
// (host_buffers.hpp), with or without software prefetch.
#pragma once

#include <immintrin.h>
#include <omp.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "host_buffers.hpp"

// The yardsticks add (sum of the read-only streams) x this factor, which is 0 at run time, to
// each array they write: they move the bytes a pass moves and leave the optimizer state as it
// was. External linkage keeps the compiler from assuming its value.
extern float yardstick_factor;

namespace zero::bench {

inline std::uintptr_t prefetch_ahead = 512;  // elements; set from the library in main
// Where read-only yardsticks leave their sums (one cache line per thread), so that the loads
// are not dead code.
struct alignas(64) Sink {
  float v = 0.0f;
};
inline Sink sinks[256];

inline const float* at(const float* base, std::uintptr_t elements) {
  return reinterpret_cast<const float*>(reinterpret_cast<std::uintptr_t>(base) + 4 * elements);
}

// ---- yardsticks: R arrays only read, W arrays read and written, over [b, e) ----

// Without AVX-512: plain loops, which the compiler vectorises for the baseline ISA (the read-only
// form stays scalar: float sums are not reassociated).
template <int R, int W, bool Prefetch>
void yard_portable(const float* const* ro, float* const* rw, std::size_t b, std::size_t e) {
  float acc = 0.0f;
  for (std::size_t i = b; i < e; ++i) {
    if constexpr (Prefetch) {
      if (i % 16 == 0) {
        for (int k = 0; k < R; ++k) __builtin_prefetch(at(ro[k], i + prefetch_ahead));
        for (int k = 0; k < W; ++k) __builtin_prefetch(at(rw[k], i + prefetch_ahead));
      }
    }
    float x = 0.0f;
    for (int k = 0; k < R; ++k) x += ro[k][i];
    if constexpr (W == 0) {
      acc += x;
    } else {
      for (int k = 0; k < W; ++k) rw[k][i] += x * yardstick_factor;
    }
  }
  if constexpr (W == 0) sinks[omp_get_thread_num() & 255].v += acc;
}

template <int R, int W, bool Prefetch>
__attribute__((target("avx512f"))) void yard_avx512(const float* const* ro_in, float* const* rw_in, std::size_t b,
                                                    std::size_t e) {
  const float* ro[R > 0 ? R : 1];
  float* rw[W > 0 ? W : 1];
  for (int k = 0; k < R; ++k) ro[k] = ro_in[k];
  for (int k = 0; k < W; ++k) rw[k] = rw_in[k];
  const __m512 f = _mm512_set1_ps(yardstick_factor);
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  std::size_t i = b;
  for (; i + 32 <= e; i += 32) {
    if constexpr (Prefetch) {
      for (int k = 0; k < R; ++k) {
        _mm_prefetch(reinterpret_cast<const char*>(at(ro[k], i + prefetch_ahead)), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(at(ro[k], i + 16 + prefetch_ahead)), _MM_HINT_T0);
      }
      for (int k = 0; k < W; ++k) {
        _mm_prefetch(reinterpret_cast<const char*>(at(rw[k], i + prefetch_ahead)), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(at(rw[k], i + 16 + prefetch_ahead)), _MM_HINT_T0);
      }
    }
    __m512 x0 = _mm512_setzero_ps(), x1 = _mm512_setzero_ps();
    for (int k = 0; k < R; ++k) {
      x0 = _mm512_add_ps(x0, _mm512_loadu_ps(ro[k] + i));
      x1 = _mm512_add_ps(x1, _mm512_loadu_ps(ro[k] + i + 16));
    }
    if constexpr (W == 0) {
      acc0 = _mm512_add_ps(acc0, x0);
      acc1 = _mm512_add_ps(acc1, x1);
    } else {
      x0 = _mm512_mul_ps(x0, f);
      x1 = _mm512_mul_ps(x1, f);
      for (int k = 0; k < W; ++k) {
        _mm512_storeu_ps(rw[k] + i, _mm512_add_ps(_mm512_loadu_ps(rw[k] + i), x0));
        _mm512_storeu_ps(rw[k] + i + 16, _mm512_add_ps(_mm512_loadu_ps(rw[k] + i + 16), x1));
      }
    }
  }
  yard_portable<R, W, false>(ro, rw, i, e);  // the tail
  if constexpr (W == 0) {
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, _mm512_add_ps(acc0, acc1));
    float sum = 0.0f;
    for (float l : lanes) sum += l;
    sinks[omp_get_thread_num() & 255].v += sum;
  }
}

inline bool use_avx512 = false;

// A yardstick for one pass: the given arrays over n elements on `threads` threads.
template <int R, int W>
std::function<void()> yardstick(std::vector<const float*> ro, std::vector<float*> rw, std::size_t n, int threads,
                                bool prefetch) {
  return [=] {
    tiles(n, threads, [&](std::size_t b, std::size_t e) {
      if (use_avx512) {
        prefetch ? yard_avx512<R, W, true>(ro.data(), rw.data(), b, e)
                 : yard_avx512<R, W, false>(ro.data(), rw.data(), b, e);
      } else {
        prefetch ? yard_portable<R, W, true>(ro.data(), rw.data(), b, e)
                 : yard_portable<R, W, false>(ro.data(), rw.data(), b, e);
      }
    });
  };
}

}  // namespace zero::bench
