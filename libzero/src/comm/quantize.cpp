// Block quantization (see comm/quantize.hpp).
#include "comm/quantize.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "comm/quantize_math.hpp"

namespace zero::quant {

namespace {

using math::blocks;
float levels(Bits bits) { return math::levels(bits == Bits::int8); }

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
      finite = finite && math::finite(x);
      amax = std::max(amax, std::abs(x));
    }
    const float scale = math::block_scale(amax, finite, top);
    scales[b] = scale;
    // A NaN scale (an inf or NaN in the block) sends zeros, which come back as NaN.
    for (std::size_t i = first; i < last; ++i) store(i, math::quantize_value(load(i), scale, top));
  }
}

}  // namespace

std::size_t packed_bytes(std::size_t n, std::size_t block, Bits bits) {
  return math::packed_bytes(n, block, bits == Bits::int8);
}

double error_bound(Bits bits) { return 0.5 / static_cast<double>(levels(bits)); }

void quantize_int8(const void* src, DType t, std::size_t n, std::size_t block, void* out) {
  auto* q = reinterpret_cast<std::int8_t*>(static_cast<float*>(out) + blocks(n, block));
  const std::size_t used = blocks(n, block) * sizeof(float) + n;
  if (packed_bytes(n, block) > used) std::memset(static_cast<char*>(out) + used, 0, packed_bytes(n, block) - used);
  quantize_blocks(
      n, block, Bits::int8, out, [&](std::size_t i) { return load_as_f32(src, i, t); },
      [&](std::size_t i, int v) { q[i] = static_cast<std::int8_t>(v); });
}

void dequantize_int8(const void* in, std::size_t n, std::size_t block, void* dst, DType t) {
  const auto* scales = static_cast<const float*>(in);
  const auto* q = reinterpret_cast<const std::int8_t*>(scales + blocks(n, block));
  for (std::size_t i = 0; i < n; ++i) store_from_f32(dst, i, t, math::dequantize_value(q[i], scales[i / block]));
}

void quantize_keep_error(float* v, std::size_t n, std::size_t block, Bits bits, void* out) {
  const auto* scales = static_cast<const float*>(out);
  auto* q = reinterpret_cast<unsigned char*>(static_cast<float*>(out) + blocks(n, block));
  // Zero the values and padding first: int4 stores OR nibbles into place.
  const std::size_t start = blocks(n, block) * sizeof(float);
  if (packed_bytes(n, block, bits) > start)
    std::memset(static_cast<char*>(out) + start, 0, packed_bytes(n, block, bits) - start);
  quantize_blocks(
      n, block, bits, out, [&](std::size_t i) { return v[i]; },
      [&](std::size_t i, int k) {
        if (bits == Bits::int8)
          q[i] = static_cast<unsigned char>(static_cast<std::int8_t>(k));
        else
          q[i / 2] |= math::int4_nibble(k, i);
        // The receiver computes k * scale in fp32: the residual is what it misses.
        v[i] -= math::dequantize_value(k, scales[i / block]);
      });
}

void dequantize_add(const void* in, std::size_t n, std::size_t block, Bits bits, float* acc) {
  const auto* scales = static_cast<const float*>(in);
  const auto* q = reinterpret_cast<const unsigned char*>(scales + blocks(n, block));
  if (bits == Bits::int8) {
    for (std::size_t i = 0; i < n; ++i)
      acc[i] += math::dequantize_value(static_cast<std::int8_t>(q[i]), scales[i / block]);
    return;
  }
  for (std::size_t i = 0; i < n; ++i) {
    acc[i] += math::dequantize_value(math::int4_value(q[i / 2], i), scales[i / block]);
  }
}

}  // namespace zero::quant
