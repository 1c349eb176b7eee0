// Block int8 quantization (comm/quantize.hpp) against a double-precision reference: every value
// comes back within its block's max|x| / 254 (plus the compute dtype's own rounding), blocks of
// zeros come back zero, sizes that are not a multiple of the block work, and the packed bytes
// are a function of the input alone (every rank sends the same for the same slice).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "comm/quantize.hpp"

using namespace zero;

namespace {
// Values spanning several magnitudes, signs mixed, some exact zeros.
float value(std::size_t i) {
  std::uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull;
  x ^= x >> 29;
  const double u = static_cast<double>(x >> 11) / 9007199254740992.0 * 2.0 - 1.0;
  if (i % 17 == 5) return 0.0f;
  return static_cast<float>(u * std::pow(10.0, static_cast<double>(i % 5) - 2.0));
}
}  // namespace

TEST_CASE("int8 blocks round-trip within max|x|/254 of the block, for fp32, bf16 and fp16 data") {
  for (DType t : {DType::f32, DType::bf16, DType::f16})
    for (std::size_t block : {1u, 7u, 256u})
      for (std::size_t n : {0u, 1u, 255u, 256u, 257u, 1000u}) {
        INFO(dtype_name(t) << " block " << block << " n " << n);
        std::vector<char> src(n * dtype_size(t) + 1), back(n * dtype_size(t) + 1);
        for (std::size_t i = 0; i < n; ++i) store_from_f32(src.data(), i, t, value(i));
        std::vector<char> packed(quant::packed_bytes(n, block));
        REQUIRE(packed.size() % 4 == 0);
        REQUIRE(packed.size() >= n + (n + block - 1) / block * 4);
        quant::quantize_int8(src.data(), t, n, block, packed.data());
        quant::dequantize_int8(packed.data(), n, block, back.data(), t);
        for (std::size_t first = 0; first < n; first += block) {
          const std::size_t last = std::min(n, first + block);
          double amax = 0.0;
          for (std::size_t i = first; i < last; ++i)
            amax = std::max(amax, std::abs(static_cast<double>(load_as_f32(src.data(), i, t))));
          for (std::size_t i = first; i < last; ++i) {
            const double x = load_as_f32(src.data(), i, t), y = load_as_f32(back.data(), i, t);
            // The dtype rounds the dequantized value once more: half an ulp of y.
            const double ulp = t == DType::f32 ? 0x1p-24 : (t == DType::bf16 ? 0x1p-8 : 0x1p-11);
            INFO("i " << i << ": " << x << " -> " << y << ", block max " << amax);
            REQUIRE(std::abs(x - y) <= amax / 254.0 * (1.0 + 1e-6) + std::abs(y) * ulp + 1e-30);
            if (amax == 0.0) REQUIRE(y == 0.0);
          }
        }
        // The same input gives the same bytes.
        std::vector<char> again(packed.size());
        quant::quantize_int8(src.data(), t, n, block, again.data());
        REQUIRE(again == packed);
      }
}

TEST_CASE("a block's largest value comes back exactly (it maps to +-127)") {
  const std::vector<float> x = {0.5f, -3.0f, 1.25f, 2.0f};
  std::vector<char> packed(quant::packed_bytes(x.size(), 4));
  std::vector<float> y(x.size());
  quant::quantize_int8(x.data(), DType::f32, x.size(), 4, packed.data());
  quant::dequantize_int8(packed.data(), x.size(), 4, y.data(), DType::f32);
  REQUIRE(std::abs(y[1] + 3.0f) <= 3.0f * 1e-6f);
  float scale = 0;
  std::memcpy(&scale, packed.data(), sizeof scale);
  REQUIRE(scale == 3.0f / 127.0f);
}

TEST_CASE("int8 and int4 blocks with error feedback: within max|x|/254 and max|x|/14 of the block, residual exact") {
  for (quant::Bits bits : {quant::Bits::int8, quant::Bits::int4})
    for (std::size_t block : {1u, 7u, 16u, 256u})
      for (std::size_t n : {0u, 1u, 2u, 3u, 15u, 16u, 17u, 255u, 1000u}) {
        const double bound = bits == quant::Bits::int8 ? 1.0 / 254.0 : 1.0 / 14.0;
        REQUIRE(quant::error_bound(bits) == bound);
        INFO((bits == quant::Bits::int8 ? "int8" : "int4") << " block " << block << " n " << n);
        std::vector<float> x(n), v(n);
        for (std::size_t i = 0; i < n; ++i) x[i] = v[i] = value(i);
        std::vector<char> packed(quant::packed_bytes(n, block, bits));
        const std::size_t values = bits == quant::Bits::int8 ? n : (n + 1) / 2;
        REQUIRE(packed.size() % 4 == 0);
        REQUIRE(packed.size() >= values + (n + block - 1) / block * 4);
        REQUIRE(packed.size() < values + (n + block - 1) / block * 4 + 4);
        quant::quantize_keep_error(v.data(), n, block, bits, packed.data());
        // The receiver's values: added into a non-zero accumulator, as the reduce-scatter sums.
        std::vector<float> acc(n, 0.0f);
        quant::dequantize_add(packed.data(), n, block, bits, acc.data());
        for (std::size_t first = 0; first < n; first += block) {
          const std::size_t last = std::min(n, first + block);
          double amax = 0.0;
          for (std::size_t i = first; i < last; ++i) amax = std::max(amax, std::abs(static_cast<double>(x[i])));
          for (std::size_t i = first; i < last; ++i) {
            const double got = acc[i];
            INFO("i " << i << ": " << x[i] << " -> " << got << ", block max " << amax);
            REQUIRE(std::abs(static_cast<double>(x[i]) - got) <= amax * bound * (1.0 + 1e-6) + 1e-30);
            // The kept error is what the receiver misses (up to fp32's rounding of the difference).
            REQUIRE(std::abs(static_cast<double>(x[i]) - got - static_cast<double>(v[i])) <=
                    std::abs(static_cast<double>(v[i])) * 0x1p-24 + 1e-30);
            if (amax == 0.0) REQUIRE(got == 0.0);
          }
        }
        // The block's largest value comes back exactly: it maps to +-7 (+-127).
        if (n > 0) {
          std::size_t big = 0;
          for (std::size_t i = 0; i < std::min(n, block); ++i)
            if (std::abs(x[i]) > std::abs(x[big])) big = i;
          REQUIRE(std::abs(acc[big] - x[big]) <= std::abs(x[big]) * 1e-6f);
        }
        std::vector<float> w(x);
        std::vector<char> again(packed.size());
        quant::quantize_keep_error(w.data(), n, block, bits, again.data());
        REQUIRE(again == packed);  // deterministic
      }
}

// The residual kept for error feedback is x minus the receiver's value k x scale, the product
// rounded on its own, and the receiver adds that rounded product to its sum: what the CUDA
// kernels compute (built with -fmad=false), byte for byte. A compiler-formed fused multiply-add
// (GCC forms them in C++ wherever the target has FMA: aarch64, or -march on x86-64) rounds once
// instead and changes both, unless quantize.cpp is built with -ffp-contract=off.
TEST_CASE("error feedback rounds the product k x scale on its own: no fused multiply-add") {
  for (quant::Bits bits : {quant::Bits::int8, quant::Bits::int4})
    for (std::size_t block : {3u, 16u}) {
      INFO((bits == quant::Bits::int8 ? "int8" : "int4") << " block " << block);
      const std::size_t n = 1000;
      std::vector<float> x(n), v(n), received(n, 0.0f), acc(n), want(n);
      for (std::size_t i = 0; i < n; ++i) x[i] = v[i] = value(i), acc[i] = 3.0f * value(i + 7);
      std::vector<char> packed(quant::packed_bytes(n, block, bits));
      quant::quantize_keep_error(v.data(), n, block, bits, packed.data());
      quant::dequantize_add(packed.data(), n, block, bits, received.data());  // 0 + round(k x scale)
      for (std::size_t i = 0; i < n; ++i) want[i] = acc[i] + received[i];
      quant::dequantize_add(packed.data(), n, block, bits, acc.data());
      for (std::size_t i = 0; i < n; ++i) {
        INFO("element " << i << ": x " << x[i] << ", received " << received[i]);
        REQUIRE(v[i] == x[i] - received[i]);
        REQUIRE(acc[i] == want[i]);
      }
    }
}

TEST_CASE("int4 packs two values per byte, the even element in the low nibble, value + 8") {
  std::vector<float> v = {7.0f, -7.0f, 1.0f, 0.0f, 3.4f};
  std::vector<char> packed(quant::packed_bytes(v.size(), 8, quant::Bits::int4));
  REQUIRE(packed.size() == 8);  // one scale, three bytes of values, one of padding
  quant::quantize_keep_error(v.data(), v.size(), 8, quant::Bits::int4, packed.data());
  float scale = 0;
  std::memcpy(&scale, packed.data(), sizeof scale);
  REQUIRE(scale == 1.0f);
  const auto* q = reinterpret_cast<const unsigned char*>(packed.data() + 4);
  REQUIRE(q[0] == ((7 + 8) | ((-7 + 8) << 4)));
  REQUIRE(q[1] == ((1 + 8) | ((0 + 8) << 4)));
  REQUIRE(q[2] == (3 + 8));  // 3.4 rounds to 3; the high nibble of the odd count stays zero
  REQUIRE(q[3] == 0);
  REQUIRE(std::abs(v[4] - 0.4f) < 1e-6f);  // the residual 3.4 - 3
}

TEST_CASE("a block holding inf or NaN comes back all NaN, other blocks as usual") {
  for (quant::Bits bits : {quant::Bits::int8, quant::Bits::int4})
    for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                      std::numeric_limits<float>::quiet_NaN()}) {
      std::vector<float> v = {1.0f, bad, 0.5f, 0.25f, 2.0f, -1.0f};
      std::vector<char> packed(quant::packed_bytes(v.size(), 3, bits));
      quant::quantize_keep_error(v.data(), v.size(), 3, bits, packed.data());
      std::vector<float> acc(v.size(), 0.0f);
      quant::dequantize_add(packed.data(), v.size(), 3, bits, acc.data());
      for (int i = 0; i < 3; ++i) REQUIRE(std::isnan(acc[static_cast<std::size_t>(i)]));
      const double tol = 2.0 * quant::error_bound(bits) * (1.0 + 1e-6);  // the block's max|x| is 2
      REQUIRE(std::abs(acc[3] - 0.25f) <= tol);
      REQUIRE(std::abs(acc[4] - 2.0f) <= tol);
      REQUIRE(std::abs(acc[5] + 1.0f) <= tol);
      std::vector<char> back(v.size() * 4);
      std::vector<float> w = {1.0f, bad, 0.5f};
      std::vector<char> p8(quant::packed_bytes(3, 3));
      quant::quantize_int8(w.data(), DType::f32, 3, 3, p8.data());
      quant::dequantize_int8(p8.data(), 3, 3, back.data(), DType::f32);
      REQUIRE(std::isnan(load_as_f32(back.data(), 0, DType::f32)));
    }
}
