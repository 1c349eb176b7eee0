// Where the unit tests' data files are: ctest sets ZERO_TEST_DATA; run by hand, the data folder
// sits next to this header.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

namespace zero::test {

inline std::string data_path(const std::string& name) {
  if (const char* dir = std::getenv("ZERO_TEST_DATA")) return (std::filesystem::path(dir) / name).string();
  return (std::filesystem::path(__FILE__).parent_path() / "data" / name).string();
}

}  // namespace zero::test
