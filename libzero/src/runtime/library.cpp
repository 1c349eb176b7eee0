#include "zero/util/library.hpp"

#include <dlfcn.h>
#include <fmt/format.h>

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

// The library `file`, opened (or why not).
struct Opened {
  void* handle = nullptr;
  std::string path, error;
};
Opened open_library(const std::string& file) {
  Opened lib;
  lib.path = library_path(file);
  lib.handle = dlopen(lib.path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib.handle == nullptr) lib.error = lib.path + " could not be loaded: " + loader_error();
  return lib;
}

}  // namespace

LibrarySymbol find_library_symbol(const std::string& file, const std::string& symbol) {
  const Opened lib = open_library(file);
  if (lib.handle == nullptr) return {nullptr, lib.error};
  void* address = dlsym(lib.handle, symbol.c_str());
  if (address == nullptr) return {nullptr, lib.path + " has no " + symbol + " (" + loader_error() + ")"};
  return {address, {}};
}

LibrarySymbol find_library_entry(const std::string& file, const std::string& symbol, const std::string& id_symbol,
                                 const std::string& id) {
  const Opened lib = open_library(file);
  if (lib.handle == nullptr) return {nullptr, lib.error};
  const auto get_id = reinterpret_cast<const char* (*)()>(dlsym(lib.handle, id_symbol.c_str()));
  const char* theirs = get_id ? get_id() : nullptr;
  if (theirs == nullptr || id != theirs) {
    const std::string what =
        theirs ? fmt::format("its interface id is {}", theirs) : fmt::format("it has no interface id ({})", id_symbol);
    return {nullptr, fmt::format("{} is from another build: {}, this build's is {}", lib.path, what, id), true};
  }
  return find_library_symbol(file, symbol);
}

}  // namespace zero
