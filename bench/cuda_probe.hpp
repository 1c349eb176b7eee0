// The GPU benchmarks' first check, before MPI or any engine starts: on a machine without a CUDA
// device they say so and exit 77 (the skip code of ctest and of the GPU tests); a driver that is
// installed but cannot enumerate devices is a broken setup, and that is an error (exit 1), as in
// test/gpu/gpu_main.cpp.
#pragma once

#include <cstdio>

#include "cuda/cuda_check.hpp"

namespace zero::bench {

inline constexpr int kNoDeviceExit = 77;

// 0 when a device is usable; otherwise the code to exit with, after a message naming `program`.
inline int cuda_device_status(const char* program) {
  const zero::cuda::DeviceProbe probe = zero::cuda::probe_devices();
  if (probe.kind == zero::cuda::DeviceProbe::none) {
    std::fprintf(stderr, "%s: %s; this benchmark needs a GPU, skipped (exit %d)\n", program, probe.message.c_str(),
                 kNoDeviceExit);
    return kNoDeviceExit;
  }
  if (probe.kind == zero::cuda::DeviceProbe::broken) {
    std::fprintf(stderr, "%s: %s\n", program, probe.message.c_str());
    return 1;
  }
  return 0;
}

}  // namespace zero::bench
