// The backend choice (Config::backend) in every build: the host backend always; the CUDA
// backend from libzero_cuda (backend/cuda_plugin.hpp) where libzero was built with it, and
// otherwise an error that says how to get it.
#include <mutex>
#include <string>

#include "backend/backend.hpp"
#include "backend/cuda_plugin.hpp"
#if ZERO_WITH_CUDA
#include "backend/cuda_plugin_id.hpp"  // generated: ZERO_CUDA_PLUGIN_ID
#endif
#include "zero/config.hpp"
#include "zero/context.hpp"
#include "zero/error.hpp"
#include "zero/util/library.hpp"

namespace zero {

void Backend::set_compute_stream(void* stream) {
  if (stream == nullptr) return;  // "no stream" is what a host backend has already
  ZERO_THROW(std::string("set_compute_stream: the ") + name() +
             " backend has no streams (its memory is host memory); streams belong to backend: cuda");
}

// Where backend memory is host memory nothing needs staging; a caller that stages anyway gets
// memory from one pool of the process (page-locked where the memlock limit allows).
offload::PinnedBuffer Backend::staging_buffer(std::size_t bytes) {
  static offload::PinnedPool pool(false);
  return pool.acquire(bytes);
}

namespace {

#if ZERO_WITH_CUDA
struct PluginLoad {
  const CudaPlugin* plugin = nullptr;
  std::string error;  // why it could not be loaded
  bool other_build = false;
};

// Loaded once per process (never unloaded: its code may run until exit).
const PluginLoad& load_plugin() {
  static PluginLoad load;
  static std::once_flag once;
  std::call_once(once, [] {
    const LibrarySymbol entry =
        find_library_entry(ZERO_CUDA_PLUGIN_FILE, "zero_cuda_plugin", "zero_cuda_plugin_id", ZERO_CUDA_PLUGIN_ID);
    if (entry.address == nullptr) {
      load.error = entry.error;
      load.other_build = entry.other_build;
      return;
    }
    load.plugin = reinterpret_cast<const CudaPlugin* (*)()>(entry.address)();
    if (load.plugin == nullptr) load.error = std::string(ZERO_CUDA_PLUGIN_FILE) + " gave no plug-in table";
  });
  return load;
}
#endif

}  // namespace

int cuda_device_for_local_rank(int local_rank) {
#if ZERO_WITH_CUDA
  const PluginLoad& load = load_plugin();
  return load.plugin ? load.plugin->device_for_local_rank(local_rank) : -1;
#else
  (void)local_rank;
  return -1;
#endif
}

std::unique_ptr<Backend> make_backend(Context& ctx, const Config& cfg) { return make_backend(ctx, cfg, ctx.comm()); }

std::unique_ptr<Backend> make_backend(Context& ctx, const Config& cfg, Communicator& ranks) {
  const std::string where = cfg.source.empty() ? std::string("the config") : cfg.source;
  if (cfg.backend == BackendKind::host) return make_host_backend(ranks);
#if ZERO_WITH_CUDA
  // The engine would keep the parameter shard in device memory regardless: refuse rather than
  // ignore the setting.
  ZERO_CHECK(cfg.zero_optimization.offload_param.device == OffloadDevice::none,
             where +
                 ": zero_optimization.offload_param.device is set, but the CUDA backend does not offload "
                 "parameters yet (only the optimizer state); set offload_param.device: none, or use "
                 "offload_optimizer.device: cpu / nvme");
  const PluginLoad& load = load_plugin();
  ZERO_CHECK(load.plugin != nullptr || !load.other_build,
             where + ": backend: cuda, but the CUDA backend's library " + load.error +
                 ". Build it with this libzero (cmake --build, or building a program that loads it, builds both) "
                 "and install the two together, or set backend: host");
  ZERO_CHECK(load.plugin != nullptr,
             where + ": backend: cuda, but the CUDA backend's library " + load.error +
                 ". It needs the CUDA runtime, cuBLASLt and NCCL libraries this libzero was built with: install "
                 "them or add their folder to LD_LIBRARY_PATH (ldd on the library lists what is missing), or set "
                 "backend: host");
  return load.plugin->make_backend(ctx, cfg, ranks);
#else
  (void)ctx, (void)ranks;
  ZERO_THROW(where +
             ": backend: cuda, but this libzero was built without CUDA (only the host backend is "
             "available). Rebuild with -DZERO_CUDA=ON (needs nvcc, cuBLASLt and NCCL; cmake prints why "
             "they were not found), or set backend: host");
#endif
}

}  // namespace zero
