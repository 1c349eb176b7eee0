// Small string helpers shared by error messages ("did you mean ...?").
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace zero {

// Levenshtein distance between two strings.
std::size_t edit_distance(std::string_view a, std::string_view b);
// The candidate closest to `word`, or "" when none is close enough to be a plausible typo.
std::string closest_match(std::string_view word, const std::vector<std::string>& candidates);
// ASCII lower case (key and choice names compare case-insensitively where DeepSpeed does).
std::string lower_ascii(std::string_view text);
// Shortest text that reads back as the same double ("0.001", "5e-05"), so emitted settings
// round-trip exactly.
std::string shortest_text(double v);
// `text` with control bytes written as \n, \t or \xNN, for messages that echo file content (a
// value holding a terminal escape or a NUL must not reach the terminal as is).
std::string printable(std::string_view text);

}  // namespace zero
