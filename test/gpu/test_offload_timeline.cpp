// The offload staging's timeline (OffloadStaging::set_timeline, used by
// bench_offload_timeline): with offload_optimizer: cpu on the CUDA backend, a traced step records
// one group per sub-group in the engine's visiting order, with times that respect causality
// (a sub-group's copy out ends before the host steps it, its copy back starts after the host is
// done, copies on one stream come out in order); removing the sink stops the recording; and
// tracing leaves the training result bit for bit unchanged.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "engine/engine_impl.hpp"
#include "gpu_test_util.hpp"
#include "zero/engine.hpp"

using namespace zero;
using namespace zero::gputest;

namespace {

constexpr std::int64_t kSubGroup = 1024;

Layout timeline_layout() {
  Layout l;
  l.add_unit("a", {{"w", {3000}}});
  l.add_unit("b", {{"w", {50, 100}}, {"bias", {100}}});
  l.add_unit("c", {{"w", {7}}});
  return l;
}

Config timeline_config(int stage) {
  std::string y = "backend: cuda\ncomm: " + test_comm() + "\n";
  y += "train_micro_batch_size_per_gpu: 1\ngradient_accumulation_steps: 1\ngradient_clipping: 1.0\n";
  y += "bf16:\n  enabled: true\n";
  y += "optimizer:\n  type: AdamW\n  params:\n    lr: 0.01\n    weight_decay: 0.1\n";
  y += "zero_optimization:\n  stage: " + std::to_string(stage) + "\n  sub_group_size: " + std::to_string(kSubGroup) +
       "\n  offload_optimizer:\n    device: cpu\n";
  Config cfg = parse_config(y, "test_offload_timeline");
  cfg.resolve(ctx().world_size());
  return cfg;
}

// One step with gradients of a fixed finite value (bf16 0x3C3C) in every unit.
void step(Engine& e) {
  for (int u = 0; u < e.layout().num_units(); ++u) {
    UnitGrads g = e.grads(u);
    const auto bytes = static_cast<std::size_t>(e.layout().unit(u).numel) * 2;
    REQUIRE(cudaMemsetAsync(g.data(), 0x3C, bytes, cudaStreamLegacy) == cudaSuccess);
    e.reduce(u);
  }
  REQUIRE_FALSE(e.step().skipped);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
}

void init(Engine& e) {
  e.init_params([](const ParamInfo& p, std::span<float> v) {
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = 0.25f + 0.001f * static_cast<float>((i + p.name.size()) % 17);
  });
}

}  // namespace

TEST_CASE("offload timeline: one group per sub-group, in causal order", "[offload][timeline]") {
  for (int stage : {1, 2}) {
    DYNAMIC_SECTION("stage " << stage) {
      const Config cfg = timeline_config(stage);
      Engine traced(ctx(), cfg, timeline_layout());
      Engine plain(ctx(), cfg, timeline_layout());
      init(traced);
      init(plain);
      OffloadStaging* staging = engine_backend(traced).offload_staging();
      REQUIRE(staging != nullptr);
      OffloadTimeline tl;
      staging->set_timeline(&tl);
      for (int s = 0; s < 3; ++s) {
        step(traced);
        step(plain);
      }

      // The sub-groups as the optimizer store visits them: each unit's owned slice cut into
      // sub_group_size pieces, units in order (range r is unit r).
      const int world = ctx().world_size();
      struct Expected {
        std::size_t range, begin, n;
      };
      std::vector<Expected> expected;
      for (int u = 0; u < traced.layout().num_units(); ++u) {
        const std::int64_t len = traced.layout().slice_numel(u, world);
        for (std::int64_t b = 0; b < len; b += kSubGroup)
          expected.push_back({static_cast<std::size_t>(u), static_cast<std::size_t>(b),
                              static_cast<std::size_t>(std::min(kSubGroup, len - b))});
      }
      REQUIRE(tl.groups.size() == expected.size());
      REQUIRE(tl.origin_s > 0.0);
      // The two clocks are aligned at the instant the host saw the origin event complete, so a
      // device time before a host instant reads at most origin_uncertainty after it, and a
      // device time after a host instant never reads before it (backend.hpp). The events'
      // own resolution is about half a microsecond.
      const double resolution = 1e-3;  // ms
      const double tol = tl.origin_uncertainty + resolution;
      REQUIRE(tl.origin_uncertainty >= 0.0);
      for (std::size_t k = 0; k < expected.size(); ++k) {
        const OffloadTimeline::Group& g = tl.groups[k];
        INFO("group " << k << " range " << g.range << " begin " << g.begin);
        CHECK(g.range == expected[k].range);
        CHECK(g.begin == expected[k].begin);
        CHECK(g.n == expected[k].n);
        CHECK(g.d2h_start >= 0.0);
        CHECK(g.d2h_end >= g.d2h_start);
        CHECK(g.d2h_end <= g.host_start + tol);  // the host steps gradients that have arrived
        CHECK(g.wait_start <= g.host_start);
        CHECK(g.host_start <= g.host_end);
        CHECK(g.h2d_start >= g.host_end - resolution);  // the copy back is enqueued after the host step
        CHECK(g.h2d_end >= g.h2d_start);
        CHECK(g.host_end <= tl.finish);
        if (k > 0) {
          // One copy stream each way: copies complete in the order they were issued.
          CHECK(g.d2h_start >= tl.groups[k - 1].d2h_end - resolution);
          CHECK(g.h2d_start >= tl.groups[k - 1].h2d_end - resolution);
          CHECK(g.wait_start >= tl.groups[k - 1].host_end);
        }
      }

      // Without the sink, nothing is recorded.
      staging->set_timeline(nullptr);
      const OffloadTimeline before = tl;
      step(traced);
      step(plain);
      REQUIRE(tl.groups.size() == before.groups.size());
      CHECK(tl.origin_s == before.origin_s);
      CHECK(tl.finish == before.finish);

      // Tracing changes no result.
      for (int u = 0; u < traced.layout().num_units(); ++u) {
        INFO("unit " << u);
        CHECK(traced.full_master(u) == plain.full_master(u));
        CHECK(traced.full_params(u) == plain.full_params(u));
      }
    }
  }
}
