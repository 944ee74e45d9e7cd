// CUDA bodies of kernels/gelu.h: GPT-2's tanh GELU with the CPU body's constants and operation
// order (each product and sum rounded on its own, no FMA), so GPU and CPU differ only by CUDA's
// tanhf against glibc's tanh (a couple of ulps). Backward WRITES dx; elementwise, so y may alias
// x and dx may alias x or dy.
// CUDA-side only: include it from .cu files and *_cuda.cc sources.
#pragma once

#ifndef ZEST_HAVE_CUDA
#error "kernels/gelu_cuda.h is CUDA-side only; include it where ZEST_HAVE_CUDA is defined"
#endif

#include <cuda_runtime.h>

#include <cstddef>

namespace zest::cuda {

// Device pointers of `count` elements. A failed launch throws kDevice.
void gelu_forward(const float* x, float* y, std::size_t count, cudaStream_t stream);
void gelu_backward(const float* x, const float* dy, float* dx, std::size_t count,
                   cudaStream_t stream);

}  // namespace zest::cuda
