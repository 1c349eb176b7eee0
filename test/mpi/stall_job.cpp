// A job with one straggling rank, for test/e2e/stall.py (which checks what the job prints and
// how it ends).
//   stall_job stop: the last rank stops itself (SIGSTOP) before an all_reduce of 1024 floats;
//     the others must end the job at the deadline (ZERO_TIMEOUT_S) naming it.
//   stall_job stop-node: the second half of the ranks stop (with ZERO_RANKS_PER_NODE, a node).
//   stall_job late SECONDS: the last rank joins the all_reduce SECONDS late, well inside the
//     deadline; the others must get the right sum and, while they wait, use little CPU. Prints
//     "rank R waited W s, cpu C s" per waiting rank, and exits non-zero on a wrong sum.
#include <sys/resource.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "zero/comm.hpp"
#include "zero/context.hpp"

namespace {
double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}
}  // namespace

int main(int argc, char** argv) {
  zero::Context ctx(&argc, &argv);
  const std::string mode = argc > 1 ? argv[1] : "";
  const int last = ctx.world_size() - 1;
  auto& comm = ctx.comm();
  std::vector<float> v(1024, 1.0f);
  comm.all_reduce(v.data(), v.size(), zero::DType::f32);  // #0: everyone is there
  if (mode == "stop" || mode == "stop-node") {
    // stop-node: the ranks of the second half (a whole simulated node with ZERO_RANKS_PER_NODE).
    if (ctx.rank() == last || (mode == "stop-node" && ctx.rank() >= ctx.world_size() / 2)) std::raise(SIGSTOP);
    comm.all_reduce(v.data(), v.size(), zero::DType::f32);  // #1: the last rank never arrives
    std::fprintf(stderr, "rank %d: the all_reduce completed without the stopped rank\n", ctx.rank());
    return 3;
  }
  if (mode == "late" && argc > 2) {
    const double late = std::atof(argv[2]);
    if (ctx.rank() == last) std::this_thread::sleep_for(std::chrono::duration<double>(late));
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = cpu_seconds();
    comm.all_reduce(v.data(), v.size(), zero::DType::f32);
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double cpu = cpu_seconds() - c0;
    const float want = static_cast<float>(ctx.world_size() * ctx.world_size());
    for (float x : v)
      if (x != want) {
        std::fprintf(stderr, "rank %d: sum %g, expected %g\n", ctx.rank(), static_cast<double>(x),
                     static_cast<double>(want));
        return 1;
      }
    if (ctx.rank() != last) std::printf("rank %d waited %.3f s, cpu %.3f s\n", ctx.rank(), waited, cpu);
    std::fflush(stdout);
    comm.barrier();
    return 0;
  }
  std::fprintf(stderr, "usage: stall_job stop | late SECONDS\n");
  return 2;
}
