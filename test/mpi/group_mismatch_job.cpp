// Collectives issued in a different order on overlapping groups, for test/e2e/group_mismatch.py
// (which checks what the job prints and how it ends). 4 ranks, TP 2 x DP 2 (Megatron's order:
// tensor groups {0, 1} and {2, 3}, data groups {0, 2} and {1, 3}):
//   group_mismatch_job tensor-vs-data: rank 0 calls an all-reduce on its tensor group while
//     every other rank enters a reduce-scatter on its data group, then a barrier on the world.
//     Ranks 1 and 3 complete theirs; rank 0 waits for rank 1 in the tensor group and rank 2 for
//     rank 0 in the data group, each forever without a deadline.
//   group_mismatch_job data-order: on the data groups, ranks 0 and 1 all-reduce while ranks 2
//     and 3 reduce-scatter: the same communicator, so the collective check stops both groups at
//     once, long before the deadline.
#include <cstdio>
#include <string>
#include <vector>

#include "zero/comm.hpp"
#include "zero/context.hpp"
#include "zero/groups.hpp"

int main(int argc, char** argv) {
  zero::Context ctx(&argc, &argv);
  const std::string mode = argc > 1 ? argv[1] : "";
  return ctx.run([&] {
    zero::ProcessGroups g(ctx, {.tensor = 2});
    std::vector<float> v(8, 1.0f), out(4);
    g.data().all_reduce(v.data(), v.size(), zero::DType::f32);  // everyone is there once
    if (mode != "tensor-vs-data" && mode != "data-order") {
      std::fprintf(stderr, "usage: group_mismatch_job tensor-vs-data | data-order\n");
      return 2;
    }
    if (mode == "data-order") {
      if (ctx.rank() < 2)
        g.data().all_reduce(v.data(), 4, zero::DType::f32);
      else
        g.data().reduce_scatter(v.data(), out.data(), 4, zero::DType::f32);
    } else if (ctx.rank() == 0) {
      g.tensor().all_reduce(v.data(), 4, zero::DType::f32);
    } else {
      g.data().reduce_scatter(v.data(), out.data(), 4, zero::DType::f32);
    }
    ctx.comm().barrier();
    std::fprintf(stderr, "rank %d: passed the mismatched collectives\n", ctx.rank());
    return 3;
  });
}
