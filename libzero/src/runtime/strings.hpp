// Small string helpers shared by messages: "did you mean ...?", shapes, and bytes from files.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "zero/util/strings.hpp"  // closest_match, escape_bytes

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
// "rank 2" or "ranks 0, 1, 3", for messages about some ranks of a job.
std::string rank_list(const std::vector<int>& ranks);

}  // namespace zero
