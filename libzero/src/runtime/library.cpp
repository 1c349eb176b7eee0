#include "zero/util/library.hpp"

#include <dlfcn.h>

#include <filesystem>

namespace zero {

namespace {

// `file` beside this libzero if it is there, else the bare name for the loader's search.
std::string library_path(const std::string& file) {
  Dl_info self{};
  if (dladdr(reinterpret_cast<const void*>(&find_library_symbol), &self) != 0 && self.dli_fname != nullptr) {
    const auto beside = std::filesystem::path(self.dli_fname).parent_path() / file;
    std::error_code ec;
    if (std::filesystem::exists(beside, ec)) return beside.string();
  }
  return file;
}

std::string loader_error() {
  const char* why = dlerror();
  return why ? why : "no reason given";
}

}  // namespace

LibrarySymbol find_library_symbol(const std::string& file, const std::string& symbol) {
  const std::string path = library_path(file);
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) return {nullptr, path + " could not be loaded: " + loader_error()};
  void* address = dlsym(handle, symbol.c_str());
  if (address == nullptr) return {nullptr, path + " has no " + symbol + " (" + loader_error() + ")"};
  return {address, {}};
}

}  // namespace zero
