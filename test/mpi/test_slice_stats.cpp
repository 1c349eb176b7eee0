// SliceStats::combine over the ranks: each rank holds its own slice only, and the totals are the
// slices folded in slice order (sums; the last slots by their largest value), bit for bit as the
// test folds them itself, whether combine all-gathers the values or, for many slots, runs its
// ordered reduce (an all-to-all of chunks, then an all-gather of the chunks' totals). The bytes
// sent are those of the collectives it names.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "optim/optimizer.hpp"
#include "zero/comm.hpp"
#include "zero/context.hpp"

using namespace zero;

namespace {

// Slice s's value of slot k: mixed signs and magnitudes, so that the order of the additions
// shows in the bits.
double value(int s, std::int64_t k) {
  const double x = std::sin(static_cast<double>(k) * 0.37 + s * 1.91);
  return (k + s) % 5 == 0 ? x * 1e8 : x;
}

// Lane slot l's fold state on slice s.
void fill_fold(double* f, int s, int l) {
  for (int i = 0; i < offload::kStatFold; ++i) f[i] = value(s + 7 * l, i + 1000) * 1e-3;
}

}  // namespace

TEST_CASE("SliceStats: totals in slice order, all-gathered or by the ordered reduce", "[optimizer]") {
  Communicator& comm = Context::current()->comm();
  const int R = comm.size(), me = comm.rank();
  const std::int64_t large = (std::int64_t{1} << 20) / R + 13;
  for (const std::int64_t slots : {std::int64_t{1000}, large}) {
    const bool ordered = slots == large;
    INFO(slots << " slots over " << R << " ranks");
    REQUIRE(SliceStats::ordered_reduce(slots, R) == ordered);
    const int lane_slots = 2, max_from = static_cast<int>(slots) - 3;
    SliceStats st;
    st.reset(static_cast<int>(slots), R, lane_slots, me, max_from);
    for (int l = 0; l < lane_slots; ++l) fill_fold(st.lanes(l, me), me, l);
    for (std::int64_t k = lane_slots; k < slots; ++k) st.at(static_cast<int>(k), me) = value(me, k);
    if (R > 1) REQUIRE_THROWS(st.at(0, (me + 1) % R));  // a rank holds its own slice only

    const TrafficBytes before = comm.traffic();
    st.combine(&comm, me);
    const TrafficBytes sent = comm.traffic() - before;

    std::int64_t wrong = 0;
    for (std::int64_t k = 0; k < slots; ++k) {
      double want = 0.0;
      for (int s = 0; s < R; ++s) {
        double x = value(s, k);
        if (k < lane_slots) {
          double f[offload::kStatFold];
          fill_fold(f, s, static_cast<int>(k));
          x = offload::fold_total(f);
        }
        want = k >= max_from ? std::max(want, x) : want + x;
      }
      if (st.total(static_cast<int>(k)) != want) ++wrong;
    }
    CHECK(wrong == 0);
    // The order matters to these values: slice order reversed gives other bits somewhere.
    if (R > 2) {
      std::int64_t differ = 0;
      for (std::int64_t k = lane_slots; k < max_from; ++k) {
        double back = 0.0;
        for (int s = R - 1; s >= 0; --s) back += value(s, k);
        differ += back != st.total(static_cast<int>(k));
      }
      CHECK(differ > 0);
    }
    if (R > 1) {
      const std::int64_t chunk = SliceStats::chunk_doubles(slots, R);
      const std::int64_t want =
          ordered ? (R - 1) * 2 * chunk * 4 + ring_gather_bytes(R, 2 * chunk, 4) : ring_gather_bytes(R, 2 * slots, 4);
      CHECK(sent.intra_node + sent.inter_node == want);
    }
  }
}
