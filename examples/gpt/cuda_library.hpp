// The model's CUDA operations (cuda/) as a library of their own, libzero_gpt_cuda, which the
// trainer loads (zero/util/library.hpp) when a run asks for backend: cuda. zero-gpt from a CUDA build
// then needs no CUDA library to start, and trains on the host backend where the CUDA runtime is
// missing, as libzero does with its CUDA backend.
//
// The library exports two C functions: zero_gpt_cuda_library_id(), its interface id, and
// zero_gpt_cuda_library(), which returns the table below. The id is a hash of the headers the
// trainer and the library share (this table, the Ops interface whose objects make_ops returns,
// virtual calls and all, and libzero's public headers), generated into gpt/cuda_library_id.hpp
// (ZERO_GPT_CUDA_ID, cmake/ZeroInterfaceId.cmake) and compiled into both: a library from another
// build is refused instead of called through a vtable of another shape. Nothing here needs
// CUDA's headers.
#pragma once

#include <memory>
#include <string>

#include "gpt/ops.hpp"

namespace zero::gpt {

struct GptCudaLibrary {
  // make_cuda_ops (cuda/cuda_ops.hpp); `stream` is a cudaStream_t.
  std::unique_ptr<Ops> (*make_ops)(void* stream) = nullptr;
  // The current device's name and memory in bytes; false when they cannot be read.
  bool (*current_device)(std::string* name, double* bytes) = nullptr;
};

// The library, loaded once. Throws zero::Error naming the library and why it could not be
// loaded (the CUDA runtime or cuBLASLt missing, for instance).
const GptCudaLibrary& gpt_cuda_library();

}  // namespace zero::gpt

// Defined in libzero_gpt_cuda (cuda/library.cpp), looked up by name.
extern "C" const char* zero_gpt_cuda_library_id();
extern "C" const zero::gpt::GptCudaLibrary* zero_gpt_cuda_library();
