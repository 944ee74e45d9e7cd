# The command-line tools. tools/<tool>/main.cc (plus any other .cc beside it) becomes
# bin/zest-<tool>, for tool in train, estimate, ckpt, report, only once main.cc exists. Code shared by
# the tools lives in tools/common/*.cc, built once as the static library zest_tools_common
# (also linked by the tests under tests/tools/).
include_guard(GLOBAL)

set(zest_tools)

file(GLOB zest_tools_common_sources CONFIGURE_DEPENDS "${CMAKE_SOURCE_DIR}/tools/common/*.cc")

# The plotting library the HTML pages inline (zest-train --report, zest-report, zest-estimate
# --html): Debian's libjs-chart.js, compiled into the tools at build time.
# Note: at build time, not read at run time: the tools then need nothing installed where they
# run (a GPU node has no libjs-chart.js), and every page is drawn by the one version the browser
# test checked. Without the file the tools build all the same and refuse HTML output, saying why.
set(ZEST_CHARTJS "/usr/share/javascript/chart.js/chart.min.js" CACHE FILEPATH
    "Chart.js (UMD build) inlined into the tools' HTML pages; Debian: libjs-chart.js")
set(zest_chartjs_source "${CMAKE_BINARY_DIR}/generated/chartjs_source.cc")
if(EXISTS "${ZEST_CHARTJS}")
  set(zest_chartjs_input "${ZEST_CHARTJS}")
  set(zest_chartjs_depends "${ZEST_CHARTJS}")
else()
  message(WARNING "zest: ${ZEST_CHARTJS} not found (Debian: apt-get install libjs-chart.js); the "
                  "tools will refuse HTML output")
  set(zest_chartjs_input "")
  set(zest_chartjs_depends)
endif()
add_custom_command(OUTPUT "${zest_chartjs_source}"
  COMMAND "${CMAKE_COMMAND}" "-DINPUT=${zest_chartjs_input}" "-DOUTPUT=${zest_chartjs_source}"
          -P "${CMAKE_SOURCE_DIR}/cmake/EmbedChartJs.cmake"
  DEPENDS ${zest_chartjs_depends} "${CMAKE_SOURCE_DIR}/cmake/EmbedChartJs.cmake"
  COMMENT "Inlining Chart.js for the tools' HTML pages" VERBATIM)
list(APPEND zest_tools_common_sources "${zest_chartjs_source}")
if(zest_tools_common_sources)
  if(NOT TARGET CLI11::CLI11)
    message(FATAL_ERROR "zest: CLI11 not found (Debian: apt-get install libcli11-dev)")
  endif()
  add_library(zest_tools_common STATIC ${zest_tools_common_sources})
  target_link_libraries(zest_tools_common PUBLIC zest::zest CLI11::CLI11)
  zest_apply_flags(zest_tools_common)
endif()

foreach(tool IN ITEMS train estimate ckpt report)
  if(NOT EXISTS "${CMAKE_SOURCE_DIR}/tools/${tool}/main.cc")
    continue()
  endif()
  if(NOT TARGET CLI11::CLI11)
    message(FATAL_ERROR "zest: CLI11 not found (Debian: apt-get install libcli11-dev)")
  endif()
  file(GLOB tool_sources CONFIGURE_DEPENDS "${CMAKE_SOURCE_DIR}/tools/${tool}/*.cc")
  add_executable(zest-${tool} ${tool_sources})
  # zest::openblas: a tool that runs ranks as threads caps OpenBLAS at one thread per rank
  # (openblas_set_num_threads), which libzest links only privately.
  target_link_libraries(zest-${tool} PRIVATE zest::zest CLI11::CLI11 zest::openblas)
  if(TARGET zest_tools_common)
    target_link_libraries(zest-${tool} PRIVATE zest_tools_common)
  endif()
  if(ZEST_HAVE_CUDA)
    set_target_properties(zest-${tool} PROPERTIES LINKER_LANGUAGE CXX)
  endif()
  zest_apply_flags(zest-${tool})
  list(APPEND zest_tools zest-${tool})
endforeach()
