#include "runtime/strings.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <charconv>

namespace zero {

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t sub = prev[j - 1] + (std::tolower(a[i - 1]) == std::tolower(b[j - 1]) ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string closest_match(std::string_view word, const std::vector<std::string>& candidates) {
  std::string best;
  std::size_t best_d = static_cast<std::size_t>(-1);
  for (const auto& c : candidates) {
    std::size_t d = edit_distance(word, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  // A typo changes a few characters; beyond about a third of the word it is another word.
  std::size_t limit = std::max<std::size_t>(2, std::max(word.size(), best.size()) / 3);
  return best_d <= limit ? best : std::string();
}

std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates) {
  const std::string best = closest_match(word, candidates);
  return best.empty() ? std::string() : " (did you mean '" + best + "'?)";
}

std::string lower_ascii(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string shortest_text(double v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

std::string shape_text(const std::vector<std::int64_t>& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

std::string escape_bytes(std::string_view bytes) {
  std::string out;
  for (unsigned char c : bytes) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else if (c == '\t')
      out += "\\t";
    else if (c == '\r')
      out += "\\r";
    else if (c >= 0x20 && c < 0x7f)
      out += static_cast<char>(c);
    else
      fmt::format_to(std::back_inserter(out), "\\x{:02x}", c);
  }
  return out;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) s += fmt::format("{}{}", i ? ", " : "", ranks[i]);
  return s;
}

}  // namespace zero
