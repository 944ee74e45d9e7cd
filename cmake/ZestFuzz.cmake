# libFuzzer programs (ZEST_FUZZ=ON; clang only): every tests/fuzz/<name>_fuzzer.cc becomes
# bin/<name>_fuzzer, linked with -fsanitize=fuzzer against a libzest instrumented with
# fuzzer-no-link + ASan + UBSan (ZestFlags.cmake). The custom target `zest_fuzzers` builds them
# all. Each gets two ctest tests labelled fuzz-smoke:
#   fuzz.<name>.inputs  every committed input once, no time budget: the seed corpus
#                       tests/fuzz/corpus/<name>/ and the crash regressions
#                       tests/fuzz/regressions/<name>/
#   fuzz.<name>.smoke   fuzzes from those inputs (seed ZEST_FUZZ_SEED) for ZEST_FUZZ_SECONDS
#                       (and at most ZEST_FUZZ_RUNS runs), with tests/fuzz/<name>.dict when there is one; new inputs go to
#                       <build>/fuzz/corpus/<name>/, crashes to <build>/fuzz/artifacts/, never
#                       into the source tree.
include_guard(GLOBAL)

if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "ZEST_FUZZ=ON needs clang (libFuzzer); configure a separate folder with "
                      "CC=clang CXX=clang++, not ${CMAKE_CXX_COMPILER_ID}")
endif()

set(ZEST_FUZZ_SECONDS 10 CACHE STRING "Seconds each fuzz.<name>.smoke test fuzzes")
set(ZEST_FUZZ_RUNS 2000000 CACHE STRING "Most inputs each fuzz.<name>.smoke test runs")
# Note: a fixed seed makes the smoke tests a fixed sequence of inputs (up to the time budget), so
# CI never fails by the luck of a draw; 0 lets libFuzzer pick a new seed each run, for exploring
# (with more ZEST_FUZZ_SECONDS) outside CI.
set(ZEST_FUZZ_SEED 1 CACHE STRING "libFuzzer -seed of the smoke tests (0: a new one each run)")

enable_testing()
add_custom_target(zest_fuzzers)

# Note: -rss_limit_mb also caps a single malloc (libFuzzer's malloc_limit_mb defaults to it), so
# an input that makes a reader allocate gigabytes from a size field is reported as a crash; the
# readers must reject such sizes first. -timeout catches an input that makes a reader loop.
set(zest_fuzz_flags -rss_limit_mb=2048 -timeout=20 -print_final_stats=1)

file(GLOB zest_fuzz_sources CONFIGURE_DEPENDS RELATIVE "${CMAKE_SOURCE_DIR}/tests/fuzz"
     "${CMAKE_SOURCE_DIR}/tests/fuzz/*_fuzzer.cc")
foreach(source IN LISTS zest_fuzz_sources)
  string(REGEX REPLACE "_fuzzer\\.cc$" "" name "${source}")
  set(target ${name}_fuzzer)
  add_executable(${target} "tests/fuzz/${source}")
  target_link_libraries(${target} PRIVATE zest::zest)
  target_link_options(${target} PRIVATE -fsanitize=fuzzer)
  zest_apply_flags(${target})
  add_dependencies(zest_fuzzers ${target})

  set(corpus "${CMAKE_SOURCE_DIR}/tests/fuzz/corpus/${name}")
  set(regressions "${CMAKE_SOURCE_DIR}/tests/fuzz/regressions/${name}")
  set(work "${CMAKE_BINARY_DIR}/fuzz/corpus/${name}")
  set(artifacts "${CMAKE_BINARY_DIR}/fuzz/artifacts")
  file(MAKE_DIRECTORY "${work}" "${artifacts}")
  # Folders that hold inputs; the glob makes a new regression input reconfigure the build.
  set(inputs "${corpus}")
  file(GLOB regression_inputs CONFIGURE_DEPENDS "${regressions}/*")
  if(regression_inputs)
    list(APPEND inputs "${regressions}")
  endif()
  # A libFuzzer dictionary beside the fuzzer (tests/fuzz/<name>.dict) steers mutations to the
  # format's keys and edge values.
  set(dictionary)
  if(EXISTS "${CMAKE_SOURCE_DIR}/tests/fuzz/${name}.dict")
    set(dictionary "-dict=${CMAKE_SOURCE_DIR}/tests/fuzz/${name}.dict")
  endif()
  # -runs=0 runs the corpus folders' inputs once and writes nothing; when fuzzing, libFuzzer adds
  # new inputs to its first corpus folder only: the build folder's.
  add_test(NAME fuzz.${name}.inputs
           COMMAND ${target} ${zest_fuzz_flags} -runs=0 -artifact_prefix=${artifacts}/${name}-
                   ${inputs})
  add_test(NAME fuzz.${name}.smoke
           COMMAND ${target} ${zest_fuzz_flags} ${dictionary} -seed=${ZEST_FUZZ_SEED}
                   -max_total_time=${ZEST_FUZZ_SECONDS}
                   -runs=${ZEST_FUZZ_RUNS} -artifact_prefix=${artifacts}/${name}-
                   "${work}" ${inputs})
  set_tests_properties(fuzz.${name}.inputs fuzz.${name}.smoke PROPERTIES
    LABELS fuzz-smoke TIMEOUT 300)
endforeach()
