// CudaBackend: the engine on one GPU per rank (backend: cuda).
//
// Memory comes from one caching DeviceAllocator (pinned host memory from offload::PinnedPool);
// arithmetic is the kernels of kernels.hpp, all on the compute stream; communication is NCCL
// (comm: nccl) or MPI through pinned copies (comm: mpi), bootstrapped over the host communicator
// the backend was made over, and the same kind over any sub-group of it (group_comm: hpZ's and
// MiCS's groups); offloaded optimizer steps are staged
// asynchronously by CudaOffloadStaging on the copy (D2H) and upload (H2D) streams. Nothing here
// synchronizes the host with the device except to_host / from_host (used outside the training
// loop: initialization, reports, checkpoints) and stats_finish, which reads the gradient norm
// once per step. Shutdown waits for the streams within ZERO_NCCL_TIMEOUT_S, after aborting the
// communicator first when an exception is unwinding.
#pragma once

#include <memory>

#include "backend/backend.hpp"

namespace zero {

class Communicator;
class Context;
struct Config;

// Over the ranks of `ranks` (a host communicator that outlives the backend: the world, a
// data-parallel group, a MiCS shard group). Throws zero::Error when the rank has no device
// (ctx.device() < 0) or NCCL cannot start.
std::unique_ptr<Backend> make_cuda_backend(Context& ctx, const Config& cfg, Communicator& ranks);

}  // namespace zero
