// What the collective watchdog saw, and the message it ends the job with.
//
// The watchdog (watchdog.hpp) is often the first to notice a failure that is not the
// collective's: a kernel that faulted (an illegal address, a launch failure) spoils the whole
// CUDA context, and the collective's completion event is simply where the sticky error shows up
// first, before any call of the main thread does. Reporting that as a collective failure, with
// "raise ZERO_NCCL_TIMEOUT_S" advice, sends the user after the network; it is reported as the
// kernel failure it is, with the way to find the kernel (CUDA_LAUNCH_BLOCKING=1,
// compute-sanitizer). A collective that did not finish in time, a CUDA error that is not a
// kernel's, and NCCL's own asynchronous error each get the advice that fits them.
//
// Nothing here calls CUDA or NCCL: the watchdog hands over the error's name and text
// (cudaGetErrorName / cudaGetErrorString), so the classification and every message are checked
// on any machine (test/unit/cuda/test_watchdog_report.cpp, in every build, CUDA or not: hence a
// header of inline functions, which needs no CUDA library to link).
#pragma once

#include <fmt/format.h>

#include <string>
#include <string_view>
#include <utility>

namespace zero::cuda {

// A sticky error that a kernel's failure leaves in the CUDA context, by its name
// (cudaErrorIllegalAddress, cudaErrorLaunchFailure, cudaErrorMisalignedAddress, ...): every
// later CUDA call reports it, and where it is reported says nothing about which kernel failed.
inline bool is_kernel_fault(std::string_view name) {
  // A kernel's fault, sticky in the context: an access the memory system refused, an instruction
  // the SM could not run, a device-side assert, a kernel the display watchdog stopped.
  for (std::string_view k : {"cudaErrorIllegalAddress", "cudaErrorLaunchFailure", "cudaErrorMisalignedAddress",
                             "cudaErrorIllegalInstruction", "cudaErrorInvalidPc", "cudaErrorHardwareStackError",
                             "cudaErrorAssert", "cudaErrorLaunchTimeout"})
    if (name == k) return true;
  return false;
}

// What to do about a kernel that failed: find it (the sentence cuda_check's hint uses too).
inline const char* kernel_fault_advice() {
  return "rerun with CUDA_LAUNCH_BLOCKING=1 to stop at the failing launch, or under compute-sanitizer "
         "(compute-sanitizer --tool memcheck <program>) to find the bad access";
}

struct WatchdogFinding {
  enum Kind {
    kernel_fault,  // a kernel failed; the collective or NCCL is where it was noticed
    device_error,  // another CUDA error while waiting for the collective
    stalled,       // the collective did not complete within the timeout
    comm_error,    // the communicator's asynchronous error (NCCL's own account)
  };
  Kind kind = stalled;
  std::string collective;  // what it was waiting for (the watchdog's description); may be empty
  std::string error;       // the CUDA error ("name (text)") or NCCL's account
  double timeout_s = 0.0;  // stalled: the collective timeout
};

// The collective's completion event reported CUDA error `name` (`text`): a kernel fault or
// another device error.
inline WatchdogFinding event_error(std::string_view name, std::string_view text, std::string collective) {
  WatchdogFinding f;
  f.kind = is_kernel_fault(name) ? WatchdogFinding::kernel_fault : WatchdogFinding::device_error;
  f.error = fmt::format("{} ({})", name, text);
  f.collective = std::move(collective);
  return f;
}
// The collective did not complete within `timeout_s`.
inline WatchdogFinding stalled(std::string collective, double timeout_s) {
  WatchdogFinding f;
  f.kind = WatchdogFinding::stalled;
  f.collective = std::move(collective);
  f.timeout_s = timeout_s;
  return f;
}
// The communicator reported `nccl` asynchronously. `device_name` / `device_text` are the CUDA
// context's own state at that moment (cudaSuccess where it is fine): NCCL fails too after a
// kernel's fault, and then the kernel is the news.
inline WatchdogFinding comm_error(std::string nccl, std::string_view device_name, std::string_view device_text) {
  WatchdogFinding f;
  if (is_kernel_fault(device_name)) {
    f.kind = WatchdogFinding::kernel_fault;
    f.error = fmt::format("{} ({}); {}", device_name, device_text, nccl);
  } else {
    f.kind = WatchdogFinding::comm_error;
    f.error = std::move(nccl);
  }
  return f;
}

// The line the job ends with: "[rank r/n] error: collective watchdog: ...", the finding, this
// rank's last collectives (`recent`, may be empty) and the advice for its kind.
inline std::string watchdog_message(const WatchdogFinding& f, int rank, int world, const std::string& recent) {
  // The log's line format ("[rank r/n] error: ..."), but with the rank named even in a job of
  // one: a collective failure is the one message where "which rank" is the first question.
  const std::string last = recent.empty() ? "" : "; this rank's last collectives: " + recent;
  const std::string head = fmt::format("[rank {}/{}] error: collective watchdog: ", rank, world);
  const char* abort = "Aborting the job so that no rank waits forever";
  const char* nccl_debug = "run with NCCL_DEBUG=WARN to see NCCL's account";
  const std::string waiting = f.collective.empty() ? "" : " while waiting for " + f.collective;
  switch (f.kind) {
    case WatchdogFinding::kernel_fault:
      return fmt::format(
          "{}a kernel failed; the collective is where it was noticed, not necessarily what caused it: {}{}{}. The "
          "CUDA context is unusable from here on (the error is sticky). {}; {}",
          head, f.error, waiting, last, abort, kernel_fault_advice());
    case WatchdogFinding::device_error:
      return fmt::format("{}CUDA error {}{}{}. {}; {}", head, f.error, waiting, last, abort, nccl_debug);
    case WatchdogFinding::stalled:
      return fmt::format(
          "{}{}, did not complete within the collective timeout of {:g} s (ZERO_NCCL_TIMEOUT_S): a rank is missing "
          "from it, stalled or dead{}. {}; {}, or raise ZERO_NCCL_TIMEOUT_S if the collective is legitimately that "
          "slow",
          head, f.collective, f.timeout_s, last, abort, nccl_debug);
    case WatchdogFinding::comm_error: break;
  }
  return fmt::format("{}{}{}{}. {}; {}", head, f.error, waiting, last, abort, nccl_debug);
}

}  // namespace zero::cuda
