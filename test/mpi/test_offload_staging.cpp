// The staged offload step, the one a device backend runs (OffloadStaging, engine/step.cpp), on
// the host backend imitating a device (ZERO_HOST_STAGING=1, backend/host_staging.hpp): the
// gradients reach the host only through host_grads, the parameters go back only at finish().
// Optimizers visiting their state in several passes (Lamb, Adafactor, Muon) read the gradients
// staged once in every pass and hand each parameter back once, in the last; the result is the
// same bit for bit as the state kept in backend memory and as offload stepped in place.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/host_staging.hpp"
#include "engine/engine_impl.hpp"
#include "engine_model.hpp"
#include "scratch_dir.hpp"
#include "zero/context.hpp"
#include "zero/engine.hpp"

using namespace zero;
using namespace zero::test;

namespace {

Context& ctx() { return *Context::current(); }

constexpr int kSteps = 4;
constexpr int kSubGroup = 100;

struct Multipass {
  std::string type, params;
  int passes;
};

std::vector<Multipass> multipass_optimizers() {
  return {{"Lamb", "    weight_decay: 0.1\n", 2},
          {"Adafactor", "    beta1: 0.9\n    scale_parameter: true\n    weight_decay: 0.1\n", 3},
          {"Muon", "    weight_decay: 0.1\n    betas: [0.9, 0.95]\n", 2},
          {"AdamW", "    weight_decay: 0.1\n", 1}};
}

struct Outcome {
  std::vector<std::vector<float>> params, master;
  HostOffloadStaging::Counts counts;  // zero where nothing was staged
};

// Five steps of engine_model.hpp's training; `staged`: with ZERO_HOST_STAGING=1 while the engine
// is made (the host backend reads it then).
Outcome train_with(const Multipass& o, int stage, const std::string& dtype, const std::string& device, bool staged) {
  std::string y = "train_micro_batch_size_per_gpu: 2\ngradient_accumulation_steps: 2\n";
  y += "zero_optimization:\n  stage: " + std::to_string(stage) + "\n  stage3_param_persistence_threshold: 0\n";
  y += "  sub_group_size: " + std::to_string(kSubGroup) + "\n";
  y += "  offload_optimizer:\n    device: " + device + "\n    nvme_path: " + process_scratch_dir("offload_staging") +
       "\n";
  if (dtype != "fp32") y += dtype + ":\n  enabled: true\n";
  y += "optimizer:\n  type: " + o.type + "\n  params:\n    lr: 0.01\n" + o.params;
  Config cfg = parse_config(y, "test_offload_staging");
  cfg.resolve(ctx().world_size());
  if (staged) ::setenv("ZERO_HOST_STAGING", "1", 1);
  Engine e(ctx(), cfg, make_cut_matrix_layout());
  ::unsetenv("ZERO_HOST_STAGING");
  OffloadStaging* staging = engine_backend(e).offload_staging();
  REQUIRE((staging != nullptr) == staged);
  e.init_params(init_value);
  train(e, ctx().rank(), ctx().world_size(), 0, kSteps);
  Outcome out;
  for (int u = 0; u < e.layout().num_units(); ++u) {
    out.params.push_back(e.full_params(u));
    out.master.push_back(e.full_master(u));
  }
  if (staged) {
    auto* host = dynamic_cast<HostOffloadStaging*>(staging);
    REQUIRE(host != nullptr);
    out.counts = host->counts();
  }
  return out;
}

}  // namespace

TEST_CASE("staged offload of multi-pass optimizers equals unstaged offload bit for bit", "[offload][staging]") {
  for (const Multipass& o : multipass_optimizers())
    for (int stage = 1; stage <= 3; ++stage) {
      const std::string dtype = stage == 2 ? "fp32" : "bf16";
      SECTION(o.type + " stage " + std::to_string(stage) + " " + dtype) {
        const Outcome in_place = train_with(o, stage, dtype, "cpu", false);
        for (const char* device : {"cpu", "nvme"}) {
          INFO(o.type << " stage " << stage << " " << dtype << " offload_optimizer.device " << device << " at "
                      << ctx().world_size() << " rank(s)");
          const Outcome got = train_with(o, stage, dtype, device, true);
          CHECK(got.params == in_place.params);  // no NaN to hide behind: a NaN would fail too
          CHECK(got.master == in_place.master);
          const HostOffloadStaging::Counts& c = got.counts;
          CHECK(c.steps == kSteps);
          // Each gradient chunk (one sub-group) crosses once a step, whatever the passes; every
          // pass asks for it; every owned parameter goes back exactly once a step.
          REQUIRE(c.chunk_copies > 0);
          CHECK(c.host_grads == o.passes * c.chunk_copies);
          CHECK(c.chunk_copies >= c.grad_elements / kSubGroup);
          CHECK(c.params_back == c.grad_elements);
        }
      }
    }
}

TEST_CASE("staged offload of a multi-pass optimizer equals state in backend memory", "[offload][staging]") {
  const Multipass lamb = multipass_optimizers()[0];
  const Outcome staged = train_with(lamb, 1, "bf16", "cpu", true);
  // The same engine, state in backend memory and no offload: the update without any staging.
  std::string y = "train_micro_batch_size_per_gpu: 2\ngradient_accumulation_steps: 2\n";
  y += "zero_optimization:\n  stage: 1\nbf16:\n  enabled: true\n";
  y += "optimizer:\n  type: Lamb\n  params:\n    lr: 0.01\n" + lamb.params;
  Config cfg = parse_config(y, "test_offload_staging");
  cfg.resolve(ctx().world_size());
  Engine e(ctx(), cfg, make_cut_matrix_layout());
  e.init_params(init_value);
  train(e, ctx().rank(), ctx().world_size(), 0, kSteps);
  for (int u = 0; u < e.layout().num_units(); ++u) {
    INFO("unit " << u);
    CHECK(staged.params[static_cast<std::size_t>(u)] == e.full_params(u));
  }
}

// The imitation keeps a device's ordering: a chunk not waited for reads NaN, the parameters
// land at finish() only, and a parameter handed back twice or never is refused.
TEST_CASE("the host imitation of device staging holds the engine to the protocol", "[offload][staging]") {
  std::vector<float> grads(10), params(10, -1.0f);
  for (int i = 0; i < 10; ++i) grads[static_cast<std::size_t>(i)] = static_cast<float>(i);
  HostOffloadStaging s;
  s.begin(sizeof(float), sizeof(float), 4);
  s.add(grads.data(), params.data(), 10);
  const auto* g = static_cast<const float*>(s.host_grads(0, 4, 2));
  CHECK(g[0] == 4.0f);
  CHECK(g[3] == 7.0f);       // the whole chunk [4, 8) arrived
  CHECK(std::isnan(g[4]));   // chunk [8, 10) was not waited for
  CHECK(std::isnan(g[-4]));  // nor chunk [0, 4)
  auto* p = static_cast<float*>(s.host_params(0, 0));
  for (int i = 0; i < 10; ++i) p[i] = 2.0f * static_cast<float>(i);
  s.params_ready(0, 0, 6);
  CHECK_THROWS_WITH(s.params_ready(0, 5, 1), Catch::Contains("handed back twice"));
  CHECK_THROWS_WITH(s.finish(), Catch::Contains("element 6 of 10 was never handed back"));
  s.params_ready(0, 6, 4);
  CHECK(params[9] == -1.0f);  // queued, not yet copied
  s.finish();
  CHECK(params[9] == 18.0f);
  CHECK(params[0] == 0.0f);
  CHECK(s.counts().chunk_copies == 1);
  CHECK(s.counts().params_back == 10);
  CHECK_THROWS_WITH(s.host_grads(1, 0, 1), Catch::Contains("was not declared by add()"));
}
