// The CUDA error messages (cuda/cuda_check.hpp), in a CUDA build, with or without a GPU: naming
// an error needs only the runtime library. A failed kernel's errors (an illegal address, a
// launch failure) say how to find the kernel: CUDA_LAUNCH_BLOCKING=1 or compute-sanitizer.
#include <catch2/catch.hpp>

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
  // Thrown with the call site, as ZERO_CUDA_CHECK does.
  CHECK_THROWS_WITH([] { ZERO_CUDA_CHECK(cudaErrorIllegalAddress); }(), Contains("test_cuda_check.cpp") &&
                                                                            Contains("cudaErrorIllegalAddress") &&
                                                                            Contains("CUDA_LAUNCH_BLOCKING=1"));
  // Other errors keep their own hints, or none.
  CHECK_THAT(zero::cuda::cuda_error_text("cudaMalloc(&p, n)", cudaErrorMemoryAllocation),
             Contains("out of memory") && !Contains("CUDA_LAUNCH_BLOCKING"));
  CHECK_THAT(zero::cuda::cuda_error_text("cudaMemcpy(...)", cudaErrorInvalidValue), !Contains("CUDA_LAUNCH_BLOCKING"));
}
