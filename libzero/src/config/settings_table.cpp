// The per-row work of zero::SettingsTable (zero/settings_table.hpp): defaults, strict reads and
// the text forms, which libzero's own key table shares (key_text.cpp).
#include "zero/settings_table.hpp"

#include <fmt/format.h>

#include <limits>
#include <type_traits>

#include "runtime/strings.hpp"
#include "zero/error.hpp"

namespace zero::setting_text {

namespace {

template <class P>
constexpr bool kInteger = std::is_integral_v<P> && !std::is_same_v<P, bool>;

// The bounds an integer member accepts: its range clipped to the type (a uint64 member, a seed,
// to what get_int reads: int64's non-negative values).
template <class T>
std::pair<std::int64_t, std::int64_t> integer_bounds(const Range& range) {
  constexpr auto type_lo = static_cast<std::int64_t>(std::numeric_limits<T>::min());
  constexpr std::int64_t type_hi = std::is_same_v<T, std::uint64_t>
                                       ? std::numeric_limits<std::int64_t>::max()
                                       : static_cast<std::int64_t>(std::numeric_limits<T>::max());
  const std::int64_t lo = range.lo <= static_cast<double>(type_lo) ? type_lo : static_cast<std::int64_t>(range.lo);
  const std::int64_t hi = range.hi >= static_cast<double>(type_hi) ? type_hi : static_cast<std::int64_t>(range.hi);
  return {lo, hi};
}

// A double-quoted YAML scalar: safe for globs ("*" would start an alias) and paths. Control
// bytes are escaped (a raw newline in a quoted scalar reads back as a space), so the saved
// config says exactly what ran.
std::string quoted(const std::string& s) {
  std::string q = "\"";
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      q += '\\';
      q += ch;
    } else if (c == '\n') {
      q += "\\n";
    } else if (c < 0x20 || c == 0x7f) {
      q += fmt::format("\\x{:02x}", c);
    } else {
      q += ch;
    }
  }
  return q + "\"";
}

// `text` in lines of at most `width` columns, each after `indent` spaces but the first.
std::string wrapped(const std::string& text, std::size_t indent, std::size_t width) {
  std::string out, line;
  std::size_t at = 0;
  while (at < text.size()) {
    std::size_t end = text.find(' ', at);
    if (end == std::string::npos) end = text.size();
    const std::string word = text.substr(at, end - at);
    if (!line.empty() && indent + line.size() + 1 + word.size() > width) {
      out += line + "\n" + std::string(indent, ' ');
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
    at = end + 1;
  }
  return out + line;
}

}  // namespace

void assign(SettingSlot slot, const SettingValue& def, std::string_view key) {
  std::visit(
      [&](auto p) {
        using P = std::remove_pointer_t<decltype(p)>;
        using V = std::conditional_t<kInteger<P>, std::int64_t,
                                     std::conditional_t<std::is_same_v<P, std::string>, std::string_view, P>>;
        if (!std::holds_alternative<V>(def))
          ZERO_THROW(fmt::format("settings table: the default of {} is not of its member's kind", key));
        *p = static_cast<P>(std::get<V>(def));
      },
      slot);
}

void read(StrictSection& section, std::string_view name, SettingSlot slot, const Range& range,
          const std::vector<std::string>& choices) {
  std::visit(
      [&](auto p) {
        using P = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<P, double>) {
          *p = section.get_double(name, *p, range);
        } else if constexpr (std::is_same_v<P, bool>) {
          *p = section.get_bool(name, *p);
        } else if constexpr (std::is_same_v<P, std::string>) {
          *p = choices.empty() ? section.get_string(name, *p) : section.get_choice(name, *p, choices);
        } else {
          const auto [lo, hi] = integer_bounds<P>(range);
          *p = static_cast<P>(section.get_int(name, static_cast<std::int64_t>(*p), lo, hi));
        }
      },
      slot);
}

std::string value(SettingSlot slot, bool is_choice) {
  return std::visit(
      [&](auto p) -> std::string {
        using P = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<P, double>)
          return shortest_text(*p);
        else if constexpr (std::is_same_v<P, bool>)
          return *p ? "true" : "false";
        else if constexpr (std::is_same_v<P, std::string>)
          return is_choice ? *p : quoted(*p);
        else
          return fmt::format("{}", *p);
      },
      slot);
}

std::string type(SettingSlot slot, const Range& range, const std::vector<std::string>& choices) {
  return std::visit(
      [&](auto p) -> std::string {
        using P = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<P, double>) {
          const std::string r = range.describe();
          return r == "any value" ? "number" : "number " + r;
        } else if constexpr (std::is_same_v<P, bool>) {
          return "bool";
        } else if constexpr (std::is_same_v<P, std::string>) {
          std::string t;
          for (const std::string& c : choices)
            if (!c.empty()) t += (t.empty() ? "`" : " \\| `") + c + "`";
          return t.empty() ? "string" : t;
        } else {
          const auto [lo, hi] = integer_bounds<P>(range);
          return hi == std::numeric_limits<std::int64_t>::max() ? fmt::format("integer >= {}", lo)
                                                                : fmt::format("integer {}..{}", lo, hi);
        }
      },
      slot);
}

std::string default_value(SettingSlot slot, bool is_choice, std::string_view text) {
  if (!text.empty()) return std::string(text);
  const std::string v = value(slot, is_choice);
  return v.size() > 2 && v.front() == '"' ? v.substr(1, v.size() - 2) : v;  // "" stays ""
}

std::string help_line(std::string_view name, const std::string& default_text, const std::string& doc) {
  constexpr std::size_t kColumn = 31, kWidth = 92;
  std::string key = fmt::format("  {}: {}", name, default_text);
  std::erase(key, '`');
  return fmt::format("{:<{}}{}\n", key, key.size() < kColumn - 1 ? kColumn : key.size() + 2,
                     wrapped(doc, kColumn, kWidth));
}

}  // namespace zero::setting_text
