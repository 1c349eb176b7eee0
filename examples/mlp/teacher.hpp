// The MLP examples' task: a two-layer student learns a fixed random "teacher" network. Shared by
// zero-mlp (mlp.cpp) and zero-mlp-tensor-parallel (mlp_tensor_parallel.cpp), so both train the
// same model on the same samples: every value is a pure function of its place, the same on
// every rank and at every split.
#pragma once

#include <cmath>
#include <cstdint>

namespace mlp {

constexpr int kIn = 32, kHidden = 128, kOut = 8;

// Deterministic pseudo-random value in [-1, 1) from two integers.
inline float noise(std::uint64_t a, std::uint64_t b) {
  std::uint64_t x = (a + 1) * 0x9E3779B97F4A7C15ull ^ (b * 0xD1B54A32D192ED03ull);
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  return static_cast<float>(static_cast<double>(x >> 11) * 0x1p-53 * 2.0 - 1.0);
}

// Sample `id`: input x and the teacher's output y = tanh-layer of x with fixed weights.
inline void sample(std::int64_t id, float* x, float* y) {
  for (int i = 0; i < kIn; ++i) x[i] = noise(static_cast<std::uint64_t>(id), static_cast<std::uint64_t>(i));
  for (int o = 0; o < kOut; ++o) {
    float s = 0;
    for (int i = 0; i < kIn; ++i)
      s += noise(1000 + static_cast<std::uint64_t>(o), static_cast<std::uint64_t>(i)) * x[i];
    y[o] = std::tanh(s * 0.5f);
  }
}

// The student's initial value of element k of a whole tensor: layer `unit` (0: fc1 [kHidden, kIn]
// and its bias, 1: fc2 [kOut, kHidden] and its bias), its weight or its bias (zero).
inline float initial_value(int unit, bool weight, std::int64_t k) {
  const bool first = unit == 0;
  const std::int64_t whole_offset =
      first && !weight ? std::int64_t{kHidden} * kIn : (weight ? 0 : std::int64_t{kOut} * kHidden);
  const auto stream = static_cast<std::uint64_t>(unit) * 1000 + static_cast<std::uint64_t>(whole_offset);
  const float scale = weight ? 1.0f / std::sqrt(static_cast<float>(first ? kIn : kHidden)) : 0.0f;
  return scale * noise(7 + stream, static_cast<std::uint64_t>(k));
}

}  // namespace mlp
