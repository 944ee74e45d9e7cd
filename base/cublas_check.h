// Turns the status of a cuBLAS or cuBLASLt call into a zest Error naming the call, cuBLAS's name
// and text for the status, and the file and line of the call (ZEST_CUDA_CHECK's twin for the
// GEMM library): CUBLAS_STATUS_ALLOC_FAILED becomes OutOfMemory, anything else an Error of kind
// kDevice. CUDA-side only: include it from .cu files and *_cuda.cc sources.
#pragma once

#ifndef ZEST_HAVE_CUDA
#error "base/cublas_check.h is CUDA-side only; include it where ZEST_HAVE_CUDA is defined"
#endif

#include <cublas_api.h>

namespace zest::cuda {

// Throws the Error for `status` (not CUBLAS_STATUS_SUCCESS). `call` is the call's text, `file`
// and `line` where it was made.
[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* call, const char* file,
                                     int line);

inline void check_cublas(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status != CUBLAS_STATUS_SUCCESS) throw_cublas_error(status, call, file, line);
}

}  // namespace zest::cuda

// Checks a cuBLAS / cuBLASLt call (or a cublasStatus_t value); records its text, file and line.
#define ZEST_CUBLAS_CHECK(call) ::zest::cuda::check_cublas((call), #call, __FILE__, __LINE__)
