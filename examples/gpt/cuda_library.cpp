#include "gpt/cuda_library.hpp"

#include <fmt/format.h>

#include <mutex>
#include <string>

#include "zero/error.hpp"
#include "zero/util/library.hpp"

namespace zero::gpt {

const GptCudaLibrary& gpt_cuda_library() {
  static const GptCudaLibrary* library = nullptr;
  static std::string error;
  static std::once_flag once;
  std::call_once(once, [] {
    const LibrarySymbol entry = find_library_symbol(ZERO_GPT_CUDA_FILE, "zero_gpt_cuda_library");
    if (entry.address == nullptr) {
      error = entry.error +
              ". It needs the CUDA runtime and cuBLASLt this build was made with: install them or add their "
              "folder to LD_LIBRARY_PATH";
      return;
    }
    library = reinterpret_cast<const GptCudaLibrary* (*)()>(entry.address)();
    if (library == nullptr || library->abi != kGptCudaAbi) {
      error = fmt::format("{} is from another build of zero-gpt (interface version {}, this build's is {}): build or "
                          "install it together with this zero-gpt",
                          ZERO_GPT_CUDA_FILE, library ? fmt::format("{}", library->abi) : "unknown", kGptCudaAbi);
      library = nullptr;
    }
  });
  ZERO_CHECK(library != nullptr,
             "zero-gpt: backend: cuda, but the GPT model's CUDA library " + error + ", or set backend: host");
  return *library;
}

}  // namespace zero::gpt
