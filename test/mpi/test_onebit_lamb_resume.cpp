// OneBitLamb resumed past freeze_step at another world size and stage. A process cannot change
// its world size, so two ctest entries share ZERO_ONEBIT_CKPT_DIR:
//   [save] at 4 ranks, stage 1: 10 steps (freeze_step 6), saved;
//   [load] at 2 ranks, stage 2: the state loaded is the saved one bit for bit (m, v and the fresh
//          variance re-cut, read back against the checkpoint's whole units), and 5 more steps
//          follow the double reference (onebit_lamb_reference.hpp) trained 10 steps at 4 ranks
//          and continued at 2 with the exchange's per-rank state started again, as the engine
//          does at another world size: within 1e-5 of the largest weight, the bound the
//          reference holds the uninterrupted runs to (test_onebit_lamb).
// At the same world size the resume is bit-exact (test_onebit_lamb).
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/format.hpp"
#include "checkpoint_common.hpp"
#include "onebit_lamb_reference.hpp"
#include "zero/checkpoint.hpp"
#include "zero/engine_state.hpp"

using namespace zero;
using namespace zero::test;
using namespace zero::test::onebit;

namespace {

constexpr int kSaved = 10, kMore = 5;

std::string root() { return cktest::dir_from_env("ZERO_ONEBIT_CKPT_DIR") + "/onebit_lamb_n4"; }

}  // namespace

TEST_CASE("OneBitLamb: 10 steps at 4 ranks, saved past freeze_step", "[.][save]") {
  REQUIRE(ctx().world_size() == 4);
  Engine e(ctx(), make_config("OneBitLamb", 1), layout());
  e.init_params(init_value);
  train(e, ctx().rank(), 4, 0, kSaved);
  if (ctx().is_root()) std::filesystem::remove_all(root());  // a previous run's
  ctx().comm().barrier();
  save_checkpoint(e, root());
}

TEST_CASE("OneBitLamb: resumed at 2 ranks and stage 2 from 4 ranks at stage 1", "[.][load]") {
  REQUIRE(ctx().world_size() == 2);
  Engine e(ctx(), make_config("OneBitLamb", 2), layout());
  load_checkpoint(e, root());
  REQUIRE(e.global_step() == kSaved);

  // The restored state against the checkpoint's whole units: master, m, v, fresh variance.
  EngineState st(e);
  REQUIRE(st.optimizer_moments() == 3);
  ckpt::ModelReader whole(ckpt::resolve(root(), "latest"));
  REQUIRE(whole.meta().tensor_records.at("coeff_freeze").size() == 5);
  for (int u = 0; u < e.layout().num_units(); ++u) {
    const std::size_t n = static_cast<std::size_t>(e.layout().unit(u).numel);
    std::vector<std::vector<float>> saved(4, std::vector<float>(n));
    std::vector<float*> out{saved[0].data(), saved[1].data(), saved[2].data(), saved[3].data()};
    whole.read_unit(u, out);
    const OwnedRange r = st.owned_range(u);
    std::vector<float> mine(static_cast<std::size_t>(r.len));
    for (int k = 0; k < 4; ++k) {
      st.read_owned(u, k, mine.data());
      const std::size_t b = static_cast<std::size_t>(r.begin), len = std::min(n - std::min(n, b), mine.size());
      INFO("unit " << u << ", array " << k);
      CHECK(std::memcmp(mine.data(), saved[static_cast<std::size_t>(k)].data() + b, len * sizeof(float)) == 0);
    }
  }
  // The fresh variance is not v any more (the compressed steps moved it): a real record.
  {
    std::vector<float> v(static_cast<std::size_t>(st.owned_range(0).len)), fresh(v.size());
    st.read_owned(0, 2, v.data());
    st.read_owned(0, 3, fresh.data());
    CHECK(std::memcmp(v.data(), fresh.data(), v.size() * sizeof(float)) != 0);
  }

  train(e, ctx().rank(), 2, kSaved, kMore);
  LambReference ref(4);
  for (int s = 0; s < kSaved; ++s) ref.step(s);
  ref.regrid(2);
  for (int s = kSaved; s < kSaved + kMore; ++s) ref.step(s);
  std::vector<std::vector<float>> want, got;
  for (const auto& u : ref.w) want.emplace_back(u.begin(), u.end());
  for (int u = 0; u < e.layout().num_units(); ++u) got.push_back(e.full_master(u));
  const WeightDifference d = weight_difference(want, got);
  if (ctx().is_root())
    std::printf(
        "  saved at 4 ranks (stage 1) after %d steps, %d more at 2 ranks (stage 2): the largest difference from "
        "the double reference is %.3g of the largest weight\n",
        kSaved, kMore, static_cast<double>(d.worst / d.largest));
  CHECK(d.worst <= 1e-5f * d.largest);
  // Without the per-tensor records the run would have been refused; without the restart of the
  // exchange it would not follow the reference: the check above covers both.
}
