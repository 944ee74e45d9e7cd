// CUDA bodies of kernels/cross_entropy.h, fused softmax + cross-entropy over logits
// [rows, classes] with int32 targets: forward writes the mean loss (per-row terms in double, as
// on the CPU, then summed in a fixed order, so the loss is deterministic); backward writes
// dlogits = (softmax - onehot(target)) * (scale / rows), in place if dlogits == logits. One
// difference from the CPU body: a kernel cannot throw, so a target outside [0, classes) makes
// that row's loss term and gradient NaN (the loss is NaN), which the engine's finite check sees.
// CUDA-side only: include it from .cu files and *_cuda.cc sources.
#pragma once

#ifndef ZEST_HAVE_CUDA
#error "kernels/cross_entropy_cuda.h is CUDA-side only; include it where ZEST_HAVE_CUDA is defined"
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace zest::cuda {

// Workspace bytes cross_entropy_forward needs (one double per row). Throws kUsage unless
// rows >= 1 and classes >= 1, as the functions below.
std::size_t cross_entropy_forward_workspace_bytes(std::int64_t rows);

// Device pointers; `loss` is one float in device memory.
void cross_entropy_forward(const float* logits, const std::int32_t* targets, std::int64_t rows,
                           std::int64_t classes, float* loss, void* workspace,
                           std::size_t workspace_bytes, cudaStream_t stream);
void cross_entropy_backward(const float* logits, const std::int32_t* targets, std::int64_t rows,
                            std::int64_t classes, float scale, float* dlogits, cudaStream_t stream);

}  // namespace zest::cuda
