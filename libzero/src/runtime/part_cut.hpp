// Where each element of a tensor-parallel part lies in its whole tensor (the cut Layout::set_split
// records), for the checkpoint's whole-model reads and the optimizers that need whole tensors.
#pragma once

#include <cstdint>
#include <vector>

namespace zero {

// Flat indices: a part is [outer, extent, inner] around the split axis, its extent cut into
// `blocks` chunks of `chunk`; chunk b of part t lies at (b x parts + t) x chunk along the whole
// axis. Unsplit (axis < 0, or one part): the identity.
struct PartCut {
  std::int64_t numel = 0, extent = 1, inner = 1, chunk = 1;
  std::int64_t parts = 1;
  bool split = false;

  // Throws zero::Error when the part's extent along `axis` is not a multiple of `blocks`.
  PartCut(const std::vector<std::int64_t>& part, int axis, int blocks, int n);
  // The whole tensor's index of element x of part t; `run`: the elements from x on (x included)
  // that stay contiguous in the whole tensor.
  std::int64_t to_whole(std::int64_t x, std::int64_t t, std::int64_t& run) const;
  // The part t and its element holding whole index w; `run` as above, in the part.
  std::int64_t from_whole(std::int64_t w, std::int64_t& t, std::int64_t& run) const;
};

// Concatenates the parts (each of shape `part`) into the whole tensor: whole block b along `axis`
// is [part_0 block b | part_1 block b | ...], so the whole has part[axis] x parts.size() there.
void concat_parts(const std::vector<const float*>& parts, const std::vector<std::int64_t>& part, int axis, int blocks,
                  float* whole);
// The reverse for one part: copies part t of `whole` to `out` (numel of `part` elements).
void take_part(const float* whole, const std::vector<std::int64_t>& part, int axis, int blocks, int parts, int t,
               float* out);

}  // namespace zero
