// What the 1-bit optimizer tests (test_onebit_adam, test_onebit_lamb) share: the layout they
// train, a run that keeps the weights and the bytes sent after every step, bit comparisons, and
// the inter-node bytes of an exact step's gradient reduce-scatter.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "engine_model.hpp"
#include "zero/context.hpp"
#include "zero/engine.hpp"

namespace zero::test::onebit {

inline Context& ctx() { return *Context::current(); }

// Units of a few hundred elements (a 1-bit scale per slice needs more than a handful of values).
inline Layout layout() {
  Layout l;
  l.add_unit("a", {{"w", {29, 23}}, {"b", {29}}});
  l.add_unit("b", {{"w", {31, 17}}, {"g", {17}}});
  l.add_unit("c", {{"w", {400}}});
  l.decay_matrices_only();
  return l;
}

struct Run {
  std::vector<std::vector<std::vector<float>>> master;  // after each step: per unit
  std::vector<TrafficBytes> sent;                       // per step
};

// `steps` steps of the engine model's training on layout() with `cfg`.
inline Run run(const Config& cfg, int steps) {
  Engine e(ctx(), cfg, layout());
  e.init_params(init_value);
  Run r;
  for (int s = 0; s < steps; ++s) {
    const TrafficBytes before = e.traffic();
    train(e, ctx().rank(), ctx().world_size(), s, 1);
    r.sent.push_back(e.traffic() - before);
    std::vector<std::vector<float>> m;
    for (int u = 0; u < e.layout().num_units(); ++u) m.push_back(e.full_master(u));
    r.master.push_back(std::move(m));
  }
  return r;
}

inline bool same_bits(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  for (std::size_t u = 0; u < a.size(); ++u)
    if (a[u].size() != b[u].size() || std::memcmp(a[u].data(), b[u].data(), a[u].size() * sizeof(float)) != 0)
      return false;
  return true;
}

// The cosine between two runs' updates from step `from` to step `to` (indices into master).
inline double update_cosine(const Run& x, const Run& y, int from, int to) {
  double dot = 0, nx = 0, ny = 0;
  for (std::size_t u = 0; u < x.master[0].size(); ++u)
    for (std::size_t i = 0; i < x.master[0][u].size(); ++i) {
      const double a = static_cast<double>(x.master[static_cast<std::size_t>(to)][u][i]) -
                       x.master[static_cast<std::size_t>(from)][u][i];
      const double b = static_cast<double>(y.master[static_cast<std::size_t>(to)][u][i]) -
                       y.master[static_cast<std::size_t>(from)][u][i];
      dot += a * b, nx += a * a, ny += b * b;
    }
  return dot / std::sqrt(nx * ny);
}

// Inter-node bytes of an exact step's gradient reduce-scatter on a rank whose ring successor is
// on the other node: (world - 1) slices of fp32 per unit (zero/comm.hpp).
inline std::int64_t reduce_scatter_bytes(int world) {
  const Layout l = layout();
  std::int64_t rs = 0;
  for (int u = 0; u < l.num_units(); ++u) rs += static_cast<std::int64_t>(world - 1) * l.slice_numel(u, world) * 4;
  return rs;
}

// A compressed step's bytes against an exact one's, on the ranks whose ring successor is on the
// other node: the difference is the exact reduce-scatter less the exchange (and less whatever
// else differs, counted against the exchange), which must be positive and at most 1/8 of it.
inline void check_exchange_bytes(const TrafficBytes& exact, const TrafficBytes& compressed, int world) {
  if (exact.inter_node == 0) return;
  const std::int64_t rs = reduce_scatter_bytes(world);
  const std::int64_t exchange = compressed.inter_node - (exact.inter_node - rs);
  if (ctx().rank() == 1)
    std::printf("  rank 1: the exact reduce-scatter sends %lld bytes across nodes, the exchange %lld\n",
                static_cast<long long>(rs), static_cast<long long>(exchange));
  INFO("exact reduce-scatter " << rs << " bytes across, the exchange " << exchange);
  CHECK(exchange > 0);
  CHECK(exchange * 8 <= rs);
}

}  // namespace zero::test::onebit
