# cmake -P script: the README's first command builds only what its run needs. The demo preset,
# configured into a scratch folder, must plan libzero and zero-gpt and nothing else (no CUDA
# code, no tests, no benchmarks), and the README's command 1 must use it.
#   -DSOURCE=<source tree> -DWORK=<scratch build folder>
include(${CMAKE_CURRENT_LIST_DIR}/script_checks.cmake)

# The command as the README gives it.
file(READ ${SOURCE}/README.md readme)
string(FIND "${readme}" "cmake --preset demo && cmake --build --preset demo && mpirun" at)
if(at EQUAL -1)
  message(FATAL_ERROR "README.md's command 1 does not build with the demo preset")
endif()

# The build preset's targets.
file(READ ${SOURCE}/CMakePresets.json presets)
string(JSON n LENGTH "${presets}" buildPresets)
math(EXPR last "${n} - 1")
set(targets "")
foreach(i RANGE ${last})
  string(JSON name GET "${presets}" buildPresets ${i} name)
  if(name STREQUAL "demo")
    string(JSON targets GET "${presets}" buildPresets ${i} targets)
  endif()
endforeach()
if(NOT targets MATCHES "^\\[ *\"zero-gpt\" *\\]$")
  message(FATAL_ERROR "the demo build preset should build zero-gpt alone, not: ${targets}")
endif()

# What building zero-gpt with the configure preset would run (ninja's dry run).
file(REMOVE_RECURSE ${WORK})
set(SCRATCH ${WORK})
set(WORK ${SOURCE})  # presets are read from the source tree
zero_run("configure the demo preset" COMMAND ${CMAKE_COMMAND} --preset demo -B ${SCRATCH})
zero_expect("CUDA backend OFF, tests OFF")
zero_run("dry-run build" COMMAND ${CMAKE_COMMAND} --build ${SCRATCH} --target zero-gpt -- -n)
zero_expect("Linking CXX executable examples/gpt/zero-gpt")
foreach(unwanted "CUDA object" "test/" "bench/" "zero_cuda" "tools/")
  string(FIND "${last_out}" "${unwanted}" at)
  if(NOT at EQUAL -1)
    message(FATAL_ERROR "the demo build would build '${unwanted}':\n${last_out}")
  endif()
endforeach()
string(REGEX MATCHALL "Building CXX object" compiles "${last_out}")
list(LENGTH compiles n)
message(STATUS "the demo build compiles ${n} files")
file(REMOVE_RECURSE ${SCRATCH})
