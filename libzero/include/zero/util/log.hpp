// One way to tell the user something on stderr: "[rank r/n] level: text", one line per message.
//
// libzero speaks rarely (notes at start-up, warnings about things it could not clean up, errors
// it cannot throw), so the logger is a function, not a framework: each message is written with
// one write so lines of different ranks and threads do not interleave, and ZERO_LOG_LEVEL
// (debug, info, warning, error, off; default info) silences what a job does not want to see.
// The library formats its messages with fmt (libzero/src/runtime/log.hpp); this header needs nothing
// beyond the standard library, so programs that include it need no extra package.
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
