#include "cuda/cuda_check.hpp"

#include <fmt/format.h>

#include "cuda/watchdog_report.hpp"
#include "zero/error.hpp"

namespace zero::cuda {

namespace {

// What a user can do about the failures that are not bugs.
const char* cuda_hint(cudaError_t rc) {
  switch (rc) {
    case cudaErrorMemoryAllocation:
      return "; the device is out of memory: lower the micro batch or the bucket sizes "
             "(reduce_bucket_size, allgather_bucket_size, stage3_prefetch_bucket_size), use a "
             "higher ZeRO stage, or offload the optimizer (offload_optimizer.device: cpu)";
    case cudaErrorNoDevice:
    case cudaErrorInvalidDevice:
      return "; no usable CUDA device: check CUDA_VISIBLE_DEVICES and nvidia-smi, or set backend: host";
    case cudaErrorInsufficientDriver:
    case cudaErrorCompatNotSupportedOnDevice:
      return "; the NVIDIA driver is older than this CUDA toolkit: update the driver or build "
             "with a matching toolkit";
    case cudaErrorNoKernelImageForDevice:
      return "; libzero was not compiled for this GPU: rebuild with "
             "-DCMAKE_CUDA_ARCHITECTURES=<your GPU's compute capability, e.g. 90>";
    default: return "";
  }
}

// A kernel failed. The error is sticky (every later CUDA call reports it) and asynchronous: the
// call named is where it was noticed, usually not the kernel that failed. The same errors and
// advice as the collective watchdog's (watchdog_report.hpp), which often notices them first.
std::string kernel_fault_hint(cudaError_t rc) {
  if (!is_kernel_fault(cudaGetErrorName(rc))) return "";
  return std::string(
             "; a kernel failed and the CUDA context is unusable from here on (the error is sticky, and the "
             "call named is where it was noticed, not necessarily the kernel that caused it): ") +
         kernel_fault_advice();
}

}  // namespace

DeviceProbe probe_devices() {
  DeviceProbe p;
  const cudaError_t rc = cudaGetDeviceCount(&p.devices);
  int driver = 0;
  cudaDriverGetVersion(&driver);  // 0: no driver installed at all (a machine without a GPU)
  cudaGetLastError();             // a failed probe must not surface as a later call's error
  if (rc == cudaErrorNoDevice || (rc == cudaSuccess && p.devices == 0) || (rc != cudaSuccess && driver == 0)) {
    p.kind = DeviceProbe::none;
    p.devices = 0;
    p.message = fmt::format("no CUDA device ({})", rc == cudaSuccess ? "0 devices"
                                                   : driver == 0     ? "no CUDA driver installed"
                                                                     : cudaGetErrorName(rc));
  } else if (rc != cudaSuccess) {
    int runtime = 0;
    cudaRuntimeGetVersion(&runtime);
    p.kind = DeviceProbe::broken;
    p.message = fmt::format(
        "the CUDA driver is installed (version {}) but cannot enumerate devices: {} ({}); runtime version {}. "
        "Update the driver to one that supports this runtime, or check the installation (nvidia-smi)",
        driver, cudaGetErrorName(rc), cudaGetErrorString(rc), runtime);
  } else {
    p.kind = DeviceProbe::usable;
  }
  return p;
}

std::string cuda_error_text(const char* call, cudaError_t rc) {
  return fmt::format("{} failed: {} ({}){}{}", call, cudaGetErrorName(rc), cudaGetErrorString(rc), cuda_hint(rc),
                     kernel_fault_hint(rc));
}

void throw_cuda_error(const char* file, int line, const char* call, cudaError_t rc) {
  throw_error(file, line, cuda_error_text(call, rc));
}

void throw_nccl_error(const char* file, int line, const char* call, int rc, const char* text, const char* last_error) {
  std::string msg = fmt::format("{} failed: NCCL error {} ({})", call, rc, text ? text : "?");
  if (last_error && *last_error) msg += ": " + std::string(last_error);
  msg += "; run with NCCL_DEBUG=WARN for NCCL's own account";
  throw_error(file, line, msg);
}

void use_device(int device) {
  int current = -1;
  if (cudaGetDevice(&current) == cudaSuccess && current == device) return;
  ZERO_CUDA_CHECK(cudaSetDevice(device));
}

}  // namespace zero::cuda
