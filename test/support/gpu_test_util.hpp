// Helpers shared by the GPU tests: backends from a config string, device buffers filled from
// and read back to host vectors, random data with the special values (inf, nan, subnormals,
// rounding ties) that numerical kernels get wrong, and bitwise comparison that treats any two
// NaNs as equal (NaN payloads follow each machine's own rules; everything else must match).
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "zero/config.hpp"
#include "zero/context.hpp"
#include "zero/dtype.hpp"

namespace zero::gputest {

inline Context& ctx() { return *Context::current(); }

// The communicator the multi-rank tests run over (ctest sets ZERO_TEST_COMM per entry).
inline std::string test_comm() {
  const char* c = std::getenv("ZERO_TEST_COMM");
  return c && *c ? c : "mpi";
}

// Small sizes under compute-sanitizer (ZERO_TEST_SMALL=1), which runs kernels much slower.
inline bool small_run() { return std::getenv("ZERO_TEST_SMALL") != nullptr; }

inline std::unique_ptr<Backend> backend(const std::string& kind, const std::string& comm = "mpi") {
  std::string y = "backend: " + kind + "\n";
  if (kind == "cuda") y += "comm: " + comm + "\n";
  Config c = parse_config(y, "gpu-test");
  c.resolve(ctx().world_size());
  return make_backend(ctx(), c);
}

// Device (or host-backend) memory holding a copy of `v`.
template <class T>
Buffer upload(Backend& b, const std::vector<T>& v) {
  Buffer buf = b.alloc(v.size() * sizeof(T));
  b.from_host(buf.get(), v.data(), v.size() * sizeof(T));
  return buf;
}
template <class T>
std::vector<T> download(Backend& b, const Buffer& buf, std::size_t n) {
  std::vector<T> v(n);
  b.to_host(v.data(), buf.get(), n * sizeof(T));
  return v;
}

// n floats: mostly N(0, scale), with a sprinkling of the values kernels mishandle when asked.
inline std::vector<float> random_floats(std::size_t n, std::uint64_t seed, float scale = 1.0f, bool specials = true) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::uniform_int_distribution<int> pick(0, 199);
  const float inf = std::numeric_limits<float>::infinity();
  const float specials_list[] = {inf,
                                 -inf,
                                 std::numeric_limits<float>::quiet_NaN(),
                                 0.0f,
                                 -0.0f,
                                 1e-40f /* subnormal */,
                                 -3e-39f,
                                 65504.0f,
                                 65520.0f /* f16 overflow */,
                                 3.0e38f,
                                 1.0009765625f /* f16 tie */,
                                 1.00390625f /* bf16 tie */,
                                 5.96e-8f};
  std::vector<float> v(n);
  for (auto& x : v) {
    const int p = pick(rng);
    if (specials && p < 6)
      x = specials_list[static_cast<std::size_t>(pick(rng)) % std::size(specials_list)];
    else
      x = normal(rng);
  }
  return v;
}

// Rounds fp32 values into a buffer of dtype t (raw bytes).
inline std::vector<char> to_dtype(const std::vector<float>& f, DType t) {
  std::vector<char> out(f.size() * dtype_size(t));
  convert(f.data(), DType::f32, out.data(), t, f.size());
  return out;
}

inline bool is_nan_bits(const void* p, std::size_t i, DType t) { return std::isnan(load_as_f32(p, i, t)); }

// Index of the first element whose bits differ (both NaN counts as equal), or -1.
inline long long first_mismatch(const void* a, const void* b, std::size_t n, DType t) {
  const std::size_t es = dtype_size(t);
  for (std::size_t i = 0; i < n; ++i) {
    if (std::memcmp(static_cast<const char*>(a) + i * es, static_cast<const char*>(b) + i * es, es) == 0) continue;
    if (is_nan_bits(a, i, t) && is_nan_bits(b, i, t)) continue;
    return static_cast<long long>(i);
  }
  return -1;
}

// REQUIREs bitwise equality (NaN == NaN) of two buffers of n elements of dtype t.
inline void require_same(const void* got, const void* want, std::size_t n, DType t, const std::string& what) {
  const long long i = first_mismatch(got, want, n, t);
  if (i >= 0) {
    const auto k = static_cast<std::size_t>(i);
    INFO(what << ": element " << k << " of " << n << " (" << dtype_name(t) << "): got " << load_as_f32(got, k, t)
              << ", want " << load_as_f32(want, k, t));
    REQUIRE(i < 0);
  }
}

}  // namespace zero::gputest
