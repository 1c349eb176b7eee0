// zero::Error and the check macros: every failure in libzero is a zero::Error whose message says
// what was wrong, where (the call, config key path and file:line, rank) and what to do about it.
// The macros pass their source location, which the message carries only with
// ZERO_ERROR_SOURCE=1 (for a bug report: an installed package has no sources to look it up in).
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace zero {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Builds the message (rank prefix; source location with ZERO_ERROR_SOURCE=1) and throws. Kept out of line so the macros
// stay small.
[[noreturn]] void throw_error(const char* file, int line, const std::string& message);

// Rank prefix used in messages ("[rank 3/4] "); empty until a Context exists.
std::string rank_prefix();

}  // namespace zero

#define ZERO_THROW(msg) ::zero::throw_error(__FILE__, __LINE__, (msg))
#define ZERO_CHECK(cond, msg)                                    \
  do {                                                           \
    if (!(cond)) ::zero::throw_error(__FILE__, __LINE__, (msg)); \
  } while (0)

#define ZERO_MPI_CHECK(call)                                                                            \
  do {                                                                                                  \
    int zero_mpi_rc_ = (call);                                                                          \
    if (zero_mpi_rc_ != 0)                                                                              \
      ::zero::throw_error(__FILE__, __LINE__,                                                           \
                          std::string(#call " failed with MPI error ") + std::to_string(zero_mpi_rc_)); \
  } while (0)
