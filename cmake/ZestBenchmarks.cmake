# Google Benchmark programs: every benchmarks/<name>_bench.cc becomes bin/<name>_bench.
# benchmarks/<name>_cuda_bench.cc build only with CUDA, and may call cuBLASLt themselves.
include_guard(GLOBAL)

find_package(benchmark QUIET)
if(NOT benchmark_FOUND)
  message(WARNING "zest: Google Benchmark not found (Debian: libbenchmark-dev); "
                  "benchmarks are not built")
  return()
endif()

file(GLOB zest_bench_sources CONFIGURE_DEPENDS RELATIVE "${CMAKE_SOURCE_DIR}/benchmarks"
     "${CMAKE_SOURCE_DIR}/benchmarks/*_bench.cc")
if(NOT ZEST_HAVE_CUDA)
  list(FILTER zest_bench_sources EXCLUDE REGEX "_cuda_bench\\.cc$")
endif()
foreach(source IN LISTS zest_bench_sources)
  string(REGEX REPLACE "\\.cc$" "" target "${source}")
  add_executable(${target} "benchmarks/${source}")
  target_link_libraries(${target} PRIVATE zest::zest benchmark::benchmark)
  if(source STREQUAL "pipeline_bubble_bench.cc")
    # Runs ranks as threads and caps OpenBLAS at one thread per rank, as zest-train does
    # (openblas_set_num_threads; libzest links OpenBLAS only privately).
    target_link_libraries(${target} PRIVATE zest::openblas)
  endif()
  if(ZEST_HAVE_CUDA)
    set_target_properties(${target} PROPERTIES LINKER_LANGUAGE CXX)
  endif()
  if(source MATCHES "_cuda_bench\\.cc$")
    # libzest links cuBLASLt privately; a benchmark that makes its own handle links it too.
    target_link_libraries(${target} PRIVATE CUDA::cublasLt)
  endif()
  zest_apply_flags(${target})
endforeach()
