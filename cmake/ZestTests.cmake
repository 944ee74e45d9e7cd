# GoogleTest suites: every tests/<layer>/<name>_test.cc becomes the executable <layer>_<name>_test.
#
# Labels come from a marker comment in the first 10 lines of the test file, space-separated:
#     // ctest-labels: slow mpi
# Without a marker a suite is `quick`. Suites labelled `slow` get a 900 s timeout, others 120 s.
# `gpu` and `browser` suites need what not every machine has (a GPU; chromium, which
# `tools/setup/install-deps.sh browser` installs): `make test` leaves them to `make test-gpu` and
# `make test-browser`, and a browser suite without chromium skips, saying so.
# Files named *_cuda_test.cc / *_test.cu build only with CUDA, *_mpi_test.cc only with MPI,
# *_mpi_cuda_test.cc only with both.
# An *_mpi_test.cc or *_mpi_cuda_test.cc suite runs whole under the MPI launcher, once per
# process count given by the
# marker `// ctest-mpirun-np: 2 4` (the default), as tests <target>.np2, <target>.np4; with
# `// ctest-mpirun-np: none` it runs as a plain suite (one that starts mpirun itself, through
# ZEST_MPIEXEC and ZEST_MPIEXEC_FLAGS).
# Other .cc files under tests/ are helpers, built once as zest_test_support and linked into all;
# tests/fuzz/ is not (libFuzzer programs, cmake/ZestFuzz.cmake).
include_guard(GLOBAL)
include(GoogleTest)

find_package(GTest REQUIRED)

file(GLOB_RECURSE zest_test_sources CONFIGURE_DEPENDS RELATIVE "${CMAKE_SOURCE_DIR}/tests"
     "${CMAKE_SOURCE_DIR}/tests/*_test.cc" "${CMAKE_SOURCE_DIR}/tests/*_test.cu")
list(FILTER zest_test_sources EXCLUDE REGEX "^consumer/")
if(NOT ZEST_HAVE_CUDA)
  list(FILTER zest_test_sources EXCLUDE REGEX "(_cuda_test\\.cc|_test\\.cu)$")
endif()
if(NOT ZEST_HAVE_MPI)
  list(FILTER zest_test_sources EXCLUDE REGEX "_mpi(_cuda)?_test\\.cc$")
endif()

# Helpers shared by suites (tests/**/*.cc that are not *_test.cc) are built once and linked into
# every suite; headers-only helpers need nothing.
file(GLOB_RECURSE zest_test_support_sources CONFIGURE_DEPENDS "${CMAKE_SOURCE_DIR}/tests/*.cc")
# tests/fuzz/ holds libFuzzer programs (cmake/ZestFuzz.cmake), each with its own entry point.
list(FILTER zest_test_support_sources EXCLUDE REGEX "(_test\\.cc$|/tests/consumer/|/tests/fuzz/)")
if(NOT ZEST_HAVE_CUDA)
  list(FILTER zest_test_support_sources EXCLUDE REGEX "_cuda\\.cc$")
endif()
if(NOT ZEST_HAVE_MPI)
  list(FILTER zest_test_support_sources EXCLUDE REGEX "_mpi\\.cc$")
endif()
if(zest_test_support_sources)
  add_library(zest_test_support STATIC ${zest_test_support_sources})
  target_link_libraries(zest_test_support PUBLIC zest::zest GTest::gtest GTest::gmock)
  target_compile_definitions(zest_test_support PUBLIC
    ZEST_SOURCE_DIR="${CMAKE_SOURCE_DIR}" ZEST_BINARY_DIR="${CMAKE_BINARY_DIR}")
  zest_apply_flags(zest_test_support)
endif()

# Note: the launcher flags that let a container run MPI tests: Open MPI refuses to run as root
# without its two ALLOW variables, refuses more processes than cores without --oversubscribe,
# and its single-copy shared-memory path (CMA) fails where ptrace is restricted.
set(zest_mpiexec_flags)
set(zest_mpi_test_environment)
if(ZEST_HAVE_MPI)
  execute_process(COMMAND "${MPIEXEC_EXECUTABLE}" --version OUTPUT_VARIABLE mpiexec_version
                  ERROR_QUIET)
  if(mpiexec_version MATCHES "Open MPI|OpenRTE")
    set(zest_mpiexec_flags --oversubscribe)
    set(zest_mpi_test_environment
      "OMPI_ALLOW_RUN_AS_ROOT=1" "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"
      "OMPI_MCA_btl_vader_single_copy_mechanism=none")
  endif()
endif()

# Reads `// <key>: values` from the first 10 lines of `file` into a list; `default` without one.
function(zest_read_test_marker file key default out)
  file(STRINGS "${file}" head LIMIT_COUNT 10)
  set(values "${default}")
  foreach(line IN LISTS head)
    if(line MATCHES "^[ \t]*//[ \t]*${key}:[ \t]*(.*)$")
      string(STRIP "${CMAKE_MATCH_1}" text)
      separate_arguments(values UNIX_COMMAND "${text}")
      break()
    endif()
  endforeach()
  set(${out} "${values}" PARENT_SCOPE)
endfunction()

function(zest_read_test_labels file out_labels)
  file(STRINGS "${file}" head LIMIT_COUNT 10)
  set(labels quick)
  foreach(line IN LISTS head)
    if(line MATCHES "^[ \t]*//[ \t]*ctest-labels:[ \t]*(.*)$")
      string(STRIP "${CMAKE_MATCH_1}" text)
      separate_arguments(labels UNIX_COMMAND "${text}")
      break()
    endif()
  endforeach()
  set(${out_labels} "${labels}" PARENT_SCOPE)
endfunction()

# Note: allocator_may_return_null lets tests that ask for an impossible allocation see it fail
# (and check the OutOfMemory zest raises) instead of the sanitizer aborting the process.
set(zest_test_environment)
if(ZEST_SANITIZE STREQUAL "address")
  set(zest_test_environment
    "ASAN_OPTIONS=allocator_may_return_null=1:detect_leaks=1"
    "UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")
elseif(ZEST_SANITIZE STREQUAL "thread")
  # Note: OpenBLAS is not instrumented, so TSan cannot see how its thread pool hands a product's
  # pieces to its workers and reports their writes as races with the stream that reads the
  # result; each product stays on its calling thread, as zest-train has it with several ranks.
  set(zest_test_environment
    "TSAN_OPTIONS=allocator_may_return_null=1:halt_on_error=1:second_deadlock_stack=1"
    "OPENBLAS_NUM_THREADS=1")
endif()
# Every test runs with the collective-order check on (runtime/checked_communicator.h): a change
# that makes ranks issue different collectives fails with a message, never hangs a test.
list(APPEND zest_test_environment "ZEST_CHECK_COLLECTIVES=1")

foreach(source IN LISTS zest_test_sources)
  string(REGEX REPLACE "\\.(cc|cu)$" "" target "${source}")
  string(REPLACE "/" "_" target "${target}")
  add_executable(${target} "tests/${source}")
  target_link_libraries(${target} PRIVATE zest::zest GTest::gtest_main GTest::gmock
                                          zest::openblas zest::xxhash)
  # Tests may use what libzest uses privately (a cblas reference, an MPI or NCCL handle).
  if(ZEST_HAVE_MPI)
    target_link_libraries(${target} PRIVATE MPI::MPI_CXX)
  endif()
  if(ZEST_HAVE_CUDA)
    target_link_libraries(${target} PRIVATE zest::nccl)
    # Only the CUDA suites call cuBLAS themselves; linked into every suite, its start-up would
    # cost each test process 0.8 s (cmake/ZestCuda.cmake).
    if(source MATCHES "(_cuda_test\\.cc|_test\\.cu)$")
      target_link_libraries(${target} PRIVATE CUDA::cublas CUDA::cublasLt)
    endif()
    set_target_properties(${target} PROPERTIES LINKER_LANGUAGE CXX)
  endif()
  if(TARGET zest_test_support)
    target_link_libraries(${target} PRIVATE zest_test_support)
  endif()
  if(source MATCHES "^tools/" AND TARGET zest_tools_common)
    target_link_libraries(${target} PRIVATE zest_tools_common)
  endif()
  # A test of a tool runs its binary (ZEST_BINARY_DIR/bin/zest-<tool>): build that first.
  if(source MATCHES "^tools/" AND zest_tools)
    add_dependencies(${target} ${zest_tools})
  endif()
  target_compile_definitions(${target} PRIVATE
    ZEST_SOURCE_DIR="${CMAKE_SOURCE_DIR}" ZEST_BINARY_DIR="${CMAKE_BINARY_DIR}")
  set_target_properties(${target} PROPERTIES RUNTIME_OUTPUT_DIRECTORY "${CMAKE_BINARY_DIR}/tests")
  zest_apply_flags(${target})
  # Note: in a sanitizer build a suite's own file compiles at -O0 (the library, the tools and the
  # test helpers keep the build's -O1): the suites' time goes into the library, which is what the
  # sanitizer checks, while their files are gtest's and gmock's templates, which took twice as
  # long at -O1 under ASan + UBSan (tests/checkpoint/hybrid_checkpoint_test.cc: 34 s against 19 s)
  # and are most of CI's ASan build. -O0 hides nothing from a sanitizer; it keeps more.
  if(ZEST_SANITIZE)
    target_compile_options(${target} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:-O0>")
  endif()

  zest_read_test_labels("${CMAKE_SOURCE_DIR}/tests/${source}" labels)
  set(timeout 120)
  if("slow" IN_LIST labels)
    set(timeout 900)
  endif()
  if(source MATCHES "_mpi(_cuda)?_test\\.cc$")
    list(JOIN zest_mpiexec_flags " " mpiexec_flags_text)
    target_compile_definitions(${target} PRIVATE
      ZEST_MPIEXEC="${MPIEXEC_EXECUTABLE}" ZEST_MPIEXEC_FLAGS="${mpiexec_flags_text}")
    zest_read_test_marker("${CMAKE_SOURCE_DIR}/tests/${source}" ctest-mpirun-np "2;4" counts)
    if(counts STREQUAL "none")
      add_test(NAME ${target} COMMAND ${target})
      set(mpi_tests ${target})
    else()
      set(mpi_tests)
      foreach(np IN LISTS counts)
        add_test(NAME ${target}.np${np}
                 COMMAND "${MPIEXEC_EXECUTABLE}" ${MPIEXEC_NUMPROC_FLAG} ${np} ${zest_mpiexec_flags}
                         ${MPIEXEC_PREFLAGS} $<TARGET_FILE:${target}> ${MPIEXEC_POSTFLAGS})
        list(APPEND mpi_tests ${target}.np${np})
      endforeach()
    endif()
    set(environment ${zest_test_environment} ${zest_mpi_test_environment})
    set_tests_properties(${mpi_tests} PROPERTIES LABELS "${labels}" TIMEOUT ${timeout}
                         ENVIRONMENT "${environment}")
    continue()
  endif()
  gtest_discover_tests(${target} DISCOVERY_TIMEOUT 60 TEST_LIST ${target}_TESTS)
  # Note: CMake 3.25's gtest_discover_tests splits a list given in PROPERTIES (LABELS "slow;mpi"
  # becomes LABELS slow, mpi ...), so labels and timeout are set by a script that ctest reads
  # after the discovered tests, from the list of test names discovery leaves behind.
  set(properties_file "${CMAKE_CURRENT_BINARY_DIR}/${target}_properties.cmake")
  file(CONFIGURE OUTPUT "${properties_file}" @ONLY CONTENT [=[
if(DEFINED @target@_TESTS)
  set_tests_properties(${@target@_TESTS} PROPERTIES LABELS "@labels@" TIMEOUT @timeout@
                       ENVIRONMENT "@zest_test_environment@")
endif()
]=])
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${properties_file}")
endforeach()

# The installed package works for a project outside this tree: install into a scratch prefix,
# then configure, build and run tests/consumer against it.
add_test(NAME install.FindPackageConsumerBuilds
  COMMAND "${CMAKE_COMMAND}"
    "-DZEST_BINARY_DIR=${CMAKE_BINARY_DIR}"
    "-DCONSUMER_SOURCE_DIR=${CMAKE_SOURCE_DIR}/tests/consumer"
    "-DCONSUMER_WORK_DIR=${CMAKE_BINARY_DIR}/consumer-test"
    "-DCONSUMER_GENERATOR=${CMAKE_GENERATOR}"
    "-DCONSUMER_CXX_COMPILER=${CMAKE_CXX_COMPILER}"
    "-DCONSUMER_CONFIG=$<CONFIG>"
    -P "${CMAKE_SOURCE_DIR}/tests/consumer/run.cmake")
set_tests_properties(install.FindPackageConsumerBuilds PROPERTIES LABELS quick TIMEOUT 300)
