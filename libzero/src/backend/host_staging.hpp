// HostOffloadStaging: the OffloadStaging protocol (backend/backend.hpp) over host memory, so that
// the engine's staged offload step, the one a device backend runs, can be tested without a
// device. The host backend hands it out when the environment sets ZERO_HOST_STAGING=1.
//
// It keeps a device's ordering strictly rather than conveniently:
// - add() takes a snapshot of the range's gradients (what the copy stream reads when the step's
//   gradients are final), but the host buffer that host_grads() returns holds NaN until a
//   host_grads() call asks for the chunks holding it: a read that did not wait reads NaN.
// - host_params() buffers hold NaN at each begin(); params_ready() queues the copy back, and only
//   finish() performs the queued copies (the compute stream waits for the upload stream there).
// - finish() refuses a step in which some parameter element was handed back twice or never.
// It counts what crossed, for the tests: gradient chunks copied, host_grads calls, parameter
// elements handed back.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/backend.hpp"

namespace zero {

class HostOffloadStaging final : public OffloadStaging {
 public:
  struct Counts {
    std::int64_t steps = 0;          // finish() calls
    std::int64_t chunk_copies = 0;   // gradient chunks delivered to host buffers
    std::int64_t host_grads = 0;     // host_grads() calls with n > 0
    std::int64_t params_back = 0;    // parameter elements copied back by finish()
    std::int64_t grad_elements = 0;  // elements declared by add()
  };

  void begin(std::size_t grad_esize, std::size_t param_esize, std::size_t chunk) override;
  void add(const void* grads, void* params, std::size_t n) override;
  const void* host_grads(std::size_t r, std::size_t begin, std::size_t n) override;
  void* host_params(std::size_t r, std::size_t begin) override;
  void params_ready(std::size_t r, std::size_t begin, std::size_t n) override;
  void finish() override;
  // The host buffers a device's staging would pin: each range's gradients and parameters (not
  // the snapshot that stands in for the device's gradients).
  std::int64_t host_bytes() const override;

  const Counts& counts() const { return counts_; }

 private:
  struct Range {
    char* dev_params = nullptr;
    std::size_t n = 0;
    std::vector<char> in_flight;                              // the gradients as the copy stream read them
    std::vector<char> grads;                                  // what the host sees: NaN until its chunk is waited for
    std::vector<char> params;                                 // the host's updated parameters
    std::vector<bool> arrived;                                // per chunk
    std::vector<bool> handed_back;                            // per element
    std::vector<std::pair<std::size_t, std::size_t>> queued;  // params_ready's (begin, n)
  };
  Range& range(std::size_t r, std::size_t begin, std::size_t n, const char* who);

  std::vector<Range> ranges_;
  std::size_t gesize_ = 0, esize_ = 0, chunk_ = 1;
  Counts counts_;
};

}  // namespace zero
