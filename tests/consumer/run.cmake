# ctest entry `consumer`: proves find_package(kiln) works from an install tree.
# Takes -DKILN_BINARY_DIR, -DKILN_CONSUMER_SOURCE_DIR, -DKILN_CONFIG, -DKILN_CXX_COMPILER,
# -DKILN_GENERATOR; installs kiln into <build>/install (fresh each run, so a header
# removed from include/ cannot survive there), builds this folder against it (header-only,
# and with kiln::engine), runs both programs.
cmake_minimum_required(VERSION 3.20)

set(prefix "${KILN_BINARY_DIR}/install")
set(build "${KILN_BINARY_DIR}/consumer")
set(config "${KILN_CONFIG}")
if(config STREQUAL "")
  set(config Release)
endif()

function(step what)
  message(STATUS "consumer: ${what}")
  execute_process(COMMAND ${ARGN} COMMAND_ERROR_IS_FATAL ANY)
endfunction()

file(REMOVE_RECURSE "${prefix}" "${build}")
step("install kiln into ${prefix}"
  "${CMAKE_COMMAND}" --install "${KILN_BINARY_DIR}" --prefix "${prefix}" --config "${config}")
step("configure ${KILN_CONSUMER_SOURCE_DIR}"
  "${CMAKE_COMMAND}" -S "${KILN_CONSUMER_SOURCE_DIR}" -B "${build}"
  -G "${KILN_GENERATOR}"
  "-DCMAKE_PREFIX_PATH=${prefix}"
  "-DCMAKE_CXX_COMPILER=${KILN_CXX_COMPILER}"
  "-DCMAKE_BUILD_TYPE=${config}"
  # NOTE: only the install may satisfy find_package, not the user package registry.
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
step("build" "${CMAKE_COMMAND}" --build "${build}" --config "${config}")

# Single-config generators put the programs in the build dir, multi-config in <config>/.
foreach(name kiln_consumer kiln_consumer_engine)
  set(program "${build}/${name}")
  if(NOT EXISTS "${program}")
    set(program "${build}/${config}/${name}")
  endif()
  step("run ${program}" "${program}")
endforeach()
