// The factories registry.cpp chooses from, one per optimizer file.
#pragma once

#include <memory>
#include <string>

#include "optim/optimizer.hpp"

namespace zero {

std::unique_ptr<Optimizer> make_adam(const OptimizerConfig& o);
std::unique_ptr<Optimizer> make_sgd(const OptimizerConfig& o);
std::unique_ptr<Optimizer> make_lion(const OptimizerConfig& o);
std::unique_ptr<Optimizer> make_lamb(const OptimizerConfig& o, const OptimizerEnv& env);
std::unique_ptr<Optimizer> make_adafactor(const OptimizerConfig& o, const OptimizerEnv& env);
std::unique_ptr<Optimizer> make_muon(const OptimizerConfig& o, const OptimizerEnv& env);
std::unique_ptr<Optimizer> make_onebit_adam(const OptimizerConfig& o, const OptimizerEnv& env);
std::unique_ptr<Optimizer> make_onebit_lamb(const OptimizerConfig& o, const OptimizerEnv& env);

// Adafactor's first statistics exchange: its slots (optimizer_exchange, and the optimizer's own
// layout of them).
std::int64_t adafactor_stat_slots(const Layout& layout);
// What Lamb and Adafactor sum over the tensor group each step for the tensors split by tensor
// parallelism (the optimizers' own lists, and optimizer_exchange's tensor_doubles). Lamb: the
// slots of ||p||^2 and ||u||^2 of each split tensor. Adafactor: the first pass's slots (the two
// sums of each split tensor, and a split matrix's sums along its cut axis), the second pass's
// (the factored split matrices' index), and how many factored matrices are cut by rows (the sums
// of their R, exchanged between the two).
std::vector<int> lamb_split_slots(const Layout& layout);
struct AdafactorSplit {
  std::vector<int> first, second;
  std::int64_t row_cut = 0;
};
AdafactorSplit adafactor_split(const Layout& layout);
// OneBitLamb's values per tensor (frozen ratio and last factor in double, scaling coefficient and
// step in float): bytes for `tensors` tensors.
constexpr std::int64_t onebit_lamb_tensor_bytes(std::int64_t tensors) { return tensors * (8 + 8 + 4 + 4); }
// Muon's matrices: 2-D and not an embedding or head.
bool muon_matrix(const ParamInfo& p);
// Muon's matrices in layout order: the whole matrix's rows and columns (a part cut by tensor
// parallelism is `tensors` times larger along its cut axis) and the partition rank of `world`
// that orthogonalises it, the least loaded so far by min(r,c)^2 max(r,c) (the optimizer's own
// dealing out; zero-plan's step time follows it).
struct MuonOwner {
  std::int64_t rows = 0, cols = 0;
  bool split = false;
  int owner = 0;
};
std::vector<MuonOwner> muon_owners(const Layout& layout, int world, int tensors);
// FLOPs of `steps` quintic Newton-Schulz iterations on a rows x cols matrix: with r <= k its
// sides, X X^T (2 r^2 k), its square (2 r^3) and B X (2 r^2 k) each.
double newton_schulz_flops(std::int64_t rows, std::int64_t cols, int steps);

// Refuses a layout with a parameter split by tensor parallelism when the engine has no tensor
// group to sum its statistics over (an Engine built without ProcessGroups): "" when there is none.
std::string needs_tensor_group(const char* optimizer, const Layout& layout, const OptimizerEnv& env);

}  // namespace zero
