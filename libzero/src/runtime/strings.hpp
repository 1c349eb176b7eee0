// Small string helpers shared by messages: "did you mean ...?", shapes, and bytes from files.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "zero/strings.hpp"  // closest_match

namespace zero {

// Levenshtein distance between two strings.
std::size_t edit_distance(std::string_view a, std::string_view b);
// ASCII lower case (key and choice names compare case-insensitively where DeepSpeed does).
std::string lower_ascii(std::string_view text);
// Shortest text that reads back as the same double ("0.001", "5e-05"), so emitted settings
// round-trip exactly.
std::string shortest_text(double v);

// "[768, 3072]".
std::string shape_text(const std::vector<std::int64_t>& shape);

// Text read from a file or a config value, safe to put in a message: printable ASCII as is, backslash as \\, and
// any other byte as \n, \t, \r or \xNN, so a damaged file cannot garble a terminal or a log.
std::string escape_bytes(std::string_view bytes);

}  // namespace zero
