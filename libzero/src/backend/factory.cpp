// The backend choice (Config::backend) in every build: the host backend always; the CUDA
// backend where libzero was built with it, and otherwise an error that says how to get it.
#include <string>

#include "backend/backend.hpp"
#include "zero/config.hpp"
#include "zero/context.hpp"
#include "zero/error.hpp"

#if ZERO_WITH_CUDA
#include "cuda/cuda_backend.hpp"
#endif

namespace zero {

void Backend::set_compute_stream(void* stream) {
  if (stream == nullptr) return;  // "no stream" is what a host backend has already
  ZERO_THROW(std::string("set_compute_stream: the ") + name() +
             " backend has no streams (its memory is host memory); streams belong to backend: cuda");
}

std::unique_ptr<Backend> make_backend(Context& ctx, const Config& cfg) {
  const std::string where = cfg.source.empty() ? std::string("the config") : cfg.source;
  if (cfg.backend == BackendKind::host) return make_host_backend(ctx.comm());
#if ZERO_WITH_CUDA
  // The engine would keep the parameter shard in device memory regardless: refuse rather than
  // ignore the setting.
  ZERO_CHECK(cfg.zero_optimization.offload_param.device == OffloadDevice::none,
             where + ": zero_optimization.offload_param.device is set, but the CUDA backend does not offload "
                     "parameters yet (only the optimizer state); set offload_param.device: none, or use "
                     "offload_optimizer.device: cpu / nvme");
  return make_cuda_backend(ctx, cfg);
#else
  ZERO_THROW(where + ": backend: cuda, but this libzero was built without CUDA (only the host backend is "
                     "available). Rebuild with -DZERO_CUDA=ON (needs nvcc, cuBLASLt and NCCL; cmake prints why "
                     "they were not found), or set backend: host");
#endif
}

}  // namespace zero
