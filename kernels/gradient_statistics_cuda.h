// CUDA body of kernels/gradient_statistics.h: the sum of squares (in double, of each value as
// fp32) and the inf / NaN count of fp32, bf16 or fp16 gradients in one pass (a CUB device
// reduction into a result of the caller's workspace), then added to the device-resident totals by
// one thread. No atomics: the same input gives the same bits run to run. Also the fp32 sum of
// squares alone, for vector_ops.h's add_sum_of_squares. Invariant: both ACCUMULATE into their
// result, and the workspace is the caller's (nothing is allocated here).
// CUDA-side only: include it from .cu files and *_cuda.cc sources.
#pragma once

#ifndef ZEST_HAVE_CUDA
#error "kernels/gradient_statistics_cuda.h is CUDA-side only; include it where ZEST_HAVE_CUDA is defined"
#endif

#include <cuda_runtime.h>

#include <cstddef>

#include "base/dtype.h"
#include "kernels/gradient_statistics.h"

namespace zest::cuda {

// Workspace bytes add_gradient_statistics needs for `count` elements of `type` (the partial
// result and CUB's temporary storage). Asks the current device: kDevice if CUDA fails;
// kUsage for a type other than fp32, bf16 or fp16.
std::size_t gradient_statistics_workspace_bytes(DType type, std::size_t count);

// Enqueues on `stream`: statistics->sum_of_squares += sum of float(data[i])^2 in double, and
// statistics->non_finite += the number of inf / NaN data[i], i < count. Device pointers;
// `workspace_bytes` is at least gradient_statistics_workspace_bytes(type, count) (kUsage
// otherwise, on the host, as is a type other than fp32, bf16 or fp16). count 0 launches nothing.
void add_gradient_statistics(const void* data, DType type, std::size_t count,
                             GradientStatistics* statistics, void* workspace,
                             std::size_t workspace_bytes, cudaStream_t stream);

// Enqueues *sum_of_squares += sum of double(data[i])^2, i < count; the workspace is sized by
// gradient_statistics_workspace_bytes(DType::kFloat32, count).
void add_sum_of_squares(const float* data, std::size_t count, double* sum_of_squares,
                        void* workspace, std::size_t workspace_bytes, cudaStream_t stream);

}  // namespace zest::cuda
