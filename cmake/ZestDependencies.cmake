# Host dependencies. Threads, nlohmann_json and fmt are public (they appear in zest headers);
# everything else is linked privately so that a consumer of the shared libzest needs nothing more.
include_guard(GLOBAL)

find_package(Threads REQUIRED)
find_package(nlohmann_json 3.2 REQUIRED)
find_package(fmt REQUIRED)

include(ZestFindLibraries)
zest_find_openblas()
zest_find_xxhash()
zest_find_uring()

# CLI11 is header-only and only the tools use it.
find_package(CLI11 CONFIG QUIET)
if(NOT TARGET CLI11::CLI11)
  find_path(ZEST_CLI11_INCLUDE_DIR CLI/CLI.hpp)
  if(ZEST_CLI11_INCLUDE_DIR)
    add_library(CLI11::CLI11 INTERFACE IMPORTED)
    set_target_properties(CLI11::CLI11 PROPERTIES
      INTERFACE_INCLUDE_DIRECTORIES "${ZEST_CLI11_INCLUDE_DIR}")
  endif()
endif()

# MPI is optional: ZEST_MPI=AUTO builds the mpi communicator where an MPI is found.
set(ZEST_HAVE_MPI OFF)
if(NOT ZEST_MPI MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "ZEST_MPI must be AUTO, ON or OFF, not '${ZEST_MPI}'")
endif()
if(NOT ZEST_MPI STREQUAL "OFF")
  if(ZEST_MPI STREQUAL "ON")
    find_package(MPI REQUIRED COMPONENTS CXX)
  else()
    find_package(MPI QUIET COMPONENTS CXX)
  endif()
  if(MPI_CXX_FOUND)
    set(ZEST_HAVE_MPI ON)
  endif()
endif()
