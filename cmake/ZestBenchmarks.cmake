# Google Benchmark programs: every benchmarks/<name>_bench.cc becomes bin/<name>_bench.
include_guard(GLOBAL)

find_package(benchmark QUIET)
if(NOT benchmark_FOUND)
  message(WARNING "zest: Google Benchmark not found (Debian: libbenchmark-dev); "
                  "benchmarks are not built")
  return()
endif()

file(GLOB zest_bench_sources CONFIGURE_DEPENDS RELATIVE "${CMAKE_SOURCE_DIR}/benchmarks"
     "${CMAKE_SOURCE_DIR}/benchmarks/*_bench.cc")
foreach(source IN LISTS zest_bench_sources)
  string(REGEX REPLACE "\\.cc$" "" target "${source}")
  add_executable(${target} "benchmarks/${source}")
  target_link_libraries(${target} PRIVATE zest::zest benchmark::benchmark)
  if(ZEST_HAVE_CUDA)
    set_target_properties(${target} PROPERTIES LINKER_LANGUAGE CXX)
  endif()
  zest_apply_flags(${target})
endforeach()
