// Muon's matrices cut by tensor parallelism: each whole matrix put together in the tensor group and
// orthogonalised once there (muon.cpp says where this runs in the step).
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace zero {

class Communicator;

// A whole matrix to orthogonalise in place: row-major, rows x cols, at x.
struct WholeMatrix {
  float* x = nullptr;
  std::int64_t rows = 0, cols = 0;
};

// Calls f(rows, cols, xs) once for each shape among ms, with the pointers of its matrices of that
// shape (in ms's order: a stable sort by shape), and empties ms.
template <class F>
void each_shape(std::vector<WholeMatrix>& ms, F&& f) {
  auto shape = [](const WholeMatrix& m) { return std::pair(m.rows, m.cols); };
  std::stable_sort(ms.begin(), ms.end(),
                   [&](const WholeMatrix& a, const WholeMatrix& b) { return shape(a) < shape(b); });
  std::vector<float*> xs;
  for (std::size_t i = 0, j = 0; i < ms.size(); i = j) {
    xs.clear();
    for (j = i; j < ms.size() && shape(ms[j]) == shape(ms[i]); ++j) xs.push_back(ms[j].x);
    f(ms[i].rows, ms[i].cols, xs);
  }
  ms.clear();
}

// Newton-Schulz (ns_steps) on the host on each of ms, which empties: several small matrices of one
// shape at once, one per thread (offload::newton_schulz_batch: the bits of one at a time), the
// rest one at a time on all threads.
void orthogonalise_host(std::vector<WholeMatrix>& ms, int ns_steps, std::vector<float>& work);

// A matrix of which each tensor rank holds one part (Layout::set_split's cut).
struct SplitMatrix {
  std::vector<std::int64_t> part;  // this rank's part's shape
  int axis = 0, blocks = 1;
  std::int64_t rows = 0, cols = 0;  // the whole matrix's
};

// Orthogonalises (Newton-Schulz, ns_steps) the whole matrices whose parts on this rank are at
// parts[k] (matrix ms[k]), and overwrites each part with its part of the result. Collective over
// the tensor group, whose members pass the same matrices in the same order: one all-gather of the
// parts, matrix k orthogonalised on member k mod T alone (orthogonalise_host), and one all-reduce
// of the results (each element written by one member, so the sum is exact).
void orthogonalise_split(Communicator& tensor, const std::vector<const SplitMatrix*>& ms,
                         const std::vector<float*>& parts, int ns_steps, std::vector<float>& work);

}  // namespace zero
