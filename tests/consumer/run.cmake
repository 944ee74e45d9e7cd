# cmake -P script behind the ctest test install.FindPackageConsumerBuilds:
#   1. install the zest build tree ZEST_BINARY_DIR into a fresh prefix under CONSUMER_WORK_DIR,
#   2. configure tests/consumer against that prefix (CMAKE_PREFIX_PATH), build it, run it.
# Inputs (-D): ZEST_BINARY_DIR, CONSUMER_SOURCE_DIR, CONSUMER_WORK_DIR, CONSUMER_GENERATOR,
#              CONSUMER_CXX_COMPILER, CONSUMER_CONFIG (may be empty).
cmake_minimum_required(VERSION 3.25)

foreach(var IN ITEMS ZEST_BINARY_DIR CONSUMER_SOURCE_DIR CONSUMER_WORK_DIR CONSUMER_GENERATOR)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "run.cmake: -D${var}=... is required")
  endif()
endforeach()
if(NOT CONSUMER_CONFIG)
  set(CONSUMER_CONFIG Release)
endif()

set(prefix "${CONSUMER_WORK_DIR}/prefix")
set(build "${CONSUMER_WORK_DIR}/build")
file(REMOVE_RECURSE "${CONSUMER_WORK_DIR}")
file(MAKE_DIRECTORY "${CONSUMER_WORK_DIR}")

function(step name)
  message(STATUS "consumer test: ${name}: ${ARGN}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE status)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "consumer test: ${name} failed (${status})")
  endif()
endfunction()

step(install "${CMAKE_COMMAND}" --install "${ZEST_BINARY_DIR}" --prefix "${prefix}"
     --config "${CONSUMER_CONFIG}")
step(configure "${CMAKE_COMMAND}" -S "${CONSUMER_SOURCE_DIR}" -B "${build}"
     -G "${CONSUMER_GENERATOR}"
     "-DCMAKE_CXX_COMPILER=${CONSUMER_CXX_COMPILER}"
     "-DCMAKE_BUILD_TYPE=${CONSUMER_CONFIG}"
     "-DCMAKE_PREFIX_PATH=${prefix}")
step(build "${CMAKE_COMMAND}" --build "${build}" --config "${CONSUMER_CONFIG}")

find_program(consumer zest_consumer PATHS "${build}" "${build}/${CONSUMER_CONFIG}" NO_DEFAULT_PATH
             NO_CACHE)
if(NOT consumer)
  message(FATAL_ERROR "consumer test: zest_consumer was not built under ${build}")
endif()
step(run "${consumer}")
