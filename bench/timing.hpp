// The benchmarks' clock and summary: wall seconds from a steady clock, and the median of a
// set of timings (robust to the odd slow repetition a shared machine produces).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <vector>

namespace zero::bench {

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n == 0 ? 0.0 : (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}

}  // namespace zero::bench
