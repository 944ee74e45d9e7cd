// CUDA bodies of kernels/gelu.h: GPT-2's tanh GELU with the CPU body's constants (each product
// and sum rounded on its own, no FMA), written as 0.5 x (1 + tanh u) with CUDA's tanhf. The CPU
// body has since moved to the logistic form with its own exp (kernels/gelu.cc), so the two are
// not the same operations: they agree to a few ulps of the terms (tests/kernels/gelu_cuda_test.cc
// states the bound), and in the far negative tail (x below about -5) the GPU's 1 + tanh u loses
// the digits the CPU keeps (absolute error still below 1e-6). Backward WRITES dx; elementwise, so
// y may alias x and dx may alias x or dy.
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
