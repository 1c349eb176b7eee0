// A key's descriptor as text, for messages, to_yaml and the generated reference: its value, its
// type and its default; and the range an integer key accepts, its Range clipped to the member.
#include <fmt/format.h>

#include <limits>
#include <string>
#include <variant>

#include "config/keys.hpp"
#include "runtime/strings.hpp"
#include "zero/settings_table.hpp"

namespace zero::keys {

namespace {

constexpr double kI64 = 9.2e18;  // "no upper bound" for an int64 member (clipped to the type)

}  // namespace

Range integer_range(const Spec& s) {
  Range r = s.range;
  double type_max = kI64;
  Config probe;
  if (std::holds_alternative<int*>(s.slot(probe))) {
    type_max = static_cast<double>(std::numeric_limits<int>::max());
  }
  if (r.hi > type_max) r.hi = type_max;
  if (r.lo < -type_max) r.lo = -type_max;
  return r;
}

std::string value_text(const Spec& s, const Config& c) {
  Config& m = const_cast<Config&>(c);  // slots only read here
  return std::visit(
      [&](auto p) -> std::string {
        using P = decltype(p);
        if constexpr (std::is_same_v<P, int*> || std::is_same_v<P, std::int64_t*>) {
          return fmt::format("{}", *p);
        } else if constexpr (std::is_same_v<P, double*>) {
          return shortest_text(*p);
        } else if constexpr (std::is_same_v<P, bool*>) {
          return *p ? "true" : "false";
        } else if constexpr (std::is_same_v<P, std::string*>) {
          return *p;
        } else if constexpr (std::is_same_v<P, EnumRef>) {
          return std::string(s.choices[static_cast<std::size_t>(p.get(c))]);
        } else {
          std::string out = "[";
          out.append(shortest_text(*p.first)).append(", ").append(shortest_text(*p.second));
          out.push_back(']');
          return out;
        }
      },
      s.slot(m));
}

std::string type_text(const Spec& s) {
  // The kinds an application's settings table has too are written by its code
  // (zero/settings_table.hpp), so both tables read alike.
  std::string t;
  if (s.kind == Kind::choice) {
    const std::vector<std::string> names(s.choices.begin(), s.choices.end());
    t = setting_text::type(static_cast<std::string*>(nullptr), s.range, names);
    if (s.any_case) t += " (any case)";
  } else if (s.kind == Kind::pair) {
    t = "list of 2 numbers " + s.range.describe();
  } else {
    Config probe;
    t = std::visit(
        [&](auto p) -> std::string {
          if constexpr (std::is_pointer_v<decltype(p)>)
            return setting_text::type(p, s.range, {});  // integers clipped to the member
          return "";                                    // enum and pair slots are the choice and pair kinds above
        },
        s.slot(probe));
  }
  if (s.auto_rule != Auto::none) t += ", or `auto`";
  return t;
}

std::string default_text(const Spec& s) {
  if (!s.default_text.empty()) return std::string(s.default_text);
  std::string out = "`";
  out.append(value_text(s, Config{}));
  out.push_back('`');
  return out;
}

}  // namespace zero::keys
