// Layout: the model's parameters, named and shaped, grouped into units (a transformer block, the
// embeddings: the granule of all-gather and reduce-scatter), and which ones take weight decay.
// One partition for every stage: docs/architecture.md, note units.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace zero {

struct ParamInfo {
  std::string name;
  std::vector<std::int64_t> shape;
  std::int64_t numel = 0;
  std::int64_t offset = 0;  // element offset inside the unit's flat storage
  bool decay = true;        // the optimizer's weight decay applies to it
  // The unit it belongs to (UnitInfo::name). Parameter names need only be unique within their
  // unit ("w" and "b" in every layer); an initialiser tells them apart by unit and name.
  std::string unit;
  // Under tensor parallelism (zero/groups.hpp): the same values on every rank of the tensor
  // group (a LayerNorm gain, a row-parallel bias), so the global gradient norm counts it once.
  // Otherwise (the default) each rank of the model group holds its own part.
  bool replicated = false;
  // Under tensor parallelism, a parameter cut across the tensor group: the axis of the whole
  // tensor it is cut along (-1: not cut), and how many equal blocks along that axis are each cut
  // into T parts (GPT-2's fused QKV [C, 3C] has 3: rank t holds [q_t | k_t | v_t]). `shape` is
  // the rank's part; the whole tensor has shape[split_axis] x T. Checkpoint tools read it to
  // put a tensor-parallel model back together (zero-ckpt export).
  int split_axis = -1;
  int split_blocks = 1;
  // Under pipeline parallelism, a copy of a parameter that another rank of the model group holds
  // too and counts in the global gradient norm (GPT's tied wte: the last pipeline part's copy of the
  // first part's embedding, the same name, values and summed gradient). This rank leaves it out of its
  // part of the norm, so the parameter counts once. Updated like any other parameter.
  bool norm_counted_elsewhere = false;
  // An embedding table or output head: optimizers that treat matrices apart (Muon) step it with
  // their rule for the other parameters, as every Muon implementation does.
  bool embedding = false;
};

struct UnitInfo {
  std::string name;
  std::vector<ParamInfo> params;
  std::int64_t numel = 0;                       // sum of its parameters, without padding
  int find_param(std::string_view name) const;  // -1 when absent
};

class Layout {
 public:
  using Shape = std::vector<std::int64_t>;
  // Adds a unit; returns its id (0, 1, ...). Names must be unique; shapes positive.
  int add_unit(std::string name, std::vector<std::pair<std::string, Shape>> params);

  int num_units() const { return static_cast<int>(units_.size()); }
  const UnitInfo& unit(int id) const;
  // Unit id by name; throws zero::Error naming the closest unit when absent.
  int find_unit(std::string_view name) const;
  std::int64_t num_params() const;  // Ψ: every parameter element, no padding
  const std::vector<UnitInfo>& units() const { return units_; }

  // Weight decay per parameter (every parameter decays unless told otherwise). Throws
  // zero::Error naming the closest unit or parameter when absent.
  void set_decay(int unit, std::string_view param, bool decay);
  // The GPT-2 rule: parameters with fewer than two dimensions (biases, LayerNorm gains and
  // shifts) get no weight decay; matrices and embeddings keep it.
  void decay_matrices_only();
  // Marks a parameter as replicated across the tensor-parallel group (see ParamInfo::replicated).
  void set_replicated(int unit, std::string_view param, bool replicated = true);
  // Marks an embedding table or output head (see ParamInfo::embedding).
  void set_embedding(int unit, std::string_view param, bool embedding = true);
  // Marks a parameter as a copy whose gradient norm another rank counts (see
  // ParamInfo::norm_counted_elsewhere).
  void set_norm_counted_elsewhere(int unit, std::string_view param, bool elsewhere = true);
  // Marks a parameter as cut across the tensor-parallel group (see ParamInfo::split_axis). The
  // axis must exist in its shape and its extent divide by `blocks`.
  void set_split(int unit, std::string_view param, int axis, int blocks = 1);

  // Elements per rank slice of `unit` for `world` ranks: numel rounded up so that
  // slice * world >= numel and the slice is a multiple of kSliceAlign elements.
  static constexpr std::int64_t kSliceAlign = 64;  // 128 bytes of 16-bit values
  std::int64_t slice_numel(int unit, int world) const;
  std::int64_t padded_numel(int unit, int world) const { return slice_numel(unit, world) * world; }

 private:
  ParamInfo& param(int unit, std::string_view param, const char* what);  // throws naming the closest
  std::vector<UnitInfo> units_;
};

}  // namespace zero
