#include "zero/dtype.hpp"

namespace zero {

void convert(const void* src, DType src_t, void* dst, DType dst_t, std::size_t n) {
  if (src_t == dst_t) {
    if (src != dst) std::memmove(dst, src, n * dtype_size(src_t));
    return;
  }
  for (std::size_t i = 0; i < n; ++i) store_from_f32(dst, i, dst_t, load_as_f32(src, i, src_t));
}

}  // namespace zero
