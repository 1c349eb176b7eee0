#include "zero/dtype.hpp"

namespace zero {

void convert(const void* src, DType src_t, void* dst, DType dst_t, std::size_t n) {
  if (src_t == dst_t) {
    if (src != dst) std::memmove(dst, src, n * dtype_size(src_t));
    return;
  }
  // The pairs mixed precision uses every step get a loop of their own, which the compiler
  // vectorises; the rest go through the generic per-element path.
  if (src_t == DType::bf16 && dst_t == DType::f32) {
    const auto* s = static_cast<const std::uint16_t*>(src);
    auto* d = static_cast<float*>(dst);
    for (std::size_t i = 0; i < n; ++i) d[i] = bf16_bits_to_f32(s[i]);
    return;
  }
  if (src_t == DType::f32 && dst_t == DType::bf16) {
    const auto* s = static_cast<const float*>(src);
    auto* d = static_cast<std::uint16_t*>(dst);
    for (std::size_t i = 0; i < n; ++i) d[i] = f32_to_bf16_bits(s[i]);
    return;
  }
  for (std::size_t i = 0; i < n; ++i) store_from_f32(dst, i, dst_t, load_as_f32(src, i, src_t));
}

}  // namespace zero
