// The GPU benchmarks' first check, before MPI or any engine starts: on a machine without a CUDA
// device they say so and exit 77 (the skip code of ctest and of the GPU tests); a driver that is
// installed but cannot enumerate devices is a broken setup, and that is an error (exit 1), as in
// test/gpu/gpu_main.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdio>

namespace zero::bench {

inline constexpr int kNoDeviceExit = 77;

// 0 when a device is usable; otherwise the code to exit with, after a message naming `program`.
inline int cuda_device_status(const char* program) {
  int devices = 0;
  const cudaError_t rc = cudaGetDeviceCount(&devices);
  int driver = 0;
  cudaDriverGetVersion(&driver);  // 0: no driver installed at all
  cudaGetLastError();             // a failed probe must not surface as a later call's error
  if (rc == cudaErrorNoDevice || (rc == cudaSuccess && devices == 0) || (rc != cudaSuccess && driver == 0)) {
    std::fprintf(stderr, "%s: no CUDA device (%s); this benchmark needs a GPU, skipped (exit %d)\n", program,
                 rc == cudaSuccess ? "0 devices" : driver == 0 ? "no CUDA driver installed" : cudaGetErrorName(rc),
                 kNoDeviceExit);
    return kNoDeviceExit;
  }
  if (rc != cudaSuccess) {
    std::fprintf(stderr,
                 "%s: the CUDA driver (version %d) is installed but cannot enumerate devices: %s (%s); check the "
                 "driver against the runtime and nvidia-smi\n",
                 program, driver, cudaGetErrorName(rc), cudaGetErrorString(rc));
    return 1;
  }
  return 0;
}

}  // namespace zero::bench
