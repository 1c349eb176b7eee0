// OneBitLamb (DeepSpeed's 1-bit LAMB) on the engine, at stages 1 and 2:
//   - its freeze_step warm-up steps are Lamb without bias correction, bit for bit;
//   - the compressed steps follow an independent double-precision reference
//     (onebit_lamb_reference.hpp); parameters within 1e-5 of the largest weight;
//   - stages 1 and 2 give the same bits;
//   - on two simulated nodes (ZERO_RANKS_PER_NODE=2) the inter-node bytes of the exchange are at
//     least 8x fewer than those of Lamb's gradient reduce-scatter, by the communicators' counters;
//   - a resume at the same world size continues bit for bit (below).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "onebit_lamb_reference.hpp"
#include "scratch_dir.hpp"
#include "zero/checkpoint.hpp"

using namespace zero;
using namespace zero::test;
using namespace zero::test::onebit;

TEST_CASE("OneBitLamb: exact Lamb warm-up, the compressed steps as the reference, 8x fewer inter-node bytes",
          "[optim][onebit]") {
  const int world = ctx().world_size(), steps = 3 * kFreeze;
  const Run exact = onebit::run(make_config("Lamb", 1), steps);
  LambReference ref(world);
  std::vector<WeightDifference> diff;
  for (int s = 0; s < steps; ++s) ref.step(s);
  Run first;
  for (int stage : {1, 2}) {
    INFO("stage " << stage << ", " << world << " rank(s)");
    const Run ob = onebit::run(make_config("OneBitLamb", stage), steps);
    // The warm-up is Lamb without bias correction, bit for bit.
    for (int s = 0; s < kFreeze; ++s) {
      INFO("warm-up step " << s + 1);
      CHECK(same_bits(ob.master[static_cast<std::size_t>(s)], exact.master[static_cast<std::size_t>(s)]));
    }
    CHECK_FALSE(same_bits(ob.master.back(), exact.master.back()));
    // The compressed steps as the double reference's.
    std::vector<std::vector<float>> want;
    for (const auto& u : ref.w) want.emplace_back(u.begin(), u.end());
    const WeightDifference d = weight_difference(want, ob.master.back());
    const double cosine = update_cosine(ob, exact, kFreeze - 1, steps - 1);
    if (ctx().is_root())
      std::printf(
          "  %d rank(s), stage %d: after %d steps (%d compressed) the largest difference from the double "
          "reference is %.3g of the largest weight; update cosine to Lamb %.4f\n",
          world, stage, steps, steps - kFreeze, static_cast<double>(d.worst / d.largest), cosine);
    CHECK(d.worst <= 1e-5f * d.largest);
    if (stage == 1)
      first = ob;
    else
      CHECK(same_bits(ob.master.back(), first.master.back()));
    // Inter-node bytes of a compressed step against Lamb's (the one more statistic per tensor a
    // compressed step all-gathers counts against the exchange).
    const TrafficBytes a = exact.sent.back(), b = ob.sent.back();
    if (ctx().is_root())
      std::printf("  last step's bytes inter-node %lld (Lamb %lld), intra-node %lld (Lamb %lld)\n",
                  static_cast<long long>(b.inter_node), static_cast<long long>(a.inter_node),
                  static_cast<long long>(b.intra_node), static_cast<long long>(a.intra_node));
    check_exchange_bytes(a, b, world);
  }
}

// Its checkpoints keep everything it continues from: m, v and the fresh variance per element,
// the per-tensor ratios, factors and scaling coefficients, and each rank's exchange errors and
// shared momentum. So a resume at the same world size, during the warm-up or past freeze_step and
// at either stage, continues the uninterrupted run bit for bit (test_onebit_lamb_resume: at
// another world size). A checkpoint without OneBitLamb's records (OneBitAdam's, here) resumes
// during the warm-up and is refused past freeze_step, naming what it lacks.
TEST_CASE("OneBitLamb: a resume at the same world size is bit-exact, past freeze_step too",
          "[optim][onebit][checkpoint]") {
  const int world = ctx().world_size(), steps = kFreeze + 5;
  const std::string root = process_scratch_dir("onebit_lamb");
  const Run whole = onebit::run(make_config("OneBitLamb", 1), steps);
  for (const int saved : {3, kFreeze, kFreeze + 2}) {
    const std::string where = root + "/step" + std::to_string(saved);
    {
      Engine e(ctx(), make_config("OneBitLamb", 1), layout());
      e.init_params(init_value);
      train(e, ctx().rank(), world, 0, saved);
      save_checkpoint(e, where);
    }
    for (const int stage : {1, 2}) {
      INFO("saved after " << saved << " steps at stage 1, resumed at stage " << stage << " on " << world << " rank(s)");
      Engine e(ctx(), make_config("OneBitLamb", stage), layout());
      load_checkpoint(e, where);
      REQUIRE(e.global_step() == saved);
      for (int s = saved; s < steps; ++s) {
        train(e, ctx().rank(), world, s, 1);
        std::vector<std::vector<float>> got;
        for (int u = 0; u < e.layout().num_units(); ++u) got.push_back(e.full_master(u));
        INFO("step " << s + 1);
        CHECK(same_bits(got, whole.master[static_cast<std::size_t>(s)]));
      }
    }
  }
  // OneBitAdam's checkpoint holds m and v but no fresh variance or ratios.
  const std::string adam = root + "/adam";
  {
    Engine e(ctx(), make_config("OneBitAdam", 1), layout());
    e.init_params(init_value);
    train(e, ctx().rank(), world, 0, kFreeze + 2);
    save_checkpoint(e, adam);
  }
  Engine e(ctx(), make_config("OneBitLamb", 1), layout());
  CheckpointLoadOptions change;
  change.allow_config_change = true;
  load_checkpoint(e, adam, "latest", change);
  REQUIRE_THROWS_WITH(train(e, ctx().rank(), world, kFreeze + 2, 1),
                      Catch::Contains("past freeze_step") && Catch::Contains("without OneBitLamb's fresh variance"));
}
