// What the portable host optimizer kernels share: dtype checks, gradient loads and parameter
// stores in each dtype, and the OpenMP tiling. Included by portable translation units only (the
// ISA-specific kernels have their own: host_adam_kernels.hpp says why).
#pragma once

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "host_adam_kernels.hpp"
#include "host_simd_kernels.hpp"
#include "offload/host_optimizer.hpp"
#include "zero/dtype.hpp"
#include "zero/error.hpp"

namespace zero::offload {
namespace {

// Elements per OpenMP work item (128 KiB of each fp32 stream): large enough that scheduling costs
// nothing next to the memory traffic, small enough to spread a modest shard over many threads.
constexpr std::size_t kTile = std::size_t{1} << 15;

inline bool valid_dtype(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }

inline int elem_code(DType t) { return static_cast<int>(t); }

inline std::string describe(DType t) {
  return valid_dtype(t) ? std::string(dtype_name(t)) : fmt::format("invalid DType {}", static_cast<int>(t));
}

// Runs body(begin, end) over [0, n) in tiles. schedule(static) gives each thread one contiguous
// run of tiles, which keeps the hardware prefetchers on long sequential streams.
template <class Body>
void for_each_tile(std::size_t n, int threads, Body&& body) {
  const std::size_t tiles = (n + kTile - 1) / kTile;
  int nt = threads > 0 ? threads : omp_get_max_threads();
  nt = static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(std::max(nt, 1)), tiles));
  const auto count = static_cast<std::int64_t>(tiles);
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
  for (std::int64_t t = 0; t < count; ++t) {
    const std::size_t begin = static_cast<std::size_t>(t) * kTile;
    body(begin, std::min(n, begin + kTile));
  }
}

template <int G>
inline float load_grad(const void* g, std::size_t i) {
  if constexpr (G == detail::kF32) {
    return static_cast<const float*>(g)[i];
  } else if constexpr (G == detail::kBF16) {
    return bf16_bits_to_f32(static_cast<const std::uint16_t*>(g)[i]);
  } else {
    return f16_bits_to_f32(static_cast<const std::uint16_t*>(g)[i]);
  }
}

template <int O>
inline void store_param(void* out, std::size_t i, float p) {
  if constexpr (O == detail::kF32) {
    static_cast<float*>(out)[i] = p;
  } else if constexpr (O == detail::kBF16) {
    static_cast<std::uint16_t*>(out)[i] = f32_to_bf16_bits(p);
  } else if constexpr (O == detail::kF16) {
    static_cast<std::uint16_t*>(out)[i] = f32_to_f16_bits(p);
  }
}

inline void check_common(const void* master, const void* grad, DType grad_type, const void* param_out, DType param_type,
                         const char* who) {
  const std::string w(who);
  ZERO_CHECK(master != nullptr && grad != nullptr, w + ": master and grad must not be null for a non-empty step");
  ZERO_CHECK(valid_dtype(grad_type), w + ": unsupported gradient type (" + describe(grad_type) +
                                         "); pass DType::f32, DType::bf16 or DType::f16");
  ZERO_CHECK(param_out == nullptr || valid_dtype(param_type), w + ": unsupported parameter output type (" +
                                                                  describe(param_type) +
                                                                  "); pass DType::f32, DType::bf16 or DType::f16");
}

// Calls f.template operator()<G>() with G the element code of grad_type.
template <class F>
void with_grad_type(DType grad_type, F&& f) {
  switch (grad_type) {
    case DType::f32: return f.template operator()<detail::kF32>();
    case DType::bf16: return f.template operator()<detail::kBF16>();
    case DType::f16: return f.template operator()<detail::kF16>();
  }
}

// Calls f.template operator()<O>() with O the element code of the parameter output (kNone: null).
template <class F>
void with_param_type(const void* out, DType param_type, F&& f) {
  if (out == nullptr) return f.template operator()<detail::kNone>();
  switch (param_type) {
    case DType::f32: return f.template operator()<detail::kF32>();
    case DType::bf16: return f.template operator()<detail::kBF16>();
    case DType::f16: return f.template operator()<detail::kF16>();
  }
}

// Runs body(i, a, b) for i in [0, n) with a and b the lanes (at + i) mod kStatLanes of two folds:
// element at + i of a tensor always folds into the same lanes, in element order, however the
// tensor is cut into runs. The middle of the run goes kStatLanes elements at a time into local
// lanes, which vectorises. for_each_lane is the same for one fold.
template <class Body>
void for_each_lane2(std::int64_t at, std::size_t n, double* lanes_a, double* lanes_b, Body&& body) {
  auto lane = [&](std::size_t i) { return static_cast<int>((at + static_cast<std::int64_t>(i)) % kStatLanes); };
  std::size_t i = 0;
  for (; i < n && lane(i) != 0; ++i) body(i, lanes_a[lane(i)], lanes_b[lane(i)]);
  double a[kStatLanes], b[kStatLanes];
  for (int k = 0; k < kStatLanes; ++k) a[k] = lanes_a[k], b[k] = lanes_b[k];
  for (; i + kStatLanes <= n; i += kStatLanes)
    for (int k = 0; k < kStatLanes; ++k) body(i + static_cast<std::size_t>(k), a[k], b[k]);
  for (int k = 0; i < n; ++i, ++k) body(i, a[k], b[k]);
  for (int k = 0; k < kStatLanes; ++k) lanes_a[k] = a[k], lanes_b[k] = b[k];
}

template <class Body>
void for_each_lane(std::int64_t at, std::size_t n, double* lanes, Body&& body) {
  double unused[kStatLanes] = {};
  for_each_lane2(at, n, lanes, unused, [&](std::size_t i, double& a, double&) { body(i, a); });
}

// for_each_lane2 with a vector middle: after the elements before the first of lane 0,
// simd(i) folds from element i on (host_simd_kernels.hpp) and returns where it stopped; body
// does the rest. The lanes see the same elements in the same order as for_each_lane2's.
template <class Simd, class Body>
void for_each_lane2_simd(std::int64_t at, std::size_t n, double* lanes_a, double* lanes_b, Simd&& simd, Body&& body) {
  std::size_t i = 0;
  for (; i < n && (at + static_cast<std::int64_t>(i)) % kStatLanes != 0; ++i) {
    const auto k = static_cast<int>((at + static_cast<std::int64_t>(i)) % kStatLanes);
    body(i, lanes_a[k], lanes_b[k]);
  }
  if (i < n) i = simd(i);
  const std::size_t from = i;
  for_each_lane2(at + static_cast<std::int64_t>(from), n - from, lanes_a, lanes_b,
                 [&](std::size_t k, double& a, double& b) { body(from + k, a, b); });
}

template <class Simd, class Body>
void for_each_lane_simd(std::int64_t at, std::size_t n, double* lanes, Simd&& simd, Body&& body) {
  double unused[kStatLanes] = {};
  for_each_lane2_simd(at, n, lanes, unused, simd, [&](std::size_t i, double& a, double&) { body(i, a); });
}

// Runs seg(b, e, f) over the pieces of the run [0, n) of a tensor from element `at`, cut where
// the fold blocks begin (host_optimizer.hpp): each piece lies in one block, and seg folds its
// elements into f[0..F) (kStatLanes lanes each, continuing them). The pieces fold on all threads
// (one when nested, or for a run of one piece), each into lanes of its own, the first from the
// block the states left open; then they close into the states in block order. The states are
// those of host_optimizer.hpp (kStatFold doubles each). threads: 0 for the OpenMP default.
template <std::size_t F, class Seg>
void fold_blocks(std::int64_t at, std::size_t n, const std::array<double*, F>& states, Seg&& seg, int threads = 0) {
  if (n == 0) return;
  constexpr std::size_t L = kStatLanes, B = kFoldBlock;
  static_assert(B % L == 0);
  const std::size_t head = std::min(n, (B - static_cast<std::size_t>(at) % B) % B);
  const std::size_t pieces = (head > 0 ? 1 : 0) + (n - head + B - 1) / B;
  auto bounds = [&](std::size_t k) -> std::pair<std::size_t, std::size_t> {
    if (head > 0 && k == 0) return {0, head};
    const std::size_t b = head + (k - (head > 0 ? 1 : 0)) * B;
    return {b, std::min(n, b + B)};
  };
  // The block the slice left open: a run that begins a block closes it first; otherwise the run's
  // first piece continues it.
  std::vector<double> part(pieces * F * L, 0.0);
  for (std::size_t j = 0; j < F; ++j)
    for (std::size_t l = 0; l < L; ++l) {
      double* s = states[j];
      if (head == 0)
        s[l] += s[L + l];
      else
        part[j * L + l] = s[L + l];
      s[L + l] = 0.0;
    }
  const int nt = pieces > 1 && !omp_in_parallel() ? (threads > 0 ? threads : omp_get_max_threads()) : 1;
  const auto count = static_cast<std::int64_t>(pieces);
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
  for (std::int64_t k = 0; k < count; ++k) {
    const auto [b, e] = bounds(static_cast<std::size_t>(k));
    std::array<double*, F> f;
    for (std::size_t j = 0; j < F; ++j) f[j] = part.data() + (static_cast<std::size_t>(k) * F + j) * L;
    seg(b, e, f);
  }
  // Each piece that ends its block closes into the finished lanes; a last one that does not is
  // left open.
  for (std::size_t k = 0; k < pieces; ++k) {
    const bool closes = (static_cast<std::size_t>(at) + bounds(k).second) % B == 0;
    for (std::size_t j = 0; j < F; ++j)
      for (std::size_t l = 0; l < L; ++l) {
        const double x = part[(k * F + j) * L + l];
        if (closes)
          states[j][l] += x;
        else
          states[j][L + l] = x;
      }
  }
}

// True where the AVX-512 kernels of host_simd_kernels.hpp may run: an x86-64 build on a CPU
// with what the AVX-512 Adam path needs.
inline bool avx512_kernels() {
#if ZERO_OFFLOAD_X86
  static const bool yes = best_simd_path() == SimdPath::avx512;
  return yes;
#else
  return false;
#endif
}

// The lanes of x^2 over elements [b, e) of a run from tensor element `at` (a fold_blocks piece).
inline void square_lanes(const float* x, std::int64_t at, std::size_t b, std::size_t e, double* lanes) {
  const bool simd = avx512_kernels();
  const float* xb = x + b;
  auto vector = [&](std::size_t i) { return simd ? detail::square_fold_avx512(xb, i, e - b, lanes) : i; };
  for_each_lane_simd(at + static_cast<std::int64_t>(b), e - b, lanes, vector, [&](std::size_t i, double& s) {
    const double p = xb[i];
    s += p * p;
  });
}

// The fp32 parameter output for the AVX-512 kernels: null when there is none; the 16-bit
// outputs stay on the portable loops (simd_out says whether a kernel may take the run).
inline float* f32_out(void* out, int out_code) { return out_code == detail::kF32 ? static_cast<float*>(out) : nullptr; }
inline bool simd_out(int out_code) { return out_code == detail::kNone || out_code == detail::kF32; }

// Waits until `progress` (another thread's, published with release) reaches `target`.
template <class T>
void wait_until(const std::atomic<T>& progress, T target) {
  for (int spins = 0; progress.load(std::memory_order_acquire) < target; ++spins)
    if (spins >= 64) std::this_thread::yield();
}

// True when the OpenMP default allows two threads and a run of n is long enough to pay for them.
inline bool run_both_threads(std::size_t n) { return n >= kTile && omp_get_max_threads() >= 2 && !omp_in_parallel(); }

}  // namespace
}  // namespace zero::offload
