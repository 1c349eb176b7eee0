// The process's place in the job: MPI bootstrap (mpirun, srun, or alone as world size 1), rank,
// world size, local rank; and the failure policy: an exception on one rank prints its message once
// and aborts the whole job, inside ctx.run() or anywhere else (docs/training-loop.md, Launching).
#pragma once

#include <memory>
#include <string>

namespace zero {

class Communicator;

class Context {
 public:
  // Initialises MPI (thread level: funneled) unless already initialised by the application.
  Context(int* argc = nullptr, char*** argv = nullptr);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_; }
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  // CUDA device chosen for this rank (local_rank modulo device count), -1 without CUDA. In a
  // CUDA build the first call loads the CUDA backend's library (libzero_cuda); -1 when it or
  // the CUDA runtime cannot be loaded.
  int device() const;
  bool is_root() const { return rank_ == 0; }

  // The data-parallel communicator over all ranks (host/MPI implementation).
  Communicator& comm() { return *comm_; }

  // Ends the whole job with `message` printed by this rank. Never returns.
  [[noreturn]] void abort(const std::string& message, int code = 1) const;

  // Runs fn; an exception escaping it aborts the job with its message (the policy above).
  template <class F>
  int run(F&& fn) {
    try {
      return fn();
    } catch (const std::exception& e) {
      abort(e.what());
    }
  }

  // The live context, or nullptr (used for rank prefixes in messages).
  static Context* current();

 private:
  int rank_ = 0, world_ = 1, local_rank_ = 0, local_size_ = 1;
  mutable int device_ = kDeviceUnknown;  // probed on first use: a host job never touches CUDA
  static constexpr int kDeviceUnknown = -2;
  bool owns_mpi_ = false;
  std::unique_ptr<Communicator> comm_;
};

}  // namespace zero
