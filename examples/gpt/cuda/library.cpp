// libzero_gpt_cuda's entry point: the table the trainer loads (../cuda_library.hpp).
#include <cuda_runtime_api.h>

#include "gpt/cuda/cuda_ops.hpp"
#include "gpt/cuda_library.hpp"
#include "gpt/cuda_library_id.hpp"  // generated: ZERO_GPT_CUDA_ID

namespace {

std::unique_ptr<zero::gpt::Ops> make_ops(void* stream) {
  return zero::gpt::make_cuda_ops(static_cast<cudaStream_t>(stream));
}

bool current_device(std::string* name, double* bytes) {
  int device = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&device) != cudaSuccess || cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    cudaGetLastError();  // a failed query must not surface as a later call's error
    return false;
  }
  *name = prop.name;
  *bytes = static_cast<double>(prop.totalGlobalMem);
  return true;
}

const zero::gpt::GptCudaLibrary kLibrary{make_ops, current_device};

}  // namespace

extern "C" const char* zero_gpt_cuda_library_id() { return ZERO_GPT_CUDA_ID; }
extern "C" const zero::gpt::GptCudaLibrary* zero_gpt_cuda_library() { return &kLibrary; }
