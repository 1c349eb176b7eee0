// The collective watchdog's report (cuda/watchdog_report.hpp), in every build: a kernel's
// sticky fault that the watchdog is first to notice (at a collective's completion event, or as
// NCCL's asynchronous error) is reported as a kernel failure, with the way to find the kernel
// and without the collective timeout's advice; a collective past its deadline, another CUDA
// error and NCCL's own error keep theirs.
#include <catch2/catch.hpp>

#include <string>

#include "cuda/watchdog_report.hpp"

using Catch::Contains;
using namespace zero::cuda;

namespace {

const char* const kRecent = "all_gather #11 (unit 3), reduce_scatter #12 (unit 4)";

}  // namespace

TEST_CASE("the errors a failed kernel leaves are kernel faults, the others are not", "[watchdog]") {
  for (const char* e : {"cudaErrorIllegalAddress", "cudaErrorLaunchFailure", "cudaErrorMisalignedAddress",
                        "cudaErrorIllegalInstruction", "cudaErrorInvalidPc", "cudaErrorHardwareStackError",
                        "cudaErrorAssert", "cudaErrorLaunchTimeout"})
    CHECK(is_kernel_fault(e));
  for (const char* e : {"cudaSuccess", "cudaErrorNotReady", "cudaErrorMemoryAllocation", "cudaErrorInvalidValue",
                        "cudaErrorIllegalAddres", "", "ncclUnhandledCudaError"})
    CHECK_FALSE(is_kernel_fault(e));
}

TEST_CASE("a kernel's illegal address seen at a collective's event: a kernel failure", "[watchdog]") {
  const WatchdogFinding f = event_error("cudaErrorIllegalAddress", "an illegal memory access was encountered",
                                        "reduce_scatter of 3.0 MiB (#12), enqueued 0.4 s ago");
  CHECK(f.kind == WatchdogFinding::kernel_fault);
  const std::string m = watchdog_message(f, 2, 4, kRecent);
  INFO(m);
  CHECK(m.rfind("[rank 2/4] error: collective watchdog: a kernel failed; the collective is where it was noticed", 0) ==
        0);
  CHECK_THAT(m, Contains("cudaErrorIllegalAddress (an illegal memory access was encountered) while waiting for "
                         "reduce_scatter of 3.0 MiB (#12)") &&
                    Contains("this rank's last collectives: all_gather #11") && Contains("sticky") &&
                    Contains("CUDA_LAUNCH_BLOCKING=1") && Contains("compute-sanitizer --tool memcheck"));
  // Not the collective's failure: no timeout advice, no network to blame.
  CHECK_THAT(m, !Contains("ZERO_NCCL_TIMEOUT_S") && !Contains("did not complete") && !Contains("NCCL_DEBUG"));
  // A launch failure, the other common one, the same way.
  CHECK(event_error("cudaErrorLaunchFailure", "unspecified launch failure", "all_reduce").kind ==
        WatchdogFinding::kernel_fault);
}

TEST_CASE("a kernel's fault that NCCL reports first: still a kernel failure, NCCL's account kept", "[watchdog]") {
  const WatchdogFinding f =
      comm_error("NCCL reported an asynchronous error: unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
                 "cudaErrorIllegalAddress", "an illegal memory access was encountered");
  CHECK(f.kind == WatchdogFinding::kernel_fault);
  const std::string m = watchdog_message(f, 0, 1, "");
  INFO(m);
  CHECK_THAT(m, Contains("a kernel failed; the collective is where it was noticed") &&
                    Contains("cudaErrorIllegalAddress") && Contains("unhandled cuda error") &&
                    Contains("CUDA_LAUNCH_BLOCKING=1") && !Contains("ZERO_NCCL_TIMEOUT_S") &&
                    !Contains("last collectives"));
}

TEST_CASE("NCCL's own error, with a healthy device: the communicator's failure", "[watchdog]") {
  const WatchdogFinding f = comm_error("NCCL reported an asynchronous error: remote process exited", "cudaSuccess", "");
  CHECK(f.kind == WatchdogFinding::comm_error);
  const std::string m = watchdog_message(f, 1, 2, kRecent);
  INFO(m);
  CHECK_THAT(m, Contains("[rank 1/2] error: collective watchdog: NCCL reported an asynchronous error: remote process "
                         "exited; this rank's last collectives") &&
                    Contains("NCCL_DEBUG=WARN") && !Contains("a kernel failed") && !Contains("CUDA_LAUNCH_BLOCKING") &&
                    !Contains("raise ZERO_NCCL_TIMEOUT_S"));
}

TEST_CASE("a collective past its deadline: the timeout, with its advice", "[watchdog]") {
  const WatchdogFinding f = stalled("all_reduce of 8.0 MiB (#7), enqueued 121.0 s ago", 120.0);
  CHECK(f.kind == WatchdogFinding::stalled);
  const std::string m = watchdog_message(f, 3, 8, kRecent);
  INFO(m);
  CHECK_THAT(m, Contains("[rank 3/8] error: collective watchdog: all_reduce of 8.0 MiB (#7), enqueued 121.0 s ago, did "
                         "not complete within the collective timeout of 120 s (ZERO_NCCL_TIMEOUT_S)") &&
                    Contains("a rank is missing from it, stalled or dead") && Contains("NCCL_DEBUG=WARN") &&
                    Contains("raise ZERO_NCCL_TIMEOUT_S") && !Contains("a kernel failed"));
}

TEST_CASE("another CUDA error at a collective's event: named, without kernel or timeout advice", "[watchdog]") {
  const WatchdogFinding f = event_error("cudaErrorInvalidResourceHandle", "invalid resource handle", "broadcast");
  CHECK(f.kind == WatchdogFinding::device_error);
  const std::string m = watchdog_message(f, 0, 2, "");
  INFO(m);
  CHECK_THAT(m, Contains("CUDA error cudaErrorInvalidResourceHandle (invalid resource handle) while waiting for "
                         "broadcast") &&
                    Contains("NCCL_DEBUG=WARN") && !Contains("a kernel failed") && !Contains("ZERO_NCCL_TIMEOUT_S"));
}
