// The CUDA implementation of the GPT model's Ops (../ops.hpp): bf16 parameters, gradients and
// activations in device memory, fp32 statistics, every operation enqueued on one stream.
//
// Only the factory is public, so this header needs nothing of CUDA but the runtime API's
// types and plain C++ translation units (the model, the tests) can include it.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>

#include "gpt/ops.hpp"

namespace zero::gpt {

// Ops on the current device. Every call is enqueued on `stream`, which the caller keeps
// alive until the Ops is destroyed; with a null stream the Ops creates (and later destroys) a
// non-blocking stream of its own, which Ops::stream() returns. Throws zero::Error when
// cuBLASLt cannot be set up.
std::unique_ptr<Ops> make_cuda_ops(cudaStream_t stream);

}  // namespace zero::gpt
