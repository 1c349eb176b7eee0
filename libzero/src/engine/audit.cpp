// The gradient audit (debug.audit_interval): on an audited step each rank keeps its local
// gradient as the backward left it (reduce(), summed over the micro-steps, fp32 on the host); at
// the step the kept gradients are summed over the data-parallel ranks with one plain all-reduce,
// an independent path, and each unit's squared norm is compared with that of the engine's
// reduction (the owned slices, summed over the partition group). A difference beyond rounding
// stops the job on every rank, naming the unit.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine/engine_impl.hpp"
#include "zero/error.hpp"

namespace zero {

namespace {

// n values at `p` (backend memory, dtype t) as fp32 host values, as full_params() reads them.
std::vector<float> host_values(Backend& b, const void* p, DType t, std::int64_t n) {
  std::vector<char> raw(static_cast<std::size_t>(n) * dtype_size(t));
  b.to_host(raw.data(), p, raw.size());
  std::vector<float> out(static_cast<std::size_t>(n));
  convert(raw.data(), t, out.data(), DType::f32, out.size());
  return out;
}

double sum_squares(const std::vector<float>& v) {
  double s = 0.0;
  for (float x : v) s += static_cast<double>(x) * x;
  return s;
}

}  // namespace

void EngineImpl::audit_add(int unit) {
  audit_.resize(static_cast<std::size_t>(layout_.num_units()));
  const std::int64_t n = shape(unit).numel;
  std::vector<float> g = host_values(*backend_, reducer_.grads(unit), dtype_, n);
  auto& kept = audit_[static_cast<std::size_t>(unit)];
  // An accumulating buffer already holds the micro-steps so far; a per-micro-step one is added.
  if (kept.empty() || reducer_.grads_accumulate()) {
    kept = std::move(g);
    return;
  }
  for (std::size_t i = 0; i < kept.size(); ++i) kept[i] += g[i];
}

void EngineImpl::audit_check() {
  ZERO_CHECK(static_cast<int>(audit_.size()) == layout_.num_units(),
             "gradient audit: no local gradient was kept this step (was reduce() called for every unit?)");
  const DType gt = reducer_.grad_dtype();
  // Test hook: ZERO_AUDIT_CORRUPT=<unit> doubles that unit's reduced slice on the first rank, a
  // wrong reduction for the audit's own test to catch.
  const char* corrupt = std::getenv("ZERO_AUDIT_CORRUPT");
  // 16-bit sums round every partial sum; fp32 differs from fp32 by summation order only.
  const double tol = dtype_ == DType::f32 && gt == DType::f32 && cfg_.comm_dtype() == DType::f32 ? 1e-5 : 5e-2;
  Communicator& dp = all_ranks();
  std::vector<float> rels(static_cast<std::size_t>(layout_.num_units()), 0.0f);
  std::vector<double> plains(rels.size()), engines(rels.size());
  for (int i = 0; i < layout_.num_units(); ++i) {
    const UnitShape& s = shape(i);
    std::vector<float>& local = audit_[static_cast<std::size_t>(i)];
    local.resize(static_cast<std::size_t>(s.numel), 0.0f);
    const CommSiteScope site("gradient audit");
    dp.all_reduce(local.data(), local.size(), DType::f32, ReduceOp::sum);
    const double plain = sum_squares(local);
    const std::int64_t own = std::max<std::int64_t>(0, std::min(s.own_len, s.numel - s.own_begin));
    if (corrupt && layout_.unit(i).name == corrupt && comm_.rank() == 0 && own > 0) {
      std::vector<float> v = host_values(*backend_, reducer_.owned(i), gt, own);
      for (float& x : v) x *= 2.0f;
      std::vector<char> back(static_cast<std::size_t>(own) * dtype_size(gt));
      convert(v.data(), DType::f32, back.data(), gt, v.size());
      backend_->from_host(reducer_.owned(i), back.data(), back.size());
    }
    double engine = own > 0 ? sum_squares(host_values(*backend_, reducer_.owned(i), gt, own)) : 0.0;
    if (stage_ > 0) engine = comm_.all_reduce_scalar(engine, ReduceOp::sum);
    plains[static_cast<std::size_t>(i)] = plain;
    engines[static_cast<std::size_t>(i)] = engine;
    if (!std::isfinite(plain) || !std::isfinite(engine)) continue;  // an overflow: the step skips
    rels[static_cast<std::size_t>(i)] = static_cast<float>(std::abs(engine - plain) / std::max({plain, engine, 1e-30}));
  }
  audit_.clear();
  // One verdict on every rank (at stage 0 each rank holds its own copy of the reduction).
  dp.all_reduce(rels.data(), rels.size(), DType::f32, ReduceOp::max);
  int worst = -1;
  for (int i = 0; i < static_cast<int>(rels.size()); ++i)
    if (rels[static_cast<std::size_t>(i)] > tol &&
        (worst < 0 || rels[static_cast<std::size_t>(i)] > rels[static_cast<std::size_t>(worst)]))
      worst = i;
  if (worst < 0) return;
  const double worst_rel = rels[static_cast<std::size_t>(worst)], worst_plain = plains[static_cast<std::size_t>(worst)],
               worst_engine = engines[static_cast<std::size_t>(worst)];
  ZERO_THROW(fmt::format(
      "gradient audit (debug.audit_interval {}) at step {}: unit '{}' has a gradient norm of {:.9g} through the "
      "engine's reduction (stage {}; this rank's view) but {:.9g} through a plain all-reduce of the ranks' local "
      "gradients "
      "(relative difference of the squares {:.3g}, tolerance {:.0e}): the reduction is wrong. Stop here; rerun "
      "with another stage, reduce_bucket_size or overlap_comm to narrow it down, and report it with this message",
      cfg_.audit_interval, step_ + 1, layout_.unit(worst).name, std::sqrt(worst_engine), stage_, std::sqrt(worst_plain),
      worst_rel, tol));
}

}  // namespace zero
