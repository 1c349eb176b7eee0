// "Did you mean ...?": the nearest of the names a program knows to one a user typed (a config key,
// choice, unit or preset; the GPT example's presets use the same rule), and bytes from an
// untrusted file made safe to print.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace zero {

// The candidate closest to `word` by edit distance, or "" when none is close enough to be a
// plausible typo (more than about a third of the word changed).
std::string closest_match(std::string_view word, const std::vector<std::string>& candidates);

// The same, as the suffix messages append: " (did you mean 'gpt2'?)", or "" when nothing is close.
std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates);

// Text read from a file or a config value, safe to put in a message: printable ASCII as is, backslash as \\, and
// any other byte as \n, \t, \r or \xNN, so a damaged file cannot garble a terminal or a log.
std::string escape_bytes(std::string_view bytes);

}  // namespace zero
