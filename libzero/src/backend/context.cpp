#include "zero/context.hpp"

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>
#include <thread>

#include "comm/mpi_comm.hpp"
#include "runtime/log.hpp"
#include "zero/error.hpp"

#include "backend/cuda_plugin.hpp"

namespace zero {

namespace {
Context* g_current = nullptr;

// MPI's default handler aborts without saying which call failed; returning codes lets
// ZERO_MPI_CHECK name the call site and the rank.
void install_error_handler() { MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN); }

// The handler std::terminate had before the Context installed its own.
std::terminate_handler g_previous_terminate = nullptr;

// An exception that escapes outside Context::run (or from a thread) ends in std::terminate.
// The default handler prints "terminate called after throwing an instance of 'zero::Error'"
// and raises SIGABRT, so every rank adds a backtrace from the MPI runtime around the message.
// This one prints the message once, as Context::abort does, and ends the job with MPI_Abort.
[[noreturn]] void on_terminate() {
  // A second thread that terminates while the first reports waits to be ended with the job.
  static std::atomic<bool> reporting{false};
  if (reporting.exchange(true)) {
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  std::string what =
      "std::terminate was called without an active exception (a noexcept function threw, or a "
      "joinable std::thread was destroyed)";
  if (std::exception_ptr e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      what = x.what();
    } catch (...) {
      what = "an exception that is not a std::exception ended the process";
    }
  }
  if (const Context* c = Context::current()) c->abort(what);
  // No Context any more (after its destructor): the handler that was there before.
  if (g_previous_terminate) g_previous_terminate();
  std::abort();
}
}  // namespace

Context* Context::current() { return g_current; }

Context::Context(int* argc, char*** argv) {
  ZERO_CHECK(g_current == nullptr, "a zero::Context already exists in this process; create one per process");
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    ZERO_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
    owns_mpi_ = true;
  }
  install_error_handler();
  ZERO_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  ZERO_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world_));
  // Ranks sharing a node (shared memory) give the local rank, which picks the GPU.
  MPI_Comm node = MPI_COMM_NULL;
  ZERO_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
  ZERO_MPI_CHECK(MPI_Comm_rank(node, &local_rank_));
  ZERO_MPI_CHECK(MPI_Comm_size(node, &local_size_));
  MPI_Comm_free(&node);
  comm_ = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD);
  g_current = this;
  g_previous_terminate = std::set_terminate(on_terminate);
}

// CUDA backend: one device per local rank, round robin (ranks beyond the device count share,
// which only comm: mpi supports). No device, no driver or no CUDA runtime gives -1: a CUDA build
// must still run host-backend jobs on machines without a GPU. Asked for only when needed, so a
// host-backend job loads no CUDA library; only chosen, not made current (the CUDA backend makes
// it current when it starts).
int Context::device() const {
  if (device_ == kDeviceUnknown) device_ = cuda_device_for_local_rank(local_rank_);
  return device_;
}

Context::~Context() {
  std::set_terminate(g_previous_terminate);
  comm_.reset();
  g_current = nullptr;
  if (owns_mpi_) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }
}

void Context::abort(const std::string& message, int code) const {
  // zero::Error's messages open with this rank's prefix; the line names the rank once, before the level.
  std::string_view text = message;
  if (const std::string own = rank_prefix(); !own.empty() && text.starts_with(own)) text.remove_prefix(own.size());
  // The log's line format, but not log(): the job ends next, so the line must get out whatever
  // ZERO_LOG_LEVEL says, and without waiting on stdio's lock (another thread may hold it for good).
  write_last_words(log_line_text(LogLevel::error, text) + '\n');
  if (world_ > 1) MPI_Abort(MPI_COMM_WORLD, code);
  std::exit(code);
}

}  // namespace zero
