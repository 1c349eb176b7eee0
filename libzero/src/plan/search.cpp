// The ranked enumeration of open settings (SettingsSpace::expand, rank_plans) and the largest
// model of a family that fits (max_model), each candidate planned by make_plan (plan.cpp).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "zero/error.hpp"
#include "zero/plan/plan.hpp"

namespace zero::plan {

std::vector<Settings> SettingsSpace::expand(int gpus) const {
  // An empty list takes base's value. A listed value that does not apply at a candidate's stage
  // or grid drops the candidate; base's (a config's) qgZ or PowerSGD is kept where it applies and
  // off elsewhere, its MiCS drops the candidate (as the engine refuses it).
  const std::vector<bool> qgz_list =
      quantized_gradients.empty() ? std::vector<bool>{base.quantized_gradients} : quantized_gradients;
  const std::vector<int> mics_list = mics_shard_size.empty() ? std::vector<int>{base.mics_shard_size} : mics_shard_size;
  const std::vector<int> psgd_list =
      powersgd_rank.empty() ? std::vector<int>{base.powersgd() ? base.compression.rank : 0} : powersgd_rank;
  const bool qgz_listed = !quantized_gradients.empty(), psgd_listed = !powersgd_rank.empty();
  const bool mics_off = std::find(mics_list.begin(), mics_list.end(), -1) != mics_list.end();
  std::vector<Settings> out;
  for (int tp : tensor_parallel)
    for (int pp : pipeline_parallel)
      for (int stage : stages)
        for (auto oo : offload_optimizer)
          for (auto op : offload_param)
            for (int mb : micro_batches)
              for (bool ckpt : checkpointing)
                for (int hpz : hpz_partition_size)
                  for (bool qwz : quantized_weights)
                    for (bool qgz : qgz_list)
                      for (int mics : mics_list)
                        for (int psgd : psgd_list) {
                          if (op != OffloadDevice::none && stage < 3) continue;
                          if ((hpz != 1 || qwz) && stage != 3) continue;
                          if (hpz < 1 || (gpus / std::max(1, tp * pp)) % hpz != 0) continue;
                          if (oo != OffloadDevice::none && stage == 0) continue;
                          if (tp < 1 || pp < 1 || gpus % (tp * pp) != 0) continue;
                          if (pp > 1 && stage >= 2) continue;
                          const int dp = gpus / (tp * pp);
                          // MiCS as the engine takes it: stages 1-3, a divisor, not with hpZ.
                          if (mics != -1 && (stage == 0 || mics < 1 || dp % mics != 0 || hpz != 1)) continue;
                          // One group of every rank is plain sharding: listed once, as off, when off is listed.
                          if (mics == dp && mics_off) continue;
                          // qgZ where the engine takes it: stages 2-3 without a grid or MiCS.
                          bool qg = qgz;
                          if (qg && (stage < 2 || tp * pp != 1 || mics != -1 || !base.reduce_scatter)) {
                            if (qgz_listed) continue;
                            qg = false;
                          }
                          // PowerSGD: stages 0-1 without a grid or MiCS.
                          int ps = psgd;
                          if (ps > 0 && (stage > 1 || tp * pp != 1 || mics != -1)) {
                            if (psgd_listed) continue;
                            ps = 0;
                          }
                          Settings s = base;
                          s.tensor_parallel = tp;
                          s.pipeline_parallel = pp;
                          s.stage = stage;
                          s.offload_optimizer = oo;
                          s.offload_param = op;
                          s.micro_batch = mb;
                          s.activation_checkpointing = ckpt;
                          s.hpz_partition_size = hpz;
                          s.quantized_gradients = qg;
                          s.quantized_weights = qwz;
                          s.mics_shard_size = mics;
                          s.compression.type = ps > 0 ? CompressionType::powersgd : CompressionType::none;
                          if (ps > 0) s.compression.rank = ps;
                          if (global_batch > 0)
                            s.grad_accum = static_cast<int>(std::max<std::int64_t>(
                                1, std::llround(static_cast<double>(global_batch) / (static_cast<double>(mb) * dp))));
                          out.push_back(s);
                        }
  return out;
}

std::vector<Plan> rank_plans(const GptShape& shape, const Cluster& c, const SettingsSpace& space, double budget) {
  std::vector<Plan> out;
  for (const auto& s : space.expand(c.gpus)) {
    // A tensor or pipeline size this shape cannot be split into is not a candidate for it.
    try {
      check_split(shape, s.tensor_parallel, s.pipeline_parallel);
    } catch (const Error&) {
      continue;
    }
    Plan p = make_plan(shape, c, s, budget);
    if (p.fits) out.push_back(std::move(p));
  }
  std::stable_sort(out.begin(), out.end(), [](const Plan& a, const Plan& b) {
    if (a.tokens_per_s != b.tokens_per_s) return a.tokens_per_s > b.tokens_per_s;
    return a.memory.gpu_bytes < b.memory.gpu_bytes;
  });
  return out;
}

MaxModel max_model(const GptFamily& family, const Cluster& c, const SettingsSpace& space, double budget) {
  // Fitting is monotone in the width for a fixed setting, so bisect over widths (multiples of 128).
  // Widths step by 128 x the largest tensor size, so that every tensor size considered (powers of
  // 2) divides the head count; the smallest widths can be too shallow for the pipeline, so the
  // search starts at the first width with a plan.
  int step = 128;
  for (int tp : space.tensor_parallel) step = std::max(step, 128 * tp);
  auto best_at = [&](int k) {
    GptShape s = family.shape(step * k);
    auto ranked = rank_plans(s, c, space, budget);
    return ranked.empty() ? std::optional<Plan>{} : std::optional<Plan>{ranked.front()};
  };
  MaxModel r;
  const int hi_k = std::max(2, 1024 * 128 / step);  // widths up to 131072
  int lo = 1, hi = hi_k;
  std::optional<Plan> first;
  for (; lo < hi_k && !first; ++lo) {
    first = best_at(lo);
    // Deep enough for every pipeline size and still nothing fits: a wider one will not either.
    bool deep = true;
    for (int pp : space.pipeline_parallel) deep = deep && family.shape(step * lo).n_layer >= pp;
    if (!first && deep) return r;
  }
  --lo;
  if (!first) return r;
  r.found = true;
  r.best = *first;
  while (hi - lo > 1) {
    int mid = (lo + hi) / 2;
    if (auto p = best_at(mid)) {
      lo = mid;
      r.best = *p;
    } else {
      hi = mid;
    }
  }
  return r;
}

}  // namespace zero::plan
