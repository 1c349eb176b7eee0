#include "zero/util/log.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include "runtime/log.hpp"
#include "zero/error.hpp"

namespace zero {

LogLevel log_threshold() {
  const char* env = std::getenv("ZERO_LOG_LEVEL");
  if (env == nullptr || *env == '\0') return LogLevel::info;
  const std::string_view v(env);
  for (LogLevel l : {LogLevel::debug, LogLevel::info, LogLevel::warning, LogLevel::error, LogLevel::off})
    if (v == to_string(l)) return l;
  static std::atomic<bool> warned{false};
  if (!warned.exchange(true))
    std::fputs(fmt::format("{}warning: ZERO_LOG_LEVEL='{}' is not one of debug, info, warning, error, off; "
                           "using info\n",
                           rank_prefix(), v)
                   .c_str(),
               stderr);
  return LogLevel::info;
}

std::string log_line_text(LogLevel l, std::string_view message) {
  return fmt::format("{}{}: {}", rank_prefix(), to_string(l), message);
}

void log(LogLevel l, std::string_view message) {
  if (!log_enabled(l)) return;
  std::string line = log_line_text(l, message);
  line += '\n';
  // One call per line: stderr is unbuffered, so this keeps a line whole among threads.
  std::fwrite(line.data(), 1, line.size(), stderr);
}

void write_last_words(std::string_view line) {
  while (!line.empty()) {
    const ssize_t n = ::write(STDERR_FILENO, line.data(), line.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // nowhere left to say it
    line.remove_prefix(static_cast<std::size_t>(n));
  }
}

std::string format_bytes(std::uint64_t bytes, int decimals) {
  static constexpr std::array<const char*, 5> kUnits = {"B", "KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) return fmt::format("{} B", bytes);
  double x = static_cast<double>(bytes);
  std::size_t u = 0;
  while (x >= 1024.0 && u + 1 < kUnits.size()) {
    x /= 1024.0;
    ++u;
  }
  return fmt::format("{:.{}f} {}", x, decimals, kUnits[u]);
}

}  // namespace zero
