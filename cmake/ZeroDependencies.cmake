# Finds every third-party dependency. Each is a Debian package; a missing one stops
# configure with the package to install (cmake/install-deps.sh installs them all).

function(zero_require found what package)
  if(NOT ${found})
    message(FATAL_ERROR "libzero needs ${what}, which was not found.\n"
                        "Install it with: sudo apt-get install ${package}\n"
                        "(or run cmake/install-deps.sh to install every dependency)")
  endif()
endfunction()

find_package(Threads REQUIRED)

find_package(MPI COMPONENTS C QUIET)
zero_require(MPI_C_FOUND "MPI (OpenMPI)" "libopenmpi-dev openmpi-bin")

find_package(yaml-cpp CONFIG QUIET)
zero_require(yaml-cpp_FOUND "yaml-cpp" "libyaml-cpp-dev")

find_package(PkgConfig QUIET)
zero_require(PKG_CONFIG_FOUND "pkg-config" "pkg-config")
pkg_check_modules(URING QUIET IMPORTED_TARGET liburing)
zero_require(URING_FOUND "liburing" "liburing-dev")
# XXH3-64 checksums in checkpoint and swap files (verifiable with `xxhsum -H3`).
pkg_check_modules(XXHASH QUIET IMPORTED_TARGET libxxhash)
zero_require(XXHASH_FOUND "xxHash" "libxxhash-dev")

# Private to the library (none appears in an installed header): consumers need neither.
find_package(nlohmann_json 3.10 CONFIG QUIET)
zero_require(nlohmann_json_FOUND "nlohmann-json (3.10 or newer; also zero-plan's JSON output)" "nlohmann-json3-dev")
find_package(fmt CONFIG QUIET)
zero_require(fmt_FOUND "fmt" "libfmt-dev")

find_package(OpenMP COMPONENTS CXX QUIET)
zero_require(OpenMP_CXX_FOUND "OpenMP (libgomp)" "libgomp1 (part of build-essential)")

# OpenBLAS: the GPT trainer's host kernels, and libzero's PowerSGD products (private to the library).
set(BLA_VENDOR OpenBLAS)
find_package(BLAS QUIET)
zero_require(BLAS_FOUND "OpenBLAS" "libopenblas-dev")
find_path(ZERO_CBLAS_INCLUDE cblas.h PATH_SUFFIXES openblas openblas-pthread
          HINTS /usr/include/x86_64-linux-gnu /usr/include/aarch64-linux-gnu)
zero_require(ZERO_CBLAS_INCLUDE "cblas.h from OpenBLAS" "libopenblas-dev")
if(NOT TARGET zero_blas)
  add_library(zero_blas INTERFACE)
  target_link_libraries(zero_blas INTERFACE ${BLAS_LIBRARIES})
  target_include_directories(zero_blas INTERFACE ${ZERO_CBLAS_INCLUDE})
endif()

if(ZERO_BUILD_EXAMPLES OR ZERO_BUILD_BENCH OR ZERO_BUILD_TESTS)
  find_package(CLI11 CONFIG QUIET)
  zero_require(CLI11_FOUND "CLI11" "libcli11-dev")
endif()

if(ZERO_BUILD_TESTS)
  find_package(Catch2 2 CONFIG QUIET)
  zero_require(Catch2_FOUND "Catch2 (version 2)" "catch2")
  find_package(Python3 COMPONENTS Interpreter QUIET)
  zero_require(Python3_FOUND "python3 (for the checkpoint export reader test)" "python3")
endif()

if(ZERO_BUILD_EXAMPLES)
  # zero-plot draws with Debian's matplotlib, which belongs to the system Python: a python3
  # found first on PATH (pyenv, a venv) may not see it. The installed script names the
  # interpreter that has it.
  find_package(Python3 COMPONENTS Interpreter QUIET)
  foreach(py IN ITEMS ${Python3_EXECUTABLE} /usr/bin/python3)
    execute_process(COMMAND ${py} -c "import matplotlib" RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
    if(rc EQUAL 0)
      set(ZERO_PLOT_PYTHON ${py})
      break()
    endif()
  endforeach()
  zero_require(ZERO_PLOT_PYTHON "Python 3 with matplotlib (zero-plot)" "python3-matplotlib")
endif()
