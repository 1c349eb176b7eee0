// Libraries loaded only when a job needs them: the CUDA backend (libzero_cuda) and, in the GPT
// example, the model's CUDA operations. What such a library links (the CUDA runtime, NCCL,
// cuBLASLt) is then needed only by the jobs that use it: a program that cannot load it still
// starts and runs on the host, and a job that needs it gets one error saying why it failed.
#pragma once

#include <string>

namespace zero {

struct LibrarySymbol {
  void* address = nullptr;  // null when it could not be had
  std::string error;        // then why: "<path> could not be loaded: <the loader's reason>"
};

// The address of `symbol` in the library `file` (a file name such as "libzero_cuda.so.0"),
// looked for in libzero's own folder (where the build and the install put them) and then by
// the dynamic loader's search (LD_LIBRARY_PATH, the ld.so cache). A library stays loaded until
// the process ends; asking again returns the same address.
LibrarySymbol find_library_symbol(const std::string& file, const std::string& symbol);

}  // namespace zero
