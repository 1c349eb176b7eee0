// Catch2 main for GPU tests, single- and multi-rank.
//
// On a machine with no CUDA device (no driver installed, or the driver sees no device) the
// program exits 77 before anything else (MPI included), which ctest reports as skipped
// (SKIP_RETURN_CODE 77): a machine without a GPU must never count these tests as passed. Any
// other failure to enumerate devices (a driver older than the runtime, a broken installation)
// is a broken GPU setup and fails: skipping it would hide exactly what the tests are for.
// ZERO_TEST_MIN_GPUS=N also skips when the node has fewer than N devices (NCCL runs with several
// ranks need one GPU each). ZERO_TEST_PROBE=1 stops after these checks (exit 0 when a device,
// or N of them, is usable). Otherwise it is the multi-rank main: every rank runs every test case
// and the job fails if any rank failed.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>

#include "cuda/cuda_check.hpp"
#include "zero/comm.hpp"
#include "zero/context.hpp"

int main(int argc, char** argv) {
  const zero::cuda::DeviceProbe probe = zero::cuda::probe_devices();
  if (probe.kind == zero::cuda::DeviceProbe::none) {
    std::fprintf(stderr, "skipped: %s\n", probe.message.c_str());
    return 77;
  }
  if (probe.kind == zero::cuda::DeviceProbe::broken) {
    std::fprintf(stderr, "FAILED: %s\n", probe.message.c_str());
    return 1;
  }
  const int devices = probe.devices;
  if (const char* need = std::getenv("ZERO_TEST_MIN_GPUS")) {
    if (devices < std::atoi(need)) {
      std::fprintf(stderr, "skipped: this run needs %s CUDA devices, the node has %d\n", need, devices);
      return 77;
    }
  }
  // The probe alone (run_sanitizer.sh and gpt_cuda_train.py ask for it before their runs); with
  // ZERO_TEST_MIN_GPUS it also answers whether the node has that many devices.
  if (std::getenv("ZERO_TEST_PROBE")) return 0;
  zero::Context ctx(&argc, &argv);
  Catch::Session session;
  if (int bad = session.applyCommandLine(argc, argv); bad != 0) return bad;
  const int failed = session.run();
  const double any = ctx.comm().all_reduce_scalar(failed != 0 ? 1.0 : 0.0, zero::ReduceOp::max);
  if (ctx.is_root() && any != 0.0) std::fprintf(stderr, "gpu test: failures on at least one rank\n");
  return any != 0.0 ? 1 : 0;
}
