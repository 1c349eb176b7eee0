// The logging header: levels chosen by ZERO_LOG_LEVEL, the line format, and byte counts.
#include <catch2/catch.hpp>

#include <cstdlib>

#include "zero/util/log.hpp"

using zero::LogLevel;

TEST_CASE("ZERO_LOG_LEVEL picks the lowest level shown") {
  ::unsetenv("ZERO_LOG_LEVEL");
  CHECK(zero::log_threshold() == LogLevel::info);
  CHECK_FALSE(zero::log_enabled(LogLevel::debug));
  CHECK(zero::log_enabled(LogLevel::info));
  ::setenv("ZERO_LOG_LEVEL", "warning", 1);
  CHECK_FALSE(zero::log_enabled(LogLevel::info));
  CHECK(zero::log_enabled(LogLevel::warning));
  CHECK(zero::log_enabled(LogLevel::error));
  ::setenv("ZERO_LOG_LEVEL", "debug", 1);
  CHECK(zero::log_enabled(LogLevel::debug));
  ::setenv("ZERO_LOG_LEVEL", "off", 1);
  CHECK_FALSE(zero::log_enabled(LogLevel::error));
  CHECK_FALSE(zero::log_enabled(LogLevel::off));
  ::setenv("ZERO_LOG_LEVEL", "loud", 1);  // unknown: the default, with a warning
  CHECK(zero::log_threshold() == LogLevel::info);
  ::unsetenv("ZERO_LOG_LEVEL");
}

TEST_CASE("a log line names its level (no rank prefix without a multi-rank Context)") {
  CHECK(zero::log_line_text(LogLevel::warning, "disk almost full") == "warning: disk almost full");
  CHECK(zero::log_line_text(LogLevel::info, "") == "info: ");
}

TEST_CASE("byte counts use binary units") {
  CHECK(zero::format_bytes(0) == "0 B");
  CHECK(zero::format_bytes(1023) == "1023 B");
  CHECK(zero::format_bytes(1024) == "1.0 KiB");
  CHECK(zero::format_bytes(1536) == "1.5 KiB");
  CHECK(zero::format_bytes(3ull << 20) == "3.0 MiB");
  CHECK(zero::format_bytes((5ull << 30) / 2) == "2.5 GiB");
  CHECK(zero::format_bytes(3ull << 40) == "3.0 TiB");
  CHECK(zero::format_bytes(4096ull << 40) == "4096.0 TiB");
  CHECK(zero::format_bytes(1023, 2) == "1023 B");
  CHECK(zero::format_bytes((3ull << 20) + (3ull << 20) / 4, 2) == "3.75 MiB");
  CHECK(zero::format_bytes(1025, 0) == "1 KiB");
}
