# Installation: libzest, its headers under include/zest/<layer>/, the tools, and a CMake package
# so that another project can `find_package(zest CONFIG REQUIRED)` and link `zest::zest`.
include_guard(GLOBAL)
include(CMakePackageConfigHelpers)

set(ZEST_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/zest")

install(TARGETS zest EXPORT zestTargets
  ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}"
  LIBRARY DESTINATION "${CMAKE_INSTALL_LIBDIR}"
  RUNTIME DESTINATION "${CMAKE_INSTALL_BINDIR}")
if(zest_tools)
  install(TARGETS ${zest_tools} RUNTIME DESTINATION "${CMAKE_INSTALL_BINDIR}")
endif()

foreach(layer IN LISTS ZEST_LAYERS)
  file(GLOB layer_headers CONFIGURE_DEPENDS "${CMAKE_SOURCE_DIR}/${layer}/*.h"
       "${CMAKE_SOURCE_DIR}/${layer}/*.cuh")
  if(layer_headers)
    install(FILES ${layer_headers} DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}/zest/${layer}")
  endif()
endforeach()
install(FILES "${CMAKE_SOURCE_DIR}/include/zest/zest.h"
        DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}/zest")

install(EXPORT zestTargets NAMESPACE zest:: DESTINATION "${ZEST_INSTALL_CMAKEDIR}")
configure_package_config_file("${CMAKE_SOURCE_DIR}/cmake/zestConfig.cmake.in"
  "${CMAKE_BINARY_DIR}/zestConfig.cmake"
  INSTALL_DESTINATION "${ZEST_INSTALL_CMAKEDIR}")
write_basic_package_version_file("${CMAKE_BINARY_DIR}/zestConfigVersion.cmake"
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMinorVersion)
install(FILES
  "${CMAKE_BINARY_DIR}/zestConfig.cmake"
  "${CMAKE_BINARY_DIR}/zestConfigVersion.cmake"
  "${CMAKE_SOURCE_DIR}/cmake/ZestFindLibraries.cmake"
  DESTINATION "${ZEST_INSTALL_CMAKEDIR}")
