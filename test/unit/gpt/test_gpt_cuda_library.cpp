// The GPT model's CUDA operations load from their own library (cuda_library.hpp): found beside
// libzero, its table is this build's. Runs wherever the CUDA runtime is (with or without a GPU).
#include <catch2/catch.hpp>

#include <string>

#include "gpt/cuda_library.hpp"

TEST_CASE("libzero_gpt_cuda loads and gives this build's table", "[gpt][cuda]") {
  // It loads only when its interface id is this build's (gpt_cuda_library throws otherwise).
  const zero::gpt::GptCudaLibrary& lib = zero::gpt::gpt_cuda_library();
  REQUIRE(lib.make_ops != nullptr);
  REQUIRE(lib.current_device != nullptr);
  CHECK(&zero::gpt::gpt_cuda_library() == &lib);  // loaded once
  std::string name;
  double bytes = 0;
  if (lib.current_device(&name, &bytes)) {  // a GPU is present
    CHECK_FALSE(name.empty());
    CHECK(bytes > 0);
  } else {
    CHECK(name.empty());
  }
}
