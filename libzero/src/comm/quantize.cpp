// Block quantization (see comm/quantize.hpp).
#include "comm/quantize.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace zero::quant {

namespace {

std::size_t blocks(std::size_t n, std::size_t block) { return (n + block - 1) / block; }
std::size_t value_bytes(std::size_t n, Bits bits) { return bits == Bits::int8 ? n : (n + 1) / 2; }
float levels(Bits bits) { return bits == Bits::int8 ? 127.0f : 7.0f; }

// Quantizes n values read by load(i) into out: the scale of each block, then q(i, v) stores the
// integer v of element i. Returns nothing; the padding after the values is zeroed.
template <class Load, class Store>
void quantize_blocks(std::size_t n, std::size_t block, Bits bits, void* out, Load&& load, Store&& store) {
  auto* scales = static_cast<float*>(out);
  const float top = levels(bits);
  for (std::size_t b = 0, first = 0; first < n; ++b, first += block) {
    const std::size_t last = std::min(n, first + block);
    float amax = 0.0f;
    bool finite = true;
    for (std::size_t i = first; i < last; ++i) {
      const float x = load(i);
      finite = finite && std::isfinite(x);
      amax = std::max(amax, std::abs(x));
    }
    if (!finite) {
      // An inf or NaN (an fp16 overflow) must reach the receiver as such, so that the loss
      // scaler sees it: the whole block comes back NaN.
      scales[b] = std::numeric_limits<float>::quiet_NaN();
      for (std::size_t i = first; i < last; ++i) store(i, 0);
      continue;
    }
    const float scale = amax / top;
    scales[b] = scale;
    for (std::size_t i = first; i < last; ++i) {
      // nearbyint: round half to even, the same on every rank; |x| <= amax keeps it in range.
      const float v = scale > 0.0f ? std::nearbyint(load(i) / scale) : 0.0f;
      store(i, static_cast<int>(std::clamp(v, -top, top)));
    }
  }
}

}  // namespace

std::size_t packed_bytes(std::size_t n, std::size_t block, Bits bits) {
  const std::size_t bytes = blocks(n, block) * sizeof(float) + value_bytes(n, bits);
  return (bytes + 3) / 4 * 4;
}

double error_bound(Bits bits) { return 0.5 / static_cast<double>(levels(bits)); }

void quantize_int8(const void* src, DType t, std::size_t n, std::size_t block, void* out) {
  auto* q = reinterpret_cast<std::int8_t*>(static_cast<float*>(out) + blocks(n, block));
  const std::size_t used = blocks(n, block) * sizeof(float) + n;
  std::memset(static_cast<char*>(out) + used, 0, packed_bytes(n, block) - used);
  quantize_blocks(
      n, block, Bits::int8, out, [&](std::size_t i) { return load_as_f32(src, i, t); },
      [&](std::size_t i, int v) { q[i] = static_cast<std::int8_t>(v); });
}

void dequantize_int8(const void* in, std::size_t n, std::size_t block, void* dst, DType t) {
  const auto* scales = static_cast<const float*>(in);
  const auto* q = reinterpret_cast<const std::int8_t*>(scales + blocks(n, block));
  for (std::size_t i = 0; i < n; ++i) store_from_f32(dst, i, t, static_cast<float>(q[i]) * scales[i / block]);
}

void quantize_keep_error(float* v, std::size_t n, std::size_t block, Bits bits, void* out) {
  const auto* scales = static_cast<const float*>(out);
  auto* q = reinterpret_cast<unsigned char*>(static_cast<float*>(out) + blocks(n, block));
  // Zero the values and padding first: int4 stores OR nibbles into place.
  const std::size_t start = blocks(n, block) * sizeof(float);
  std::memset(static_cast<char*>(out) + start, 0, packed_bytes(n, block, bits) - start);
  quantize_blocks(n, block, bits, out, [&](std::size_t i) { return v[i]; }, [&](std::size_t i, int k) {
    if (bits == Bits::int8) q[i] = static_cast<unsigned char>(static_cast<std::int8_t>(k));
    else q[i / 2] |= static_cast<unsigned char>((k + 8) << (4 * (i % 2)));
    // The receiver computes k * scale in fp32: the residual is what it misses.
    v[i] -= static_cast<float>(k) * scales[i / block];
  });
}

void dequantize_add(const void* in, std::size_t n, std::size_t block, Bits bits, float* acc) {
  const auto* scales = static_cast<const float*>(in);
  const auto* q = reinterpret_cast<const unsigned char*>(scales + blocks(n, block));
  if (bits == Bits::int8) {
    for (std::size_t i = 0; i < n; ++i)
      acc[i] += static_cast<float>(static_cast<std::int8_t>(q[i])) * scales[i / block];
    return;
  }
  for (std::size_t i = 0; i < n; ++i) {
    const int k = ((q[i / 2] >> (4 * (i % 2))) & 0xF) - 8;
    acc[i] += static_cast<float>(k) * scales[i / block];
  }
}

}  // namespace zero::quant
