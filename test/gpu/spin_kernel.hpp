// A test-only kernel that keeps a stream busy for a given time (one thread spinning on clock64),
// and one that fails on purpose.
//
// Enqueued just before a producer, it delays the producer by ~20 ms, so a consumer on another
// stream that forgot to wait for the producer's event reads the old data and the test sees a
// wrong result, instead of winning the race by luck the way an unordered consumer usually does.
#pragma once

#include <cuda_runtime_api.h>

namespace zero::gputest {

// Keeps `stream` busy for about `ms` milliseconds of the device's clock.
void spin(cudaStream_t stream, double ms = 20.0);

// Enqueues a kernel that writes through an invalid device pointer: a sticky
// cudaErrorIllegalAddress that leaves the process's CUDA context unusable (tests run it last,
// in a process of its own).
void illegal_write(cudaStream_t stream);

}  // namespace zero::gputest
