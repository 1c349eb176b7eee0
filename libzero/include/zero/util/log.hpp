// One way to tell the user something on stderr: "[rank r/n] level: text", one line per message,
// one write each (ranks and threads do not interleave), filtered by ZERO_LOG_LEVEL.
// Why a function and not a framework: docs/architecture.md, note logging.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace zero {

enum class LogLevel { debug, info, warning, error, off };

constexpr const char* to_string(LogLevel l) {
  switch (l) {
    case LogLevel::debug: return "debug";
    case LogLevel::info: return "info";
    case LogLevel::warning: return "warning";
    case LogLevel::error: return "error";
    case LogLevel::off: return "off";
  }
  return "?";
}

// The level ZERO_LOG_LEVEL asks for (read at each call: cheap, and tests can change it). An
// unknown value falls back to info and says so once.
LogLevel log_threshold();
inline bool log_enabled(LogLevel l) { return l != LogLevel::off && l >= log_threshold(); }

// "[rank r/n] level: message" (no rank prefix in a single-process job), without the newline.
std::string log_line_text(LogLevel l, std::string_view message);
// Writes the line to stderr when the level is enabled.
void log(LogLevel l, std::string_view message);

// A byte count for people: "512 B", "1.5 KiB", "12.0 MiB", "3.2 GiB" (binary units), with
// `decimals` digits after the point above 1 KiB (a report whose ratios are checked wants two).
std::string format_bytes(std::uint64_t bytes, int decimals = 1);

}  // namespace zero
