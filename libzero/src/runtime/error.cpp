#include "zero/error.hpp"

#include <fmt/format.h>

#include <cstdlib>
#include <string>
#include <string_view>

#include "zero/context.hpp"

namespace zero {

std::string rank_prefix() {
  const Context* ctx = Context::current();
  if (!ctx || ctx->world_size() <= 1) return "";
  return fmt::format("[rank {}/{}] ", ctx->rank(), ctx->world_size());
}

void throw_error(const char* file, int line, const std::string& message) {
  // A message names the call, config key or docs page to act on; the source location means
  // nothing to a user of an installed package (no src/ there), so it is added only on request,
  // for a bug report: ZERO_ERROR_SOURCE=1.
  static const bool with_source = [] {
    const char* v = std::getenv("ZERO_ERROR_SOURCE");
    return v && *v && std::string_view(v) != "0";
  }();
  if (!with_source) throw Error(rank_prefix() + message);
  // Strip the build-machine prefix so messages stay short: keep from the project folder on.
  std::string f = file;
  for (const char* top : {"libzero/", "offload/", "examples/", "test/", "bench/"}) {
    if (auto pos = f.rfind(top); pos != std::string::npos) {
      f = f.substr(pos);
      break;
    }
  }
  throw Error(fmt::format("{}{} (libzero source: {}:{})", rank_prefix(), message, f, line));
}

}  // namespace zero
