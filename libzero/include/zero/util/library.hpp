// Libraries loaded only when a job needs them (libzero_cuda; the GPT example's CUDA operations), so
// what they link (CUDA runtime, NCCL, cuBLASLt) is needed only by the jobs that use them: a program
// that cannot load one still runs on the host, and a job that needs it gets one error saying why.
#pragma once

#include <string>

namespace zero {

struct LibrarySymbol {
  void* address = nullptr;   // null when it could not be had
  std::string error;         // then why: "<path> could not be loaded: <the loader's reason>"
  bool other_build = false;  // find_library_entry: the library is from another build
};

// The address of `symbol` in the library `file` (a file name such as "libzero_cuda.so.0"),
// looked for in libzero's own folder (where the build and the install put them) and then by
// the dynamic loader's search (LD_LIBRARY_PATH, the ld.so cache). A library stays loaded until
// the process ends; asking again returns the same address.
LibrarySymbol find_library_symbol(const std::string& file, const std::string& symbol);

// find_library_symbol for a library built together with the caller: first the library's
// interface id, from `id_symbol` (a C function returning it as a C string), must equal `id`, the
// one the caller was compiled with (cmake/ZeroInterfaceId.cmake generates both). Nothing else of
// a library from another build is called. Otherwise the error names both ids ("<path> is from
// another build: its interface id is 1f0e..., this build's is 9a2c...") and other_build is set.
LibrarySymbol find_library_entry(const std::string& file, const std::string& symbol, const std::string& id_symbol,
                                 const std::string& id);

}  // namespace zero
