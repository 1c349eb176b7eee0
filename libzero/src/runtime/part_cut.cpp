#include "runtime/part_cut.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "runtime/strings.hpp"
#include "zero/error.hpp"

namespace zero {

PartCut::PartCut(const std::vector<std::int64_t>& part, int axis, int blocks, int n)
    : parts(n), split(n > 1 && axis >= 0) {
  numel = 1;
  for (auto d : part) numel *= d;
  if (!split) return;
  ZERO_CHECK(
      static_cast<std::size_t>(axis) < part.size() && blocks >= 1 && part[static_cast<std::size_t>(axis)] % blocks == 0,
      fmt::format("a part of shape {} cannot be cut along axis {} in {} blocks", shape_text(part), axis, blocks));
  for (std::size_t d = static_cast<std::size_t>(axis) + 1; d < part.size(); ++d) inner *= part[d];
  extent = part[static_cast<std::size_t>(axis)];
  chunk = extent / blocks;
}

std::int64_t PartCut::to_whole(std::int64_t x, std::int64_t t, std::int64_t& run) const {
  if (!split) {
    run = numel - x;
    return x;
  }
  const std::int64_t o = x / (extent * inner), r = x % (extent * inner), j = r / inner, i = r % inner;
  const std::int64_t b = j / chunk, jj = j % chunk;
  run = (chunk - jj) * inner - i;
  return (o * extent * parts + (b * parts + t) * chunk + jj) * inner + i;
}

std::int64_t PartCut::from_whole(std::int64_t w, std::int64_t& t, std::int64_t& run) const {
  if (!split) {
    t = 0;
    run = numel - w;
    return w;
  }
  const std::int64_t o = w / (extent * parts * inner), r = w % (extent * parts * inner), j = r / inner, i = r % inner;
  const std::int64_t b = j / (parts * chunk), rem = j % (parts * chunk), jj = rem % chunk;
  t = rem / chunk;
  run = (chunk - jj) * inner - i;
  return (o * extent + b * chunk + jj) * inner + i;
}

void concat_parts(const std::vector<const float*>& parts, const std::vector<std::int64_t>& part, int axis, int blocks,
                  float* whole) {
  const PartCut cut(part, axis, blocks, static_cast<int>(parts.size()));
  for (std::size_t t = 0; t < parts.size(); ++t)
    for (std::int64_t x = 0, run = 0; x < cut.numel; x += run) {
      const std::int64_t w = cut.to_whole(x, static_cast<std::int64_t>(t), run);
      std::copy_n(parts[t] + x, run, whole + w);
    }
}

void take_part(const float* whole, const std::vector<std::int64_t>& part, int axis, int blocks, int parts, int t,
               float* out) {
  const PartCut cut(part, axis, blocks, parts);
  for (std::int64_t x = 0, run = 0; x < cut.numel; x += run) {
    const std::int64_t w = cut.to_whole(x, t, run);
    std::copy_n(whole + w, run, out + x);
  }
}

}  // namespace zero
