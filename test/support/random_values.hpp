// Uniform random floats for the host kernel tests: n values in [lo, hi) from a seeded generator.
#pragma once

#include <cstddef>
#include <random>
#include <vector>

namespace zero::test {

inline std::vector<float> random_values(std::size_t n, unsigned seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

}  // namespace zero::test
