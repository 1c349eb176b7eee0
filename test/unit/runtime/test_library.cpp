// Libraries loaded when a job needs them (zero/util/library.hpp): what a failure says, and that a
// library is found beside libzero.
#include <catch2/catch.hpp>

#include <string>

#include "zero/util/library.hpp"

using Catch::Matchers::Contains;

TEST_CASE("a library that is not there is named with the loader's reason", "[library]") {
  const zero::LibrarySymbol s = zero::find_library_symbol("libzero_no_such_library.so.0", "entry");
  CHECK(s.address == nullptr);
  CHECK_THAT(s.error, Contains("libzero_no_such_library.so.0 could not be loaded") &&
                          Contains("cannot open shared object file"));
}

TEST_CASE("libzero itself is found beside libzero, and a missing symbol is named", "[library]") {
  // libzero's own file is in libzero's folder: the path in the message is that folder's.
  const zero::LibrarySymbol s = zero::find_library_symbol("libzero.so.0", "zero_no_such_entry");
  CHECK(s.address == nullptr);
  CHECK_THAT(s.error, Contains("/libzero.so.0 has no zero_no_such_entry"));
}

TEST_CASE("a library not beside libzero is found by the loader's search", "[library]") {
  const zero::LibrarySymbol a = zero::find_library_symbol("libm.so.6", "cos");
  REQUIRE(a.error.empty());
  REQUIRE(a.address != nullptr);
  CHECK(reinterpret_cast<double (*)(double)>(a.address)(0.0) == 1.0);
  CHECK(zero::find_library_symbol("libm.so.6", "cos").address == a.address);  // the same library
}
