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

TEST_CASE("a library built with this build's interface id gives its entry; another build's is named", "[library]") {
  // ZERO_TEST_LIBRARY: the absolute path of library_fixture.cpp's library, id 00112233445566ff.
  const char* entry = "zero_test_library_entry";
  const char* id = "zero_test_library_id";
  const zero::LibrarySymbol ok = zero::find_library_entry(ZERO_TEST_LIBRARY, entry, id, "00112233445566ff");
  REQUIRE(ok.error.empty());
  CHECK_FALSE(ok.other_build);
  CHECK(reinterpret_cast<int (*)()>(ok.address)() == 42);

  // Another build: both ids in the message, the entry not looked up.
  const zero::LibrarySymbol other = zero::find_library_entry(ZERO_TEST_LIBRARY, entry, id, "9a2c4e6f80b1d3f5");
  CHECK(other.address == nullptr);
  CHECK(other.other_build);
  CHECK(other.error == std::string(ZERO_TEST_LIBRARY) +
                           " is from another build: its interface id is 00112233445566ff, this build's is "
                           "9a2c4e6f80b1d3f5");

  // A library from before interface ids (no id function): the same, with what it lacks.
  const zero::LibrarySymbol none = zero::find_library_entry("libm.so.6", "cos", id, "9a2c4e6f80b1d3f5");
  CHECK(none.address == nullptr);
  CHECK(none.other_build);
  CHECK_THAT(none.error, Contains("libm.so.6 is from another build: it has no interface id (zero_test_library_id), "
                                  "this build's is 9a2c4e6f80b1d3f5"));

  // A library that cannot be loaded is not "another build".
  const zero::LibrarySymbol missing =
      zero::find_library_entry("libzero_no_such_library.so.0", "entry", id, "9a2c4e6f80b1d3f5");
  CHECK_FALSE(missing.other_build);
  CHECK_THAT(missing.error, Contains("could not be loaded"));
}
