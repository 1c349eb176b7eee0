// Catch2 main for multi-rank tests: every rank runs the same test cases (collectives must be
// entered by all ranks), each rank reports its own failures, and the job fails if any rank failed.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>

#include "zero/comm.hpp"
#include "zero/context.hpp"

int main(int argc, char** argv) {
  zero::Context ctx(&argc, &argv);
  Catch::Session session;
  if (int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;
  int failed = session.run();
  double any = ctx.comm().all_reduce_scalar(failed != 0 ? 1.0 : 0.0, zero::ReduceOp::max);
  if (ctx.is_root() && any != 0.0) std::fprintf(stderr, "mpi test: failures on at least one rank\n");
  return any != 0.0 ? 1 : 0;
}
