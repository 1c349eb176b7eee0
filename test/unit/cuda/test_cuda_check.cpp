// The CUDA error messages (cuda/cuda_check.hpp), in a CUDA build, with or without a GPU: naming
// an error needs only the runtime library. A failed kernel's errors (an illegal address, a
// launch failure) say how to find the kernel: CUDA_LAUNCH_BLOCKING=1 or compute-sanitizer.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>

#include "cuda/cuda_check.hpp"
#include "zero/error.hpp"

using Catch::Contains;

TEST_CASE("a failed kernel's CUDA errors carry the hint of how to find it", "[cuda]") {
  for (cudaError_t rc : {cudaErrorIllegalAddress, cudaErrorLaunchFailure, cudaErrorMisalignedAddress,
                         cudaErrorIllegalInstruction, cudaErrorAssert}) {
    const std::string text = zero::cuda::cuda_error_text("cudaStreamSynchronize(s)", rc);
    INFO(text);
    CHECK_THAT(text, Contains("cudaStreamSynchronize(s) failed: ") && Contains(cudaGetErrorName(rc)) &&
                         Contains("CUDA_LAUNCH_BLOCKING=1") && Contains("compute-sanitizer") && Contains("sticky"));
  }
  // Thrown as ZERO_CUDA_CHECK does: the call named, the source location only with ZERO_ERROR_SOURCE=1
  // (an installed package has no sources to point at).
  const char* source_env = std::getenv("ZERO_ERROR_SOURCE");
  const bool with_source = source_env && *source_env && std::string(source_env) != "0";
  try {
    ZERO_CUDA_CHECK(cudaErrorIllegalAddress);
    FAIL("ZERO_CUDA_CHECK did not throw");
  } catch (const zero::Error& e) {
    const std::string what = e.what();
    CHECK_THAT(what, Contains("cudaErrorIllegalAddress failed") && Contains("CUDA_LAUNCH_BLOCKING=1"));
    CHECK((what.find("test_cuda_check.cpp") != std::string::npos) == with_source);
  }
  // Other errors keep their own hints, or none.
  CHECK_THAT(zero::cuda::cuda_error_text("cudaMalloc(&p, n)", cudaErrorMemoryAllocation),
             Contains("out of memory") && !Contains("CUDA_LAUNCH_BLOCKING"));
  CHECK_THAT(zero::cuda::cuda_error_text("cudaMemcpy(...)", cudaErrorInvalidValue), !Contains("CUDA_LAUNCH_BLOCKING"));
}
