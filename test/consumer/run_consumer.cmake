# cmake -P script: install, build the consumer against the installed tree, run it.
#   -DBUILD_WITH=cmake:      configure it as a CMake project (find_package(zero), zero::zero).
#   -DBUILD_WITH=pkg-config: one compiler command, `CXX main.cpp $(pkg-config --cflags --libs zero)`
#                            through PKG_CONFIG_PATH, then run it on 1 and 2 ranks without
#                            LD_LIBRARY_PATH (the RPATH from zero.pc must find libzero).
include(${CMAKE_CURRENT_LIST_DIR}/../e2e/script_checks.cmake)

# The consumer's line: three steps on w^2/2 from w = 1 with the default optimizer (AdamW, lr 1e-3,
# weight decay 0.01). Adam moves w by lr per step while the gradient keeps its sign, the decay by
# lr * 0.01 * w more: w = 1 - 3e-3 * 1.01 = 0.99697 (to the five digits printed).
function(expect_trained ranks)
  string(REGEX MATCHALL "consumer: w after 3 steps = 0\\.99697[^\n]*" lines "${last_out}")
  list(LENGTH lines n)
  if(NOT n EQUAL ranks)
    message(FATAL_ERROR "expected ${ranks} lines 'consumer: w after 3 steps = 0.99697', got:\n${last_out}")
  endif()
endfunction()

file(REMOVE_RECURSE ${PREFIX} ${WORK})
file(MAKE_DIRECTORY ${WORK})
zero_run("install" COMMAND ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${PREFIX})
if(BUILD_WITH STREQUAL "cmake")
  # A sanitized libzero needs the sanitizer runtime linked into the program that loads it.
  set(extra "")
  if(SANITIZE)
    set(extra "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=${SANITIZE}")
  endif()
  zero_run("configure" COMMAND ${CMAKE_COMMAND} -S ${SOURCE} -B ${WORK} -G ${GENERATOR}
           -DCMAKE_PREFIX_PATH=${PREFIX} ${extra})
  zero_run("build" COMMAND ${CMAKE_COMMAND} --build ${WORK})
  zero_run("consumer" COMMAND ${WORK}/consumer)
  expect_trained(1)
elseif(BUILD_WITH STREQUAL "pkg-config")
  set(ENV{PKG_CONFIG_PATH} ${PREFIX}/${LIBDIR}/pkgconfig)
  zero_run("pkg-config" COMMAND ${PKG_CONFIG} --modversion zero)
  if(NOT last_out STREQUAL "${VERSION}\n")
    message(FATAL_ERROR "pkg-config --modversion zero: expected ${VERSION}, got ${last_out}")
  endif()
  zero_run("pkg-config" COMMAND ${PKG_CONFIG} --cflags --libs zero)
  separate_arguments(flags UNIX_COMMAND "${last_out}")
  if(SANITIZE)
    list(APPEND flags -fsanitize=${SANITIZE})
  endif()
  zero_run("compile" COMMAND ${CXX} ${SOURCE}/main.cpp -o ${WORK}/consumer ${flags})
  # Nothing but the program's own RPATH may lead to libzero.
  set(ENV{LD_LIBRARY_PATH} "")
  zero_run("consumer" COMMAND ${WORK}/consumer)
  expect_trained(1)
  string(REPLACE "|" ";" MPIEXEC_FLAGS "${MPIEXEC_FLAGS}")
  zero_run("consumer on 2 ranks" COMMAND ${MPIEXEC} ${MPIEXEC_FLAGS} -n 2 ${WORK}/consumer)
  expect_trained(2)
else()
  message(FATAL_ERROR "BUILD_WITH must be cmake or pkg-config (got '${BUILD_WITH}')")
endif()
