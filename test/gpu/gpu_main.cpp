// Catch2 main for GPU tests, single- and multi-rank.
//
// On a machine with no CUDA device (no driver installed, or the driver sees no device) the
// program exits 77 before anything else (MPI included), which ctest reports as skipped
// (SKIP_RETURN_CODE 77): a machine without a GPU must never count these tests as passed. Any
// other failure to enumerate devices (a driver older than the runtime, a broken installation)
// is a broken GPU setup and fails: skipping it would hide exactly what the tests are for.
// ZERO_TEST_PROBE=1 stops after the probe (exit 0 when a device is usable).
// ZERO_TEST_MIN_GPUS=N also skips when the node has fewer than N devices (NCCL runs with several
// ranks need one GPU each). Otherwise it is the multi-rank main: every rank runs every test case
// and the job fails if any rank failed.
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
  int driver = 0;
  cudaDriverGetVersion(&driver);  // 0: no driver installed at all (a machine without a GPU)
  if (rc == cudaErrorNoDevice || (rc == cudaSuccess && devices == 0) || (rc != cudaSuccess && driver == 0)) {
    std::fprintf(stderr, "skipped: no CUDA device (%s)\n",
                 rc == cudaSuccess ? "0 devices" : driver == 0 ? "no CUDA driver installed" : cudaGetErrorName(rc));
    return 77;
  }
  if (rc != cudaSuccess) {
    int runtime = 0;
    cudaRuntimeGetVersion(&runtime);
    std::fprintf(stderr,
                 "FAILED: the CUDA driver is installed (version %d) but cannot enumerate devices: %s (%s); runtime "
                 "version %d. Update the driver to one that supports this runtime, or check the installation "
                 "(nvidia-smi)\n",
                 driver, cudaGetErrorName(rc), cudaGetErrorString(rc), runtime);
    return 1;
  }
  // The probe alone (run_sanitizer.sh asks for it before starting compute-sanitizer).
  if (std::getenv("ZERO_TEST_PROBE")) return 0;
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
