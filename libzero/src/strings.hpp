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

}  // namespace zero
