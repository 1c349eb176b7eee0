// The configuration keys as data: one descriptor per key, read by everything that needs to know
// a key (loading, to_yaml, --help, docs/configuration.md's table), so a key is spelt once.
//
// Two tables:
// - config_keys(): the keys libzero reads into Config. A descriptor names the member that holds
//   the value (through a slot function), its kind, range, default, what "auto" means, other
//   spellings DeepSpeed accepts, a one-line doc, and when the key does not apply.
// - foreign_keys(): DeepSpeed keys libzero has no member for, with the policy of issue 14:
//   accepted silently when inert, otherwise a note at start or an error that says why.
// Cross-key rules that need several values at once (fp16 and bf16 both on, offload below its
// stage) stay in code, in config/cross_checks.cpp; the batch triple is resolve()'s (config.cpp).
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "zero/config.hpp"
#include "zero/config_schema.hpp"

namespace YAML {
class Node;
}

namespace zero::keys {

enum class Kind { integer, real, flag, text, choice, pair };

// What "auto" becomes when the application passes no value for the key.
enum class Auto {
  none,      // "auto" is an error
  derived,   // the batch triple: resolve() derives it from the other two and the world size
  fallback,  // the DeepSpeed default (or the value of `auto_from`)
  required,  // the application must pass it (the run length)
};

// The member a key reads into. Enums are stored through their index in Spec::choices.
struct EnumRef {
  int (*get)(const Config&);
  void (*set)(Config&, int);
};
struct PairRef {
  double* first;
  double* second;
};
using Slot = std::variant<int*, std::int64_t*, double*, bool*, std::string*, EnumRef, PairRef>;

struct Spec {
  std::string_view path;  // "zero_optimization.stage"
  Kind kind;
  Slot (*slot)(Config&);
  Range range{};                            // integer and real kinds (each element for pair)
  std::vector<std::string_view> choices{};  // choice: index = enum value; "" is never accepted
  bool any_case = false;                    // choice: case-insensitive (optimizer names)
  Auto auto_rule = Auto::none;
  std::string_view auto_from{};             // fallback: another key's value instead of the default
  std::vector<std::string_view> aliases{};  // other spellings of the last path part
  std::string_view doc{};
  std::string_view default_text{};  // documented default when not simply the member's default
  // Sets a default that depends on keys read before (overlap_comm on at stage 3). Optional.
  void (*dynamic_default)(Config&) = nullptr;
  std::string_view default_depends_on{};  // the key the dynamic default follows, for messages
  // Non-empty when the key does not apply to what was read so far (betas with SGD): giving it
  // is an error with this reason, and to_yaml leaves it out.
  std::string (*inapplicable)(const Config&) = nullptr;
  // True when to_yaml leaves the key out although it applies (comm with the host backend).
  bool (*omitted)(const Config&) = nullptr;
  // Values DeepSpeed accepts that libzero refuses, with why (optimizer.type: Lamb).
  std::vector<std::pair<std::string_view, std::string_view>> refused_values{};
  // True where DeepSpeed reads the key set to null (JSON null, YAML ~) as not set: an Optional
  // field of its pydantic models, or a `.get(key, default)` whose default is None. Such a null
  // loads as the default, with a note; any other key set to null is an error.
  bool null_is_default = false;
};

const std::vector<Spec>& config_keys();
// config_keys()'s optimizer section, in reading order (keys_optimizer.cpp).
std::vector<Spec> optimizer_keys();

// Shorthands for the tables' ranges.
inline Range ge(double lo) { return Range::at_least(lo); }
inline Range between(double lo, double hi) { return Range::closed(lo, hi); }
inline Range below(double hi) { return Range{-std::numeric_limits<double>::infinity(), hi, false, true}; }

enum class Policy { silent, note, refused };

struct Foreign {
  std::string_view path;  // "wall_clock_breakdown", "zero_optimization.round_robin_gradients"
  Policy policy;          // for a value outside `inert`
  // '|'-separated values with no effect here, always silent ("false|0"); for a section, the
  // values of its "enabled" key. Empty: every value gets `policy`.
  std::string_view inert{};
  std::string_view why{};  // the note, or the reason of the error
  std::vector<std::string_view> aliases{};
  // Decides instead of `inert` where the answer depends on other settings; returns true when
  // the value is inert.
  bool (*inert_if)(const Config&, const YAML::Node&) = nullptr;
  std::string_view inert_when{};  // what inert_if checks, for the documentation ("matches the compute dtype")
};

const std::vector<Foreign>& foreign_keys();

// Sections that DeepSpeed spells another way (bfloat16 for bf16).
struct SectionAlias {
  std::string_view path, alias;
};
const std::vector<SectionAlias>& section_aliases();

// Sections that DeepSpeed reads set to null as absent (bf16, aio, optimizer.params, the offload
// sections): their keys keep their defaults. Any other section set to null is an error.
const std::vector<std::string_view>& null_default_sections();

// Text forms used by messages, to_yaml and the documentation.
std::string value_text(const Spec& s, const Config& c);  // "3", "true", "[0.9, 0.999]"
std::string type_text(const Spec& s);                    // "integer 0..3, or `auto`"
std::string default_text(const Spec& s);                 // "`500000000`"
// The effective range of an integer key: its Range clipped to the member's type.
Range integer_range(const Spec& s);

}  // namespace zero::keys
