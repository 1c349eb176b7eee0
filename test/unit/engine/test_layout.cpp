// Layout: the per-parameter descriptors a model declares (decay, replication, tensor cuts) and
// the errors for ones that do not fit the parameter.
#include <catch2/catch.hpp>

#include "zero/error.hpp"
#include "zero/layout.hpp"

using Catch::Matchers::Contains;

TEST_CASE("layout: a tensor cut is recorded per parameter and checked against its shape", "[layout]") {
  zero::Layout l;
  const int h = l.add_unit("h.0", {{"qkv.w", {8, 12}}, {"qkv.b", {12}}, {"ln.w", {8}}});
  l.set_split(h, "qkv.w", 1, 3);
  l.set_split(h, "qkv.b", 0, 3);
  l.set_replicated(h, "ln.w");
  const auto& ps = l.unit(h).params;
  CHECK(ps[0].split_axis == 1);
  CHECK(ps[0].split_blocks == 3);
  CHECK(ps[1].split_axis == 0);
  CHECK(ps[2].split_axis == -1);
  CHECK(ps[2].split_blocks == 1);
  CHECK(ps[2].replicated);
  CHECK_FALSE(ps[0].replicated);

  REQUIRE_THROWS_WITH(l.set_split(h, "qkv.w", 2), Contains("'qkv.w'") && Contains("axis 2 does not exist"));
  REQUIRE_THROWS_WITH(l.set_split(h, "qkv.b", 0, 5), Contains("12 elements along axis 0") && Contains("5 blocks"));
  REQUIRE_THROWS_WITH(l.set_split(h, "qkv.x", 0), Contains("no parameter 'qkv.x'"));
}
