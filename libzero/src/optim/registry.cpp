// The optimizer optimizer.type names, the state each keeps, and the statistics they share.
#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "optim/onebit_exchange.hpp"
#include "optim/optimizer.hpp"
#include "optim/optimizers.hpp"
#include "zero/comm.hpp"
#include "zero/error.hpp"

namespace zero {

int optimizer_moments(const OptimizerConfig& o) {
  switch (o.type) {
    case OptimizerType::adamw:
    case OptimizerType::adam:
    case OptimizerType::lamb: return 2;  // m, v
    case OptimizerType::sgd:
    case OptimizerType::lion:
      return 1;  // the momentum
    // v of the vectors (for a matrix, its row and column statistics sit in the first
    // rows + cols places), then the first moment when beta1 is set.
    case OptimizerType::adafactor: return o.adafactor_beta1 > 0.0 ? 2 : 1;
    // The momentum of a matrix; AdamW's m and v of every other parameter.
    case OptimizerType::muon: return 2;
    case OptimizerType::onebit_adam: return 2;  // m, v (frozen after freeze_step)
    case OptimizerType::onebit_lamb: return 3;  // m, v, and the fresh variance after freeze_step
  }
  ZERO_THROW("optimizer.type has an unknown value");
}

std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& o, const OptimizerEnv& env) {
  switch (o.type) {
    case OptimizerType::adamw:
    case OptimizerType::adam: return make_adam(o);
    case OptimizerType::sgd: return make_sgd(o);
    case OptimizerType::lamb: return make_lamb(o, env);
    case OptimizerType::lion: return make_lion(o);
    case OptimizerType::adafactor: return make_adafactor(o, env);
    case OptimizerType::muon: return make_muon(o, env);
    case OptimizerType::onebit_adam: return make_onebit_adam(o, env);
    case OptimizerType::onebit_lamb: return make_onebit_lamb(o, env);
  }
  ZERO_THROW("optimizer.type has an unknown value");
}

OptimizerExchange optimizer_exchange(const OptimizerConfig& o, const Layout& layout, const ExchangeRank& at) {
  OptimizerExchange x;
  const std::int64_t tensors = tensor_offsets(layout).back();
  switch (o.type) {
    case OptimizerType::lamb:
      x.stat_doubles = {2 * tensors};  // ||p||^2, ||u||^2
      if (const auto split = static_cast<std::int64_t>(lamb_split_slots(layout).size())) x.tensor_doubles = {split};
      break;
    // After the warm-up (the steady state a plan is for): ||u||^2, ||m / (sqrt(v) + eps)||^2 and
    // the largest ratio of the denominators.
    case OptimizerType::onebit_lamb: x.stat_doubles = {3 * tensors}; break;
    case OptimizerType::adafactor: {
      x.stat_doubles = {adafactor_stat_slots(layout), tensors};
      const AdafactorSplit s = adafactor_split(layout);  // in the order the passes exchange them
      for (const std::int64_t n :
           {static_cast<std::int64_t>(s.first.size()), s.row_cut, static_cast<std::int64_t>(s.second.size())})
        if (n > 0) x.tensor_doubles.push_back(n);
      break;
    }
    case OptimizerType::muon: {
      // Muon::end_pass, unit by unit: every matrix is orthogonalised on each rank when each steps
      // all of them (Muon::local), else by its owner; the parts of those cut by tensor
      // parallelism are put together in one exchange per unit (orthogonalise_split).
      const bool local = at.stage == 0 || at.world == 1;
      const std::vector<MuonOwner> owners = muon_owners(layout, at.world, at.tensors);
      std::size_t k = 0;
      for (int u = 0; u < layout.num_units(); ++u) {
        bool matrices = false;
        std::int64_t parts = 0;
        for (const ParamInfo& p : layout.unit(u).params) {
          if (!muon_matrix(p)) continue;
          matrices = true;
          const MuonOwner& m = owners[k++];
          if (m.split && (local || m.owner == at.rank)) parts += p.numel;
        }
        if (matrices) x.matrix_units.push_back(u);
        if (parts > 0) x.tensor_matrix_floats.push_back(parts);
      }
      break;
    }
    default: break;
  }
  return x;
}

std::int64_t optimizer_buffer_bytes(const OptimizerConfig& o, const Layout& layout,
                                    const std::vector<std::int64_t>& slices, int world) {
  switch (o.type) {
    case OptimizerType::onebit_adam: return OneBitExchange::bytes_for(slices, world);
    case OptimizerType::onebit_lamb:
      return OneBitExchange::bytes_for(slices, world) + onebit_lamb_tensor_bytes(tensor_offsets(layout).back());
    default: return 0;
  }
}

std::string needs_tensor_group(const char* optimizer, const Layout& layout, const OptimizerEnv& env) {
  if (env.tensor != nullptr) return {};
  for (const UnitInfo& u : layout.units())
    for (const ParamInfo& p : u.params)
      if (p.split_axis >= 0)
        return fmt::format(
            "optimizer.type {} computes statistics over whole tensors, and '{}' of unit '{}' is split by tensor "
            "parallelism, but the engine has no tensor group to combine its parts over: construct the Engine with "
            "the ProcessGroups whose tensor group holds the other parts",
            optimizer, p.name, u.name);
  return {};
}

void sum_over_tensor_group(Communicator& tensor, std::vector<double>& v) {
  const std::size_t n = v.size(), T = static_cast<std::size_t>(tensor.size());
  if (n == 0 || T < 2) return;
  std::vector<double> all(n * T);
  // Doubles travel as pairs of floats: the bytes arrive unchanged.
  tensor.all_gather(v.data(), all.data(), 2 * n, DType::f32);
  for (std::size_t k = 0; k < n; ++k) {
    double t = 0.0;
    for (std::size_t r = 0; r < T; ++r) t += all[r * n + k];
    v[k] = t;
  }
}

void SliceStats::reset(int slots, int slices, int lane_slots, int held, int max_from) {
  ZERO_CHECK(held == kAllSlices || (held >= 0 && held < slices),
             fmt::format("SliceStats: held slice {} of {}", held, slices));
  slots_ = slots;
  slices_ = slices;
  lane_slots_ = lane_slots;
  held_ = held;
  max_from_ = max_from < 0 ? slots : max_from;
  const std::size_t rows = held == kAllSlices ? static_cast<std::size_t>(slices) : 1;
  v_.assign(static_cast<std::size_t>(slots) * rows, 0.0);
  total_.assign(static_cast<std::size_t>(slots), 0.0);
  lanes_.assign(static_cast<std::size_t>(lane_slots) * rows * kLanes, 0.0);
}

std::size_t SliceStats::row(int slice) const {
  if (held_ == kAllSlices) return static_cast<std::size_t>(slice);
  ZERO_CHECK(slice == held_, fmt::format("SliceStats: slice {} is not this rank's ({})", slice, held_));
  return 0;
}

void SliceStats::combine(Communicator* comm, int own) {
  const std::size_t n = static_cast<std::size_t>(slots_);
  for (int slice = 0; slice < slices_; ++slice)
    if (held_ == kAllSlices || slice == held_)
      for (int slot = 0; slot < lane_slots_; ++slot) at(slot, slice) += offload::fold_total(lanes(slot, slice));
  if (comm == nullptr || comm->size() == 1 || n == 0) {
    ZERO_CHECK(held_ == kAllSlices || slices_ == 1, "SliceStats: the totals need every slice; a rank holds one");
    for (std::size_t k = 0; k < n; ++k) {
      double t = 0.0;
      for (std::size_t s = 0; s < v_.size() / n; ++s) t = fold(t, v_[s * n + k], static_cast<int>(k));
      total_[k] = t;
    }
    return;
  }
  ZERO_CHECK(comm->size() == slices_ && held_ == own && comm->rank() == own,
             fmt::format("SliceStats: {} slices over {} ranks, rank {} holding slice {}", slices_, comm->size(),
                         comm->rank(), held_));
  const auto R = static_cast<std::size_t>(comm->size());
  // Doubles travel as pairs of floats: the bytes arrive unchanged.
  if (!ordered_reduce(slots_, comm->size())) {
    std::vector<double> all(R * n);
    comm->all_gather(v_.data(), all.data(), 2 * n, DType::f32);
    for (std::size_t k = 0; k < n; ++k) {
      double t = 0.0;
      for (std::size_t s = 0; s < R; ++s) t = fold(t, all[s * n + k], static_cast<int>(k));
      total_[k] = t;
    }
    return;
  }
  // Slot k goes to rank k / chunk.
  const auto chunk = static_cast<std::size_t>(chunk_doubles(slots_, comm->size()));
  std::vector<double> send(R * chunk, 0.0), recv(R * chunk);
  std::copy(v_.begin(), v_.end(), send.begin());
  comm->all_to_all(send.data(), recv.data(), 2 * chunk, DType::f32);
  std::vector<double> mine(chunk, 0.0);
  for (std::size_t j = 0; j < chunk; ++j) {
    const std::size_t k = static_cast<std::size_t>(own) * chunk + j;
    if (k >= n) break;
    double t = 0.0;
    for (std::size_t s = 0; s < R; ++s) t = fold(t, recv[s * chunk + j], static_cast<int>(k));
    mine[j] = t;
  }
  total_.resize(R * chunk);
  comm->all_gather(mine.data(), total_.data(), 2 * chunk, DType::f32);
  total_.resize(n);
}

void SliceStats::sum_over_tensor_group(Communicator& tensor, const std::vector<int>& slots) {
  if (slots.empty()) return;
  std::vector<double> v;
  v.reserve(slots.size());
  for (const int k : slots) v.push_back(total(k));
  zero::sum_over_tensor_group(tensor, v);
  for (std::size_t i = 0; i < slots.size(); ++i) total_[static_cast<std::size_t>(slots[i])] = v[i];
}

std::vector<int> tensor_offsets(const Layout& layout) {
  std::vector<int> first;
  int k = 0;
  for (int u = 0; u < layout.num_units(); ++u) {
    first.push_back(k);
    k += static_cast<int>(layout.unit(u).params.size());
  }
  first.push_back(k);
  return first;
}

}  // namespace zero
