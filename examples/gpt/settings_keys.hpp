// The trainer's keys as data, one row per key, in the form of libzero's own key table
// (libzero/src/config/keys.hpp): that table is private to the library and typed for zero::Config,
// so the trainer declares its rows here and reads them with the library's public StrictSection.
// The rows are in reading order: a key's default may follow a key read before it (the preset
// sets the shape, out_dir follows the preset).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "gpt/settings.hpp"
#include "zero/config_schema.hpp"

namespace zero::gpt::keys {

// The member a key reads into: integer (int, int64, uint64), real, flag, or string.
using Slot = std::variant<int*, std::int64_t*, std::uint64_t*, double*, bool*, std::string*>;
// A fixed default, of the member's kind; none where `dynamic_default` or a key read before sets it.
using Value = std::variant<std::monostate, std::int64_t, double, bool, std::string_view>;

struct Key {
  std::string_view section;              // "model"
  std::string_view name;                 // "n_layer"
  Slot (*slot)(GptSettings&) = nullptr;  // null for a retired key
  Value def{};
  Range range{};                       // integers and reals
  std::vector<std::string> choices{};  // a string member limited to these
  std::string doc{};                   // one line for --help and the documented table
  std::string_view default_text{};     // shown instead of `def` where it is not fixed (Markdown)
  // Sets the default from the keys read before (out_dir: runs/<preset>).
  void (*dynamic_default)(GptSettings&) = nullptr;
  // Runs once the key is read (the preset expands into the shape that the keys after it override).
  void (*then)(GptSettings&) = nullptr;
  // What is wrong with the value read ("" when nothing), continuing "data.train ...".
  std::string (*check)(const GptSettings&) = nullptr;
  // True when the resolved section leaves the key out (init_from when it is empty).
  bool (*omitted)(const GptSettings&) = nullptr;
  // A key that no longer exists: giving it is an error that says why and what replaced it.
  std::string_view retired{};
};

const std::vector<Key>& gpt_keys();

}  // namespace zero::gpt::keys
