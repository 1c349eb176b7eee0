// CUDA runtime status checks for the GPT example's CUDA operations (every launcher in this folder).
//
// libzero's ZERO_CUDA_CHECK lives in its private sources, out of this library's include path,
// so this is the same idea in a few lines: a failed call becomes a zero::Error naming the call
// as written, its file:line and CUDA's own error name and text. The text is built out of line
// of the macro so the checks stay small at the call sites.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "zero/error.hpp"

namespace zero::gpt::cuda {

[[noreturn]] inline void throw_cuda_status(const char* file, int line, const char* call, cudaError_t rc) {
  zero::throw_error(file, line,
                    std::string(call) + " failed: " + cudaGetErrorName(rc) + " (" + cudaGetErrorString(rc) + ")");
}

}  // namespace zero::gpt::cuda

// After a kernel launch: the launch error, if any, named after the operation that launched it.
#define GPT_LAUNCH_CHECK(op)                                                                                           \
  do {                                                                                                                 \
    const cudaError_t gpt_launch_rc_ = cudaGetLastError();                                                             \
    if (gpt_launch_rc_ != cudaSuccess) ::zero::gpt::cuda::throw_cuda_status(__FILE__, __LINE__, (op), gpt_launch_rc_); \
  } while (0)

#define GPT_CUDA_CHECK(call)                                                                                        \
  do {                                                                                                              \
    const cudaError_t gpt_cuda_rc_ = (call);                                                                        \
    if (gpt_cuda_rc_ != cudaSuccess) ::zero::gpt::cuda::throw_cuda_status(__FILE__, __LINE__, #call, gpt_cuda_rc_); \
  } while (0)
