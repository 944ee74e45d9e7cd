# Imported targets for the libraries zest links that ship no usable CMake target:
#   zest::xxhash   (libxxhash; Debian libxxhash-dev has no CMake package)
#   zest::uring    (liburing; Debian liburing-dev, for the NVMe tier's io_uring reads and writes)
#   zest::openblas (OpenBLAS with its cblas.h; its CMake package defines variables only)
#   zest::nccl     (NCCL; looked for beside the CUDA toolkit, or under NCCL_HOME / NCCL_ROOT)
# Used by the build and, for a static libzest, by the installed zestConfig.cmake.
include_guard(GLOBAL)

find_package(PkgConfig QUIET)

function(zest_find_xxhash)
  if(TARGET zest::xxhash)
    return()
  endif()
  if(PKG_CONFIG_FOUND)
    pkg_check_modules(ZEST_PC_XXHASH QUIET libxxhash)
  endif()
  find_path(ZEST_XXHASH_INCLUDE_DIR xxhash.h HINTS ${ZEST_PC_XXHASH_INCLUDE_DIRS})
  find_library(ZEST_XXHASH_LIBRARY NAMES xxhash libxxhash HINTS ${ZEST_PC_XXHASH_LIBRARY_DIRS})
  if(NOT ZEST_XXHASH_INCLUDE_DIR OR NOT ZEST_XXHASH_LIBRARY)
    message(FATAL_ERROR "zest: xxhash not found (Debian: apt-get install libxxhash-dev; "
                        "or set ZEST_XXHASH_INCLUDE_DIR and ZEST_XXHASH_LIBRARY)")
  endif()
  add_library(zest::xxhash UNKNOWN IMPORTED)
  set_target_properties(zest::xxhash PROPERTIES
    IMPORTED_LOCATION "${ZEST_XXHASH_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${ZEST_XXHASH_INCLUDE_DIR}")
endfunction()

function(zest_find_uring)
  if(TARGET zest::uring)
    return()
  endif()
  if(PKG_CONFIG_FOUND)
    pkg_check_modules(ZEST_PC_URING QUIET liburing)
  endif()
  find_path(ZEST_URING_INCLUDE_DIR liburing.h HINTS ${ZEST_PC_URING_INCLUDE_DIRS})
  find_library(ZEST_URING_LIBRARY NAMES uring HINTS ${ZEST_PC_URING_LIBRARY_DIRS})
  if(NOT ZEST_URING_INCLUDE_DIR OR NOT ZEST_URING_LIBRARY)
    message(FATAL_ERROR "zest: liburing not found (Debian: apt-get install liburing-dev; "
                        "or set ZEST_URING_INCLUDE_DIR and ZEST_URING_LIBRARY)")
  endif()
  add_library(zest::uring UNKNOWN IMPORTED)
  set_target_properties(zest::uring PROPERTIES
    IMPORTED_LOCATION "${ZEST_URING_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${ZEST_URING_INCLUDE_DIR}")
endfunction()

function(zest_find_openblas)
  if(TARGET zest::openblas)
    return()
  endif()
  find_package(OpenBLAS CONFIG QUIET)
  find_path(ZEST_CBLAS_INCLUDE_DIR cblas.h
    HINTS ${OpenBLAS_INCLUDE_DIRS}
    PATH_SUFFIXES openblas openblas-pthread)
  set(library_dirs)
  foreach(library IN LISTS OpenBLAS_LIBRARIES)
    get_filename_component(library_dir "${library}" DIRECTORY)
    list(APPEND library_dirs "${library_dir}")
  endforeach()
  find_library(ZEST_OPENBLAS_LIBRARY NAMES openblas HINTS ${library_dirs})
  if(NOT ZEST_CBLAS_INCLUDE_DIR OR NOT ZEST_OPENBLAS_LIBRARY)
    message(FATAL_ERROR "zest: OpenBLAS (cblas) not found (Debian: apt-get install "
                        "libopenblas-dev; or set ZEST_CBLAS_INCLUDE_DIR and ZEST_OPENBLAS_LIBRARY)")
  endif()
  add_library(zest::openblas UNKNOWN IMPORTED)
  set_target_properties(zest::openblas PROPERTIES
    IMPORTED_LOCATION "${ZEST_OPENBLAS_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${ZEST_CBLAS_INCLUDE_DIR}")
endfunction()

# Call after find_package(CUDAToolkit).
function(zest_find_nccl)
  if(TARGET zest::nccl)
    return()
  endif()
  set(hints ${CUDAToolkit_LIBRARY_ROOT} ${CUDAToolkit_TARGET_DIR} $ENV{NCCL_HOME} $ENV{NCCL_ROOT})
  find_path(ZEST_NCCL_INCLUDE_DIR nccl.h
    HINTS ${CUDAToolkit_INCLUDE_DIRS} ${hints} PATH_SUFFIXES include)
  # libnccl.so.2: pip's nvidia-nccl packages ship no unversioned link.
  find_library(ZEST_NCCL_LIBRARY NAMES nccl libnccl.so.2
    HINTS ${CUDAToolkit_LIBRARY_DIR} ${hints} PATH_SUFFIXES lib lib64)
  if(NOT ZEST_NCCL_INCLUDE_DIR OR NOT ZEST_NCCL_LIBRARY)
    message(FATAL_ERROR "zest: NCCL not found beside the CUDA toolkit (set NCCL_HOME, or "
                        "ZEST_NCCL_INCLUDE_DIR and ZEST_NCCL_LIBRARY; or configure -DZEST_CUDA=OFF)")
  endif()
  add_library(zest::nccl UNKNOWN IMPORTED)
  set_target_properties(zest::nccl PROPERTIES
    IMPORTED_LOCATION "${ZEST_NCCL_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${ZEST_NCCL_INCLUDE_DIR}")
endfunction()
