# The CUDA device. ZEST_CUDA=AUTO turns it on where nvcc is found (PATH, CUDACXX, CUDA_HOME,
# CUDA_PATH or /usr/local/cuda) and compiles a test program, so a broken toolkit means "off",
# not a failed configure. The host compiler for nvcc defaults to the C++ compiler of the build.
include_guard(GLOBAL)

set(ZEST_HAVE_CUDA OFF)
if(NOT ZEST_CUDA MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "ZEST_CUDA must be AUTO, ON or OFF, not '${ZEST_CUDA}'")
endif()

if(NOT ZEST_CUDA STREQUAL "OFF")
  if(NOT DEFINED CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX})
    find_program(ZEST_NVCC nvcc
      HINTS ENV CUDA_HOME ENV CUDA_PATH
      PATHS /usr/local/cuda
      PATH_SUFFIXES bin)
    if(ZEST_NVCC)
      # check_language() runs in a child CMake, which reads the compiler from CUDACXX.
      set(ENV{CUDACXX} "${ZEST_NVCC}")
    endif()
  endif()
  if(NOT DEFINED CMAKE_CUDA_HOST_COMPILER)
    set(CMAKE_CUDA_HOST_COMPILER "${CMAKE_CXX_COMPILER}" CACHE FILEPATH "Host compiler for nvcc")
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(ZEST_HAVE_CUDA ON)
  elseif(ZEST_CUDA STREQUAL "ON")
    message(FATAL_ERROR "ZEST_CUDA=ON but no working nvcc was found: set CUDACXX or "
                        "CMAKE_CUDA_COMPILER, or configure with -DZEST_CUDA=AUTO/OFF")
  else()
    message(STATUS "zest: no working nvcc found; building the CPU device only")
  endif()
endif()

if(ZEST_HAVE_CUDA)
  # ZEST_CUDA_ARCHS is the one knob (a cached CMAKE_CUDA_ARCHITECTURES would ignore changes).
  set(CMAKE_CUDA_ARCHITECTURES "${ZEST_CUDA_ARCHS}")
  # Note: cudart is linked as a shared library (CUDA::cudart) so that libzest, the tests and a
  # consumer share one CUDA runtime; CMake's default for CUDA targets is the static one.
  set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
  enable_language(CUDA)
  # Note: CMake 3.25 knows no C++20 dialect flag for nvcc (3.26 does) and then refuses any target
  # with CUDA sources that requires cxx_std_20; nvcc >= 12 takes -std=c++20.
  if(NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  endif()
  set(CMAKE_CUDA_STANDARD 20)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  set(CMAKE_CUDA_EXTENSIONS OFF)
  find_package(CUDAToolkit REQUIRED)
  # Recorded in the installed zestConfig.cmake so that consumers find the same toolkit.
  get_filename_component(ZEST_CUDA_TOOLKIT_ROOT "${CUDAToolkit_BIN_DIR}" DIRECTORY)
  zest_find_nccl()
endif()

# cudart is public because zest headers may name cudaStream_t and friends; cuBLASLt and NCCL are
# implementation details of libzest.
# Note: cuBLASLt is opened at the first GEMM (dlopen, base/cublaslt_library.h), not linked: its
# static initialization costs every process that links it about 0.6 s of CPU, which CPU-only runs
# and every test process paid. Its soname and the toolkit's path are compiled in.
function(zest_link_cuda target)
  if(NOT ZEST_HAVE_CUDA)
    return()
  endif()
  target_compile_definitions(${target} PUBLIC ZEST_HAVE_CUDA=1)
  get_target_property(cublaslt_path CUDA::cublasLt IMPORTED_LOCATION)
  get_filename_component(cublaslt_folder "${cublaslt_path}" DIRECTORY)
  set(cublaslt_soname "libcublasLt.so.${CUDAToolkit_VERSION_MAJOR}")
  target_compile_definitions(${target} PRIVATE
    ZEST_CUBLASLT_SONAME="${cublaslt_soname}"
    ZEST_CUBLASLT_PATH="${cublaslt_folder}/${cublaslt_soname}")
  target_link_libraries(${target}
    PUBLIC CUDA::cudart
    PRIVATE zest::nccl ${CMAKE_DL_LIBS})
  # Link with the C++ driver (no device link step is needed without separable compilation), so
  # that sanitizer and other host link flags are understood.
  set_target_properties(${target} PROPERTIES LINKER_LANGUAGE CXX)
endfunction()
