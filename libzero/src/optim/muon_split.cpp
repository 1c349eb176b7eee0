#include "optim/muon_split.hpp"

#include <algorithm>

#include "offload/host_optimizer.hpp"
#include "runtime/part_cut.hpp"
#include "zero/comm.hpp"
#include "zero/error.hpp"

namespace zero {

void orthogonalise_host(std::vector<WholeMatrix>& ms, int ns_steps, std::vector<float>& work) {
  each_shape(ms, [&](std::int64_t rows, std::int64_t cols, std::vector<float*>& xs) {
    if (xs.size() > 1 && offload::newton_schulz_small(rows, cols))
      return offload::newton_schulz_batch(xs.data(), xs.size(), rows, cols, ns_steps, work);
    for (float* x : xs) offload::newton_schulz(x, rows, cols, ns_steps, work);
  });
}

void orthogonalise_split(Communicator& tensor, const std::vector<const SplitMatrix*>& ms,
                         const std::vector<float*>& parts, int ns_steps, std::vector<float>& work) {
  ZERO_CHECK(ms.size() == parts.size(), "orthogonalise_split: one part per matrix");
  if (ms.empty()) return;
  const int T = tensor.size(), t = tensor.rank();
  // Part k at at[k] of this rank's packed parts; its whole matrix at T x at[k] of the results.
  std::vector<std::int64_t> at(ms.size() + 1, 0);
  for (std::size_t k = 0; k < ms.size(); ++k) at[k + 1] = at[k] + ms[k]->rows * ms[k]->cols / T;
  const auto S = static_cast<std::size_t>(at.back());
  std::vector<float> mine(S), all(S * static_cast<std::size_t>(T)), result(all.size(), 0.0f);
  for (std::size_t k = 0; k < ms.size(); ++k) std::copy_n(parts[k], at[k + 1] - at[k], mine.data() + at[k]);
  tensor.all_gather(mine.data(), all.data(), S, DType::f32);
  std::vector<const float*> from(static_cast<std::size_t>(T));
  std::vector<WholeMatrix> mine_whole;
  for (std::size_t k = 0; k < ms.size(); ++k) {
    if (static_cast<int>(k % static_cast<std::size_t>(T)) != t) continue;
    const SplitMatrix& m = *ms[k];
    for (int j = 0; j < T; ++j)
      from[static_cast<std::size_t>(j)] = all.data() + static_cast<std::size_t>(j) * S + at[k];
    float* whole = result.data() + T * at[k];
    concat_parts(from, m.part, m.axis, m.blocks, whole);
    mine_whole.push_back({whole, m.rows, m.cols});
  }
  orthogonalise_host(mine_whole, ns_steps, work);
  tensor.all_reduce(result.data(), result.size(), DType::f32, ReduceOp::sum);
  for (std::size_t k = 0; k < ms.size(); ++k)
    take_part(result.data() + T * at[k], ms[k]->part, ms[k]->axis, ms[k]->blocks, T, t, parts[k]);
}

}  // namespace zero
