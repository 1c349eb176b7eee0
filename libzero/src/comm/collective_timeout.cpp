#include "comm/collective_timeout.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <string>
#include <thread>

#include "zero/error.hpp"

namespace zero {

double collective_timeout_s() {
  const char* name = "ZERO_TIMEOUT_S";
  const char* v = std::getenv(name);
  if (!v || !*v) {
    name = "ZERO_NCCL_TIMEOUT_S";
    v = std::getenv(name);
  }
  if (!v || !*v) return 600.0;
  char* end = nullptr;
  errno = 0;
  const double t = std::strtod(v, &end);
  ZERO_CHECK(end != v && *end == '\0' && errno == 0 && std::isfinite(t) && t >= 0.0,
             std::string(name) + "='" + v +
                 "' is not a number of seconds >= 0; set it to e.g. 600 (0 disables the collective deadline)");
  return t;
}

Backoff::Duration Backoff::next() {
  if (polls_ < spins_) {
    ++polls_;
    return Duration::zero();
  }
  const Duration d = next_;
  next_ = std::min(next_ * 2, cap_);
  return d;
}

void Backoff::pause() {
  const Duration d = next();
  if (d > Duration::zero()) std::this_thread::sleep_for(d);
}

}  // namespace zero
