// A job whose zero::Error escapes main outside Context::run, for test/e2e/uncaught.py (which
// checks what the job prints and how it ends).
//   throw_job all: every rank throws once the others are up;
//   throw_job last: only the last rank throws, the others wait in a barrier for it.
#include <string>

#include "zero/comm.hpp"
#include "zero/context.hpp"
#include "zero/error.hpp"

int main(int argc, char** argv) {
  zero::Context ctx(&argc, &argv);
  const std::string mode = argc > 1 ? argv[1] : "all";
  ctx.comm().barrier();
  if (mode == "all" || ctx.rank() == ctx.world_size() - 1)
    throw zero::Error("throw_job: the loop failed outside ctx.run() on rank " + std::to_string(ctx.rank()) +
                      "; this is the message the test expects");
  ctx.comm().barrier();  // the thrower never arrives: its terminate handler must end the job
  return 0;
}
