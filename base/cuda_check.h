// Turns the status of a CUDA runtime call into a zest Error naming the call, CUDA's name and text
// for the status, and the file and line of the call (llm.c's cudaCheck, with zest's errors):
// cudaErrorMemoryAllocation becomes OutOfMemory, anything else an Error of kind kDevice.
// CUDA-side only: include it from .cu files and *_cuda.cc sources. In base/ because memory/'s
// CUDA allocator needs it and memory/ may include nothing above it.
#pragma once

#ifndef ZEST_HAVE_CUDA
#error "base/cuda_check.h is CUDA-side only; include it where ZEST_HAVE_CUDA is defined"
#endif

#include <cuda_runtime.h>

namespace zest::cuda {

// Throws the Error for `status` (not cudaSuccess). `call` is the call's text, `file` and `line`
// where it was made. Also clears CUDA's last-error slot, so a later cudaGetLastError() after a
// launch does not report this status again.
[[noreturn]] void throw_cuda_error(cudaError_t status, const char* call, const char* file,
                                   int line);

// Throws for any status but cudaSuccess.
inline void check(cudaError_t status, const char* call, const char* file, int line) {
  if (status != cudaSuccess) throw_cuda_error(status, call, file, line);
}

}  // namespace zest::cuda

// Checks a CUDA runtime call (or a cudaError_t value); records the call's text, file and line.
#define ZEST_CUDA_CHECK(call) ::zest::cuda::check((call), #call, __FILE__, __LINE__)
