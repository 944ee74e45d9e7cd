// cuBLASLt, opened at the first GEMM on a CUDA device instead of when libzest loads. Its static
// initialization costs every process that links it most of a second of CPU (measured: an empty
// program linked to libcublasLt.so.13 runs in 0.64 s, 0.01 s without), which every CPU-only run,
// every test process and every `zest-train` a test starts used to pay for a library it never
// called. libzest therefore does not link cuBLAS: it opens the library (dlopen) the first time a
// CUDA stream makes its handle, and calls through the table below. CUDA-side only.
#pragma once

#ifndef ZEST_HAVE_CUDA
#error "base/cublaslt_library.h is CUDA-side only; include it where ZEST_HAVE_CUDA is defined"
#endif

#include <cublasLt.h>

namespace zest::cuda {

// The cuBLASLt functions libzest calls, each the library's own.
struct CublasLt {
  decltype(&cublasLtCreate) create;
  decltype(&cublasLtDestroy) destroy;
  decltype(&cublasLtGetStatusName) status_name;
  decltype(&cublasLtGetStatusString) status_string;
  decltype(&cublasLtMatmulDescCreate) desc_create;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set;
  decltype(&cublasLtMatrixLayoutCreate) layout_create;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy;
  decltype(&cublasLtMatrixLayoutSetAttribute) layout_set;
  decltype(&cublasLtMatmulPreferenceCreate) preference_create;
  decltype(&cublasLtMatmulPreferenceDestroy) preference_destroy;
  decltype(&cublasLtMatmulPreferenceSetAttribute) preference_set;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic;
  decltype(&cublasLtMatmul) matmul;
};

// The table, the library opened on the first call (thread-safe; it stays open). Throws a kDevice
// Error naming the library and dlerror()'s reason when it cannot be opened or lacks a function.
const CublasLt& cublaslt();

}  // namespace zest::cuda
