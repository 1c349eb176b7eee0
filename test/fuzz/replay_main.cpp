// The fuzz targets without libFuzzer: runs LLVMFuzzerTestOneInput once per file named on the
// command line (directories are walked), so CI replays the seed corpus with the normal compiler.
// A crash, an unexpected exception or a sanitizer report fails the run, naming the input.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {
int run_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "replay: cannot read '%s'\n", p.c_str());
    return 1;
  }
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::fprintf(stderr, "replay: %s (%zu bytes)\n", p.c_str(), bytes.size());
  LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  int failed = 0, ran = 0;
  for (int i = 1; i < argc; ++i) {
    std::vector<fs::path> files;
    if (fs::is_directory(argv[i])) {
      for (const auto& e : fs::recursive_directory_iterator(argv[i]))
        if (e.is_regular_file()) files.push_back(e.path());
    } else {
      files.emplace_back(argv[i]);
    }
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      failed += run_file(f);
      ++ran;
    }
  }
  if (ran == 0) {
    std::fprintf(stderr, "replay: no inputs (pass corpus files or directories)\n");
    return 1;
  }
  if (failed) {
    std::fprintf(stderr, "replay: %d of %d inputs could not be read\n", failed, ran);
    return 1;
  }
  std::fprintf(stderr, "replay: %d inputs, all ended normally\n", ran);
  return 0;
}
