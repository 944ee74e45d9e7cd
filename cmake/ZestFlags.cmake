# Warning and sanitizer flags, applied per target so that third-party code is never affected.
include_guard(GLOBAL)

if(NOT ZEST_SANITIZE MATCHES "^(|address|thread)$")
  message(FATAL_ERROR "ZEST_SANITIZE must be empty, 'address' or 'thread', not '${ZEST_SANITIZE}'")
endif()
if(ZEST_FUZZ AND ZEST_SANITIZE STREQUAL "thread")
  message(FATAL_ERROR "ZEST_FUZZ=ON builds with ASan + UBSan; it cannot be combined with "
                      "ZEST_SANITIZE=thread")
endif()

# -Wall -Wextra always; -Werror with ZEST_WERROR. CUDA sources get the same through the host
# compiler (nvcc's own diagnostics stay warnings).
function(zest_apply_flags target)
  set(cxx_warnings -Wall -Wextra)
  set(cuda_warnings -Xcompiler=-Wall,-Wextra)
  if(ZEST_WERROR)
    list(APPEND cxx_warnings -Werror)
    set(cuda_warnings -Xcompiler=-Wall,-Wextra,-Werror)
  endif()
  target_compile_options(${target} PRIVATE
    "$<$<COMPILE_LANGUAGE:CXX>:${cxx_warnings}>"
    "$<$<COMPILE_LANGUAGE:CUDA>:${cuda_warnings}>")
endfunction()

# Sanitizer flags go on the library's *public* interface: everything that links an instrumented
# libzest (tests, tools, benchmarks, an installed consumer) must link the sanitizer runtime too.
# -fno-sanitize-recover makes undefined behaviour end the process, so a test that hits it fails.
# ZEST_FUZZ adds libFuzzer's coverage instrumentation (fuzzer-no-link) to the library alone: the
# fuzzers steer by the coverage of the readers they call (each fuzzer's own file gets it from
# -fsanitize=fuzzer), and on the test suites and tools it only cost time, a third of each test
# file's compile under ASan (tests/tools/zest_train_test.cc: 18.1 s against 11.5 s) and more of
# its run.
function(zest_apply_sanitizers target)
  if(ZEST_SANITIZE STREQUAL "address" OR ZEST_FUZZ)
    set(flags -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
  elseif(ZEST_SANITIZE STREQUAL "thread")
    set(flags -fsanitize=thread -fno-omit-frame-pointer)
  else()
    return()
  endif()
  target_compile_options(${target} PUBLIC "$<$<COMPILE_LANGUAGE:CXX>:${flags}>")
  target_link_options(${target} PUBLIC ${flags})
  if(ZEST_FUZZ)
    target_compile_options(${target} PRIVATE
                           "$<$<COMPILE_LANGUAGE:CXX>:-fsanitize=fuzzer-no-link>")
  endif()
endfunction()
