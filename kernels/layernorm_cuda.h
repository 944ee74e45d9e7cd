// CUDA bodies of kernels/layernorm.h, the same math and layout: forward keeps each row's mean and
// rstd (fp32, [rows]); the row statistics are summed in double as on the CPU, so GPU and CPU
// agree to an ulp or two. Backward ACCUMULATES into dx, dweight and dbias, and its column sums
// (dweight, dbias) are deterministic: fixed chunks of rows summed into the caller's workspace,
// then the chunks summed in order (no float atomics, so a rerun gives the same bits).
// CUDA-side only: include it from .cu files and *_cuda.cc sources.
#pragma once

#ifndef ZEST_HAVE_CUDA
#error "kernels/layernorm_cuda.h is CUDA-side only; include it where ZEST_HAVE_CUDA is defined"
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace zest::cuda {

// Device pointers; shapes as cpu::layernorm_forward. Throws kUsage unless rows >= 0, cols >= 1.
void layernorm_forward(const float* x, const float* weight, const float* bias, std::int64_t rows,
                       std::int64_t cols, float eps, float* y, float* mean, float* rstd,
                       cudaStream_t stream);

// Workspace bytes layernorm_backward needs for [rows, cols] (the per-chunk column sums).
std::size_t layernorm_backward_workspace_bytes(std::int64_t rows, std::int64_t cols);

// As cpu::layernorm_backward (dx must not alias dy or x); `workspace` holds at least
// layernorm_backward_workspace_bytes(rows, cols) bytes (kUsage otherwise).
void layernorm_backward(const float* dy, const float* x, const float* weight, const float* mean,
                        const float* rstd, std::int64_t rows, std::int64_t cols, float* dx,
                        float* dweight, float* dbias, void* workspace, std::size_t workspace_bytes,
                        cudaStream_t stream);

}  // namespace zest::cuda
