// What the host optimizer benchmarks share: cache-line-aligned arrays and the library's OpenMP
// tiling (offload/src/host_kernel_util.hpp: 32768-element tiles, static schedule), so that their
// yardstick loops are threaded exactly as the kernels they measure.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace zero::bench {

constexpr std::size_t kTile = std::size_t{1} << 15;

// n elements of T, 64-byte aligned, uninitialised; exits the benchmark when memory runs out.
template <class T>
struct Array {
  T* p = nullptr;
  std::size_t n = 0;
  explicit Array(std::size_t count) : n(count) {
    const std::size_t bytes = std::max<std::size_t>(1, n) * sizeof(T);
    if (posix_memalign(reinterpret_cast<void**>(&p), 64, bytes) != 0) {
      std::fprintf(stderr, "out of memory allocating %zu bytes\n", bytes);
      std::exit(1);
    }
  }
  ~Array() { std::free(p); }
  Array(const Array&) = delete;
  Array& operator=(const Array&) = delete;
};

// body(begin, end) over [0, n) in kTile tiles on `threads` OpenMP threads, as the library tiles.
template <class Body>
void tiles(std::size_t n, int threads, Body&& body) {
  const auto count = static_cast<std::int64_t>((n + kTile - 1) / kTile);
#pragma omp parallel for schedule(static) num_threads(threads)
  for (std::int64_t t = 0; t < count; ++t) {
    const std::size_t b = static_cast<std::size_t>(t) * kTile;
    body(b, std::min(n, b + kTile));
  }
}

}  // namespace zero::bench
