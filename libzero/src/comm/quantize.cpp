// Block int8 quantization (see comm/quantize.hpp).
#include "comm/quantize.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace zero::quant {

namespace {
std::size_t blocks(std::size_t n, std::size_t block) { return (n + block - 1) / block; }
}  // namespace

std::size_t packed_bytes(std::size_t n, std::size_t block) {
  const std::size_t bytes = blocks(n, block) * sizeof(float) + n;
  return (bytes + 3) / 4 * 4;
}

void quantize_int8(const void* src, DType t, std::size_t n, std::size_t block, void* out) {
  auto* scales = static_cast<float*>(out);
  auto* q = reinterpret_cast<std::int8_t*>(scales + blocks(n, block));
  for (std::size_t b = 0, first = 0; first < n; ++b, first += block) {
    const std::size_t last = std::min(n, first + block);
    float amax = 0.0f;
    for (std::size_t i = first; i < last; ++i) amax = std::max(amax, std::abs(load_as_f32(src, i, t)));
    const float scale = amax / 127.0f;
    scales[b] = scale;
    for (std::size_t i = first; i < last; ++i) {
      // nearbyint: round half to even, the same on every rank; |x| <= amax keeps it in [-127, 127].
      const float v = scale > 0.0f ? std::nearbyint(load_as_f32(src, i, t) / scale) : 0.0f;
      q[i] = static_cast<std::int8_t>(std::clamp(v, -127.0f, 127.0f));
    }
  }
  const std::size_t used = blocks(n, block) * sizeof(float) + n;
  std::memset(static_cast<char*>(out) + used, 0, packed_bytes(n, block) - used);
}

void dequantize_int8(const void* in, std::size_t n, std::size_t block, void* dst, DType t) {
  const auto* scales = static_cast<const float*>(in);
  const auto* q = reinterpret_cast<const std::int8_t*>(scales + blocks(n, block));
  for (std::size_t i = 0; i < n; ++i) store_from_f32(dst, i, t, static_cast<float>(q[i]) * scales[i / block]);
}

}  // namespace zero::quant
