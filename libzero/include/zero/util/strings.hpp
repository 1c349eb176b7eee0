// "Did you mean ...?": the nearest of the names a program knows to one a user typed; and bytes
// from an untrusted file made safe to print.
//
// libzero answers an unknown config key, choice, unit or preset with the closest known name when
// it is near enough to be a typo; programs built on it (the GPT example's presets) give the same
// answer with the same rule.
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
