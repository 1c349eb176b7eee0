// fmt-formatted logging for the library's own sources: zero::log_info("{} of {}", a, b).
//
// The level check comes first, so a disabled message costs no formatting. fmt stays a private
// dependency: only libzero's sources include this header.
#pragma once

#include <fmt/format.h>

#include <utility>

#include "zero/util/log.hpp"

namespace zero {

template <class... A>
void log_at(LogLevel l, fmt::format_string<A...> f, A&&... args) {
  if (log_enabled(l)) log(l, fmt::format(f, std::forward<A>(args)...));
}
template <class... A>
void log_info(fmt::format_string<A...> f, A&&... args) {
  log_at(LogLevel::info, f, std::forward<A>(args)...);
}
template <class... A>
void log_warning(fmt::format_string<A...> f, A&&... args) {
  log_at(LogLevel::warning, f, std::forward<A>(args)...);
}
template <class... A>
void log_error(fmt::format_string<A...> f, A&&... args) {
  log_at(LogLevel::error, f, std::forward<A>(args)...);
}

// The last words of a process about to abort (a line with its newline, built by the caller in
// the format above). Written with write(2), not through log(): stdio's lock may be held by a
// thread that will never release it (stuck in a collective, or interrupted), and ZERO_LOG_LEVEL
// must not hide why a job died.
void write_last_words(std::string_view line);

}  // namespace zero
