// CollectiveCheck: every rank states the collective it is about to issue, and ranks that
// disagree stop together with one message naming each rank's call (see zero/comm.hpp).
//
// The statement is a 64-bit fingerprint of (kind, count, dtype, root, site). One all-reduce of
// {fingerprint, ~fingerprint} with MAX on a private duplicate of the communicator gives every
// rank the largest and the smallest fingerprint; they are equal exactly when all ranks agree.
// That all-reduce has the same shape whatever the ranks are about to do, so it always matches,
// even when the collectives behind it would not. On disagreement the ranks exchange their
// descriptions (fixed-size text, again always matching) and each throws the same zero::Error.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <array>
#include <functional>
#include <mutex>
#include <string>

#include "zero/comm.hpp"
#include "zero/dtype.hpp"

namespace zero {

class CollectiveCheck {
 public:
  explicit CollectiveCheck(MPI_Comm comm);  // duplicates comm
  ~CollectiveCheck();
  CollectiveCheck(const CollectiveCheck&) = delete;
  CollectiveCheck& operator=(const CollectiveCheck&) = delete;

  // False when ZERO_COLLECTIVE_CHECK=0 (for measuring the check's cost).
  bool enabled() const { return enabled_; }
  // Agrees on this rank's next collective with every peer; throws zero::Error naming each rank's
  // call when they differ. `wait` completes a request under the collective deadline.
  void agree(const char* kind, std::size_t count, DType t, int root, const std::function<void(MPI_Request&)>& wait);
  // Records a point-to-point call (kind "send" or "recv", root: the peer) in the recent list
  // without any agreement: only two ranks take part (zero/comm.hpp).
  void note(const char* kind, std::size_t count, DType t, int peer);
  // This rank's last collectives, oldest first ("#25 reduce(h.1): reduce_scatter of ..."), for
  // reports written while a collective hangs (the CUDA watchdog's, from its own thread).
  std::string recent() const;

 private:
  struct Stated {
    std::int64_t seq = 0;
    const char* kind = nullptr;
    std::size_t count = 0;
    DType t = DType::f32;
    int root = -1;
    CommSite site;
  };
  static constexpr std::size_t kRecent = 8;
  mutable std::mutex recent_mu_;  // the watchdog thread reads what the loop's thread writes
  std::array<Stated, kRecent> recent_{};

  MPI_Comm comm_ = MPI_COMM_NULL;
  bool enabled_ = true;
  int rank_ = 0, size_ = 1;
  std::int64_t seq_ = 0;
  std::int64_t stated_ = 0;  // collectives stated, checked or not (the ring's count)
};

// "gather(h.3) [eval]: all_gather of 768 bf16": a collective as the check's messages name it
// (a point-to-point call: "pipeline: send to rank 1 of 4096 f32").
std::string describe_collective(const CommSite& site, const char* kind, std::size_t count, DType t, int root);

}  // namespace zero
