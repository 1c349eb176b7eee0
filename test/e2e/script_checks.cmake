# Helpers for the cmake -P test scripts: run a program, check what it printed.
#
# zero_run(<what> [FAILS] COMMAND <command...>): the command must succeed (with FAILS: must fail);
# it runs in WORK where the script sets it, and its stdout and stderr are left in last_out.
function(zero_run what)
  cmake_parse_arguments(A "FAILS" "" "COMMAND" ${ARGN})
  set(dir "${WORK}")
  if(NOT dir)
    set(dir "${CMAKE_CURRENT_BINARY_DIR}")
  endif()
  execute_process(COMMAND ${A_COMMAND} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                  WORKING_DIRECTORY ${dir})
  if(A_FAILS AND rc EQUAL 0)
    message(FATAL_ERROR "${what} should have failed: ${A_COMMAND}\n${out}\n${err}")
  elseif(NOT A_FAILS AND NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}): ${A_COMMAND}\n${out}\n${err}")
  endif()
  set(last_out "${out}${err}" PARENT_SCOPE)
endfunction()

# zero_expect(<text>): last_out contains text.
function(zero_expect text)
  string(FIND "${last_out}" "${text}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "expected '${text}' in:\n${last_out}")
  endif()
endfunction()
