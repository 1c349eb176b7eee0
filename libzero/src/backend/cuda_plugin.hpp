// The CUDA backend as a library of its own (libzero_cuda), loaded with dlopen the first time a
// job asks for it: backend: cuda, or Context::device(). libzero itself then needs no CUDA
// library, so a CUDA build runs host-backend jobs on machines without the CUDA runtime, and a
// missing runtime is reported as one error that names the library and the loader's reason.
//
// libzero_cuda exports two C functions: zero_cuda_plugin_id(), its interface id, and
// zero_cuda_plugin(), which returns the table below. The id is a hash of the headers libzero and
// the plugin share, generated into backend/cuda_plugin_id.hpp (ZERO_CUDA_PLUGIN_ID,
// cmake/ZeroInterfaceId.cmake) and compiled into both; the factory calls nothing else of a
// libzero_cuda whose id differs from its own (a plugin from another build of libzero).
#pragma once

#include <memory>

namespace zero {

class Backend;
class Context;
struct Config;

class Communicator;

struct CudaPlugin {
  // The CUDA backend over the ranks of a host communicator (cuda/cuda_backend.hpp); throws
  // zero::Error as make_cuda_backend does.
  std::unique_ptr<Backend> (*make_backend)(Context& ctx, const Config& cfg, Communicator& ranks) = nullptr;
  // The device for a local rank (round robin over the visible devices), -1 when there is none
  // or no driver.
  int (*device_for_local_rank)(int local_rank) = nullptr;
};

// The device Context::device() reports: -1 in a build without CUDA, or when libzero_cuda
// cannot be loaded (no CUDA runtime), or without a device. Defined in backend/factory.cpp.
int cuda_device_for_local_rank(int local_rank);

}  // namespace zero

// Defined in libzero_cuda (cuda/plugin.cpp), looked up by name with dlsym.
extern "C" const char* zero_cuda_plugin_id();
extern "C" const zero::CudaPlugin* zero_cuda_plugin();
