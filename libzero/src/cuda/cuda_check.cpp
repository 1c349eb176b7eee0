#include "cuda_check.hpp"

#include <fmt/format.h>

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
    default:
      return "";
  }
}

}  // namespace

void throw_cuda_error(const char* file, int line, const char* call, cudaError_t rc) {
  throw_error(file, line,
              fmt::format("{} failed: {} ({}){}", call, cudaGetErrorName(rc), cudaGetErrorString(rc), cuda_hint(rc)));
}

void throw_nccl_error(const char* file, int line, const char* call, int rc, const char* text,
                      const char* last_error) {
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
