# cmake -P script (ctest interface_id): cmake/ZeroInterfaceId.cmake's id follows the headers it
# hashes. The same files give the same id and leave the header untouched (nothing recompiles);
# a changed file, or another file, gives another id.
#   -DSCRIPT=<cmake/ZeroInterfaceId.cmake> -DWORK=<scratch folder>
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
file(WRITE ${WORK}/a.hpp "struct Table { int (*entry)(); };\n")
file(WRITE ${WORK}/b.hpp "struct Ops { virtual void f() = 0; };\n")

# Runs the script over `files`; sets `id` to the id it wrote.
function(generate files)
  file(WRITE ${WORK}/list "salt;${files}")
  execute_process(COMMAND ${CMAKE_COMMAND} -DOUT=${WORK}/id.hpp -DMACRO=TEST_ID -DROOT=${WORK} -DLIST=${WORK}/list
                          -P ${SCRIPT}
                  RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "the script failed (${rc}): ${err}")
  endif()
  file(READ ${WORK}/id.hpp text)
  if(NOT text MATCHES "#define TEST_ID \"([0-9a-f]+)\"")
    message(FATAL_ERROR "no id in the generated header:\n${text}")
  endif()
  string(LENGTH "${CMAKE_MATCH_1}" n)
  if(NOT n EQUAL 16)
    message(FATAL_ERROR "the id ${CMAKE_MATCH_1} is not 16 hex digits")
  endif()
  set(id ${CMAKE_MATCH_1} PARENT_SCOPE)
endfunction()

generate("${WORK}/a.hpp;${WORK}/b.hpp")
set(first ${id})
file(TIMESTAMP ${WORK}/id.hpp stamp "%s")
execute_process(COMMAND ${CMAKE_COMMAND} -E sleep 1.1)
generate("${WORK}/b.hpp;${WORK}/a.hpp")  # the order given does not matter
file(TIMESTAMP ${WORK}/id.hpp stamp_again "%s")
if(NOT id STREQUAL first OR NOT stamp STREQUAL stamp_again)
  message(FATAL_ERROR "the same files gave ${id} after ${first}, or rewrote the header (${stamp} -> ${stamp_again})")
endif()
file(WRITE ${WORK}/b.hpp "struct Ops { virtual void f() = 0; virtual void g() = 0; };\n")
generate("${WORK}/a.hpp;${WORK}/b.hpp")
if(id STREQUAL first)
  message(FATAL_ERROR "a changed header left the id at ${id}")
endif()
set(changed ${id})
generate("${WORK}/a.hpp")
if(id STREQUAL changed)
  message(FATAL_ERROR "one header fewer left the id at ${id}")
endif()
message(STATUS "interface ids: ${first}, ${changed} after a change, ${id} over one header")
