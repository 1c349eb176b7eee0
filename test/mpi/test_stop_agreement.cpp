// zero::stop_requested across ranks: false everywhere until one rank receives a stop signal,
// then true on every rank at the same call.
#include <catch2/catch.hpp>

#include <signal.h>

#include "zero/comm.hpp"
#include "zero/context.hpp"
#include "zero/preemption.hpp"

TEST_CASE("a signal on one rank stops every rank at the same step", "[preemption]") {
  zero::Context& ctx = *zero::Context::current();
  zero::StopSignal stop;
  const int signalled = ctx.world_size() - 1;  // the last rank: not rank 0, where there are two
  int agreed_at = -1;
  for (int step = 0; step < 6; ++step) {
    if (step == 3 && ctx.rank() == signalled) ::raise(SIGUSR1);
    if (zero::stop_requested(ctx)) {
      agreed_at = step;
      break;
    }
  }
  CHECK(agreed_at == 3);
  CHECK(zero::StopSignal::received() == (ctx.rank() == signalled ? SIGUSR1 : 0));
  // Every rank saw the request at the same step.
  CHECK(ctx.comm().all_reduce_scalar(agreed_at, zero::ReduceOp::max) == 3);
}
