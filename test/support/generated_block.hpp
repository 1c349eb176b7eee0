// A generated block inside a hand-written Markdown page (a key reference between two HTML comment
// markers) checked against what the code generates now; with ZERO_UPDATE_CONFIG_DOC set, the
// block is rewritten instead, for review in the diff.
#pragma once

#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace zero::test {

inline void check_generated_block(const std::filesystem::path& page, const std::string& begin_marker,
                                  const std::string& end_marker, const std::string& generated) {
  std::string doc;
  {
    std::ifstream in(page, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    doc = s.str();
  }
  INFO(page.string());
  REQUIRE_FALSE(doc.empty());
  const auto begin = doc.find(begin_marker);
  const auto end = doc.find(end_marker);
  REQUIRE(begin != std::string::npos);
  REQUIRE(end != std::string::npos);
  REQUIRE(begin < end);
  const std::size_t at = begin + begin_marker.size();
  const std::string in_doc = doc.substr(at, end - at);
  if (in_doc != generated && std::getenv("ZERO_UPDATE_CONFIG_DOC")) {
    doc.replace(at, end - at, generated);
    std::ofstream(page, std::ios::binary) << doc;
    SUCCEED(page.string() + " rewritten");
    return;
  }
  INFO("the block differs from what the code generates; rerun this test with ZERO_UPDATE_CONFIG_DOC=1 to rewrite it");
  CHECK(in_doc == generated);
}

}  // namespace zero::test
