# ctest entry `compile_fail`: kiln's compile-time errors say what is wrong.
# Takes -DKILN_CXX_COMPILER, -DKILN_INCLUDE_DIR, -DKILN_CASES (cases.cpp). Compiles the
# cases with -fsyntax-only: the build must fail and print every `// expect:` message of
# cases.cpp; the control build (-DKILN_COMPILE_FAIL_CONTROL, the valid twins) must succeed.
cmake_minimum_required(VERSION 3.20)

set(cmd "${KILN_CXX_COMPILER}" -std=c++20 -fsyntax-only "-I${KILN_INCLUDE_DIR}" "${KILN_CASES}")

execute_process(COMMAND ${cmd} -DKILN_COMPILE_FAIL_CONTROL RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "compile_fail: the control build (valid code) failed:\n${out}")
endif()

execute_process(COMMAND ${cmd} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(rc EQUAL 0)
  message(FATAL_ERROR "compile_fail: the cases compiled; each should have been refused")
endif()
file(STRINGS "${KILN_CASES}" expects REGEX "^// expect: ")
set(missing "")
foreach(line IN LISTS expects)
  string(REGEX REPLACE "^// expect: " "" text "${line}")
  string(FIND "${out}" "${text}" at)
  if(at EQUAL -1)
    string(APPEND missing "  ${text}\n")
  else()
    message(STATUS "compile_fail: refused with \"${text}\"")
  endif()
endforeach()
list(LENGTH expects n)
if(n EQUAL 0)
  message(FATAL_ERROR "compile_fail: no `// expect:` lines in ${KILN_CASES}")
endif()
if(NOT missing STREQUAL "")
  message(FATAL_ERROR "compile_fail: these messages did not appear:\n${missing}compiler output:\n${out}")
endif()
