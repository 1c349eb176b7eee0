// Error checks for CUDA runtime and NCCL calls.
//
// A failed call becomes a zero::Error naming the call as written, the file:line of the call
// site, the rank, the library's own error name and text, and, for the failures users can act on
// (out of memory, no device, a mismatched driver), what to do. Kept out of line so the macros
// stay small in kernels' host code and in hot paths.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

namespace zero::cuda {

[[noreturn]] void throw_cuda_error(const char* file, int line, const char* call, cudaError_t rc);
// The message throw_cuda_error gives (without the call site): the call, the error's name and
// text, and what to do where that is known.
std::string cuda_error_text(const char* call, cudaError_t rc);
[[noreturn]] void throw_nccl_error(const char* file, int line, const char* call, int rc, const char* text,
                                   const char* last_error);

// What a process finds before it uses CUDA. No device, or no driver at all, means "no GPU on
// this machine" (GPU tests and benchmarks then skip with exit 77); a driver that is installed
// but cannot enumerate devices (one older than the runtime, say) is a broken setup, which must
// fail rather than skip. `message` says which, for the user.
struct DeviceProbe {
  enum Kind { usable, none, broken } kind = none;
  int devices = 0;
  std::string message;
};
DeviceProbe probe_devices();

// Makes `device` current on the calling thread (cheap when it already is). The engine may be
// called from a thread other than the one that built it; a CUDA thread starts on device 0.
void use_device(int device);

}  // namespace zero::cuda

#define ZERO_CUDA_CHECK(call)                                                                                   \
  do {                                                                                                          \
    cudaError_t zero_cuda_rc_ = (call);                                                                         \
    if (zero_cuda_rc_ != cudaSuccess) ::zero::cuda::throw_cuda_error(__FILE__, __LINE__, #call, zero_cuda_rc_); \
  } while (0)

// Needs <nccl.h> where it is used (ncclGetErrorString, ncclGetLastError).
#define ZERO_NCCL_CHECK(call)                                                                       \
  do {                                                                                              \
    ncclResult_t zero_nccl_rc_ = (call);                                                            \
    if (zero_nccl_rc_ != ncclSuccess)                                                               \
      ::zero::cuda::throw_nccl_error(__FILE__, __LINE__, #call, static_cast<int>(zero_nccl_rc_),    \
                                     ncclGetErrorString(zero_nccl_rc_), ncclGetLastError(nullptr)); \
  } while (0)
