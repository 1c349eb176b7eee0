// The metadata's optimizer values per parameter (OneBitLamb's trust ratios, last factors and
// scaling coefficients: "optimizer_tensors"): written only when the optimizer keeps some, read
// back bit for bit, and refused where they cannot belong to the units listed.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <string>

#include "checkpoint/format.hpp"
#include "checkpoint/json.hpp"
#include "zero/error.hpp"

using namespace zero;

namespace {

// Two units of two and one parameters, a OneBitLamb checkpoint of 2 ranks.
ckpt::Metadata onebit_metadata() {
  ckpt::Metadata m;
  m.step = m.applied = m.scheduler_step = 10;
  m.world = 2, m.stage = 1, m.moments = 3;
  m.optimizer = "OneBitLamb", m.scheduler = "none";
  m.units.push_back({"a", 40, 64, {{"w", {5, 6}, 30, 0}, {"b", {10}, 10, 30}}});
  m.units.push_back({"c", 7, 64, {{"w", {7}, 7, 0}}});
  m.shards = {{"shard_00000.ckpt", 100, 1}, {"shard_00001.ckpt", 100, 2}};
  // Values whose shortest text has 17 digits, and one below the normal range.
  m.tensor_records = {
      {"coeff_freeze", {0.1 + 0.2, 1.0 / 3.0, 5e-324}}, {"last_factor", {1.0, 0.9, 1.1}}, {"scaling_coeff", {}}};
  return m;
}

std::string error_of(const std::string& text) {
  try {
    (void)ckpt::Metadata::parse(text, "meta");
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("metadata: the optimizer's values per parameter round-trip bit for bit") {
  const ckpt::Metadata m = onebit_metadata();
  const ckpt::Metadata b = ckpt::Metadata::parse(m.to_json(), "meta");
  REQUIRE(b.tensor_records.size() == 3);
  for (const auto& [name, values] : m.tensor_records) {
    INFO(name);
    const std::vector<double>& got = b.tensor_records.at(name);
    REQUIRE(got.size() == values.size());
    CHECK(std::memcmp(got.data(), values.data(), values.size() * sizeof(double)) == 0);
  }
  CHECK(b.moments == 3);
  // None: no field at all, so checkpoints of the other optimizers read as before.
  ckpt::Metadata plain = m;
  plain.tensor_records.clear();
  CHECK(plain.to_json().find("optimizer_tensors") == std::string::npos);
  CHECK(ckpt::Metadata::parse(plain.to_json(), "meta").tensor_records.empty());
  // A OneBitLamb checkpoint of 2 moments (saved before the fresh variance was kept) still reads.
  plain.moments = 2;
  CHECK(ckpt::Metadata::parse(plain.to_json(), "meta").moments == 2);
}

TEST_CASE("metadata: the optimizer's values per parameter are refused where they cannot belong") {
  const std::string text = onebit_metadata().to_json();
  json::Json d = json::parse(text, "t");
  d["optimizer_tensors"]["coeff_freeze"].push_back(1.0);  // 4 values for 3 parameters
  std::string e = error_of(d.dump());
  CHECK_THAT(e, Catch::Contains("optimizer_tensors.coeff_freeze") && Catch::Contains("lists 4 values") &&
                    Catch::Contains("3 parameters"));
  d = json::parse(text, "t");
  d["optimizer_tensors"]["last_factor"][1] = "0.9";
  CHECK_THAT(error_of(d.dump()), Catch::Contains("optimizer_tensors.last_factor[1]"));
  // Not finite: refused on the way out.
  ckpt::Metadata m = onebit_metadata();
  m.tensor_records["last_factor"][2] = std::nan("");
  CHECK_THROWS_WITH(m.to_json(), Catch::Contains("'last_factor'") && Catch::Contains("not finite"));
  // More arrays than OneBitLamb's moments allow.
  d = json::parse(text, "t");
  d["optimizer_moments"] = 4;
  CHECK_THAT(error_of(d.dump()), Catch::Contains("optimizer_moments"));
}
