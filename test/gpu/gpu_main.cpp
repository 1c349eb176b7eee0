// Catch2 main for GPU tests, single- and multi-rank.
//
// Without a usable CUDA device the program exits 77 before anything else (MPI included), which
// ctest reports as skipped (SKIP_RETURN_CODE 77): a machine without a GPU must never count these
// tests as passed. ZERO_TEST_MIN_GPUS=N also skips when the node has fewer than N devices (NCCL
// runs with several ranks need one GPU each). Otherwise it is the multi-rank main: every rank
// runs every test case and the job fails if any rank failed.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>

#include "zero/comm.hpp"
#include "zero/context.hpp"

int main(int argc, char** argv) {
  int devices = 0;
  const cudaError_t rc = cudaGetDeviceCount(&devices);
  if (rc != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "skipped: no CUDA device (%s)\n", rc == cudaSuccess ? "0 devices" : cudaGetErrorName(rc));
    return 77;
  }
  if (const char* need = std::getenv("ZERO_TEST_MIN_GPUS")) {
    if (devices < std::atoi(need)) {
      std::fprintf(stderr, "skipped: this run needs %s CUDA devices, the node has %d\n", need, devices);
      return 77;
    }
  }
  zero::Context ctx(&argc, &argv);
  Catch::Session session;
  if (int bad = session.applyCommandLine(argc, argv); bad != 0) return bad;
  const int failed = session.run();
  const double any = ctx.comm().all_reduce_scalar(failed != 0 ? 1.0 : 0.0, zero::ReduceOp::max);
  if (ctx.is_root() && any != 0.0) std::fprintf(stderr, "gpu test: failures on at least one rank\n");
  return any != 0.0 ? 1 : 0;
}
