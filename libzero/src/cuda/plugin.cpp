// libzero_cuda's entry point: the table libzero's backend factory loads (backend/cuda_plugin.hpp).
#include <cuda_runtime_api.h>

#include "backend/cuda_plugin.hpp"
#include "backend/cuda_plugin_id.hpp"  // generated: ZERO_CUDA_PLUGIN_ID
#include "cuda/cuda_backend.hpp"

namespace {

// Probing does not create a device context (cudaSetDevice would): the CUDA backend makes its
// device current when it starts.
int device_for_local_rank(int local_rank) {
  int devices = 0;
  const bool found = cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
  cudaGetLastError();  // a failed probe must not surface as a later call's error
  return found ? local_rank % devices : -1;
}

const zero::CudaPlugin kPlugin{zero::make_cuda_backend, device_for_local_rank};

}  // namespace

extern "C" const char* zero_cuda_plugin_id() { return ZERO_CUDA_PLUGIN_ID; }
extern "C" const zero::CudaPlugin* zero_cuda_plugin() { return &kPlugin; }
