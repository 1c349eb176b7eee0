// Muon's matrices cut by tensor parallelism: each whole matrix put together in the tensor group and
// orthogonalised once there (muon.cpp says where this runs in the step).
#pragma once

#include <cstdint>
#include <vector>

namespace zero {

class Communicator;

// A matrix of which each tensor rank holds one part (Layout::set_split's cut).
struct SplitMatrix {
  std::vector<std::int64_t> part;  // this rank's part's shape
  int axis = 0, blocks = 1;
  std::int64_t rows = 0, cols = 0;  // the whole matrix's
};

// Orthogonalises (Newton-Schulz, ns_steps) the whole matrices whose parts on this rank are at
// parts[k] (matrix ms[k]), and overwrites each part with its part of the result. Collective over
// the tensor group, whose members pass the same matrices in the same order: one all-gather of the
// parts, matrix k orthogonalised on member k mod T alone, and one all-reduce of the results (each
// element written by one member, so the sum is exact).
void orthogonalise_split(Communicator& tensor, const std::vector<const SplitMatrix*>& ms,
                         const std::vector<float*>& parts, int ns_steps, std::vector<float>& work);

}  // namespace zero
