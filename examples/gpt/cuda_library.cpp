#include "gpt/cuda_library.hpp"

#include <mutex>
#include <string>

#include "gpt/cuda_library_id.hpp"  // generated: ZERO_GPT_CUDA_ID
#include "zero/error.hpp"
#include "zero/util/library.hpp"

namespace zero::gpt {

const GptCudaLibrary& gpt_cuda_library() {
  static const GptCudaLibrary* library = nullptr;
  static std::string error;
  static std::once_flag once;
  std::call_once(once, [] {
    const LibrarySymbol entry =
        find_library_entry(ZERO_GPT_CUDA_FILE, "zero_gpt_cuda_library", "zero_gpt_cuda_library_id", ZERO_GPT_CUDA_ID);
    if (entry.other_build) {
      error =
          entry.error + "; build it with this zero-gpt (building zero-gpt builds both) and install the two together";
      return;
    }
    if (entry.address == nullptr) {
      error = entry.error +
              ". It needs the CUDA runtime and cuBLASLt this build was made with: install them or add their "
              "folder to LD_LIBRARY_PATH";
      return;
    }
    library = reinterpret_cast<const GptCudaLibrary* (*)()>(entry.address)();
    if (library == nullptr) error = std::string(ZERO_GPT_CUDA_FILE) + " gave no table";
  });
  ZERO_CHECK(library != nullptr,
             "zero-gpt: backend: cuda, but the GPT model's CUDA library " + error + ", or set backend: host");
  return *library;
}

}  // namespace zero::gpt
