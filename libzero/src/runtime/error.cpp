#include "zero/error.hpp"

#include <fmt/format.h>

#include <string>

#include "zero/context.hpp"

namespace zero {

std::string rank_prefix() {
  const Context* ctx = Context::current();
  if (!ctx || ctx->world_size() <= 1) return "";
  return fmt::format("[rank {}/{}] ", ctx->rank(), ctx->world_size());
}

void throw_error(const char* file, int line, const std::string& message) {
  // Strip the build-machine prefix so messages stay short: keep from the project folder on.
  std::string f = file;
  for (const char* top : {"libzero/", "offload/", "examples/", "test/", "bench/"}) {
    if (auto pos = f.rfind(top); pos != std::string::npos) {
      f = f.substr(pos);
      break;
    }
  }
  throw Error(fmt::format("{}{} (at {}:{})", rank_prefix(), message, f, line));
}

}  // namespace zero
