// Fuzz target: the config loader (zero::parse_config) on arbitrary text.
//
// Every input must end in a Config or a zero::Error, in bounded time and memory: yaml-cpp and
// the schema walk see text straight from users' files and --set strings. A config that loads must
// also survive its own round trip (to_yaml, parsed again), since checkpoints store that text.
#include <cstddef>
#include <cstdint>
#include <string>

#include "zero/config.hpp"
#include "zero/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  zero::LoadOptions opts;
  opts.extra_sections = {"model", "data", "run"};  // the trainer's sections take the per-key location walk
  zero::Config c;
  try {
    c = zero::parse_config(text, "fuzz.yaml", opts);
  } catch (const zero::Error&) {
    return 0;
  }
  zero::parse_config(c.to_yaml(), "fuzz.yaml (round trip)", opts);  // must not throw
  return 0;
}
