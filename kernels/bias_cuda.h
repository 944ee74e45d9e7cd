// CUDA bodies of kernels/bias.h: a bias row added to every row of y [rows, cols] (where no
// matmul epilogue adds it: kernels/matmul_cuda.h fuses the bias and the residual into the
// product), and the bias gradient dbias += colsum(dy), deterministic as LayerNorm's column sums:
// fixed chunks of rows into the caller's workspace, then the chunks in order, no float atomics.
// CUDA-side only: include it from .cu files and *_cuda.cc sources.
#pragma once

#ifndef ZEST_HAVE_CUDA
#error "kernels/bias_cuda.h is CUDA-side only; include it where ZEST_HAVE_CUDA is defined"
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace zest::cuda {

// Device pointers. Throw kUsage for a negative shape; an empty one does nothing.
void add_bias(float* y, const float* bias, std::int64_t rows, std::int64_t cols,
              cudaStream_t stream);

// Workspace bytes bias_grad needs for [rows, cols].
std::size_t bias_grad_workspace_bytes(std::int64_t rows, std::int64_t cols);

void bias_grad(const float* dy, float* dbias, std::int64_t rows, std::int64_t cols, void* workspace,
               std::size_t workspace_bytes, cudaStream_t stream);

}  // namespace zest::cuda
