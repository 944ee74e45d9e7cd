// CUDA body of the gradient norm and overflow check of one flat shard, in one pass (a CUB device
// reduction): the sum of squares in double, as the CPU's cpu::sum_of_squares, so the small terms
// of a large shard are not lost, and the count of inf / NaN elements, which the fp16 loss scaler
// and the divergence check act on. The result stays in device memory, for the all-reduce that
// carries it; the workspace is the caller's, allocated once outside the step.
// CUDA-side only: include it from .cu files and *_cuda.cc sources.
#pragma once

#ifndef ZEST_HAVE_CUDA
#error "kernels/norm_cuda.h is CUDA-side only; include it where ZEST_HAVE_CUDA is defined"
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace zest::cuda {

struct NormResult {
  double sum_of_squares = 0.0;  // of the finite and non-finite elements alike: inf or NaN if any
  std::uint64_t non_finite = 0;  // elements that are inf or NaN
};

// Device workspace bytes squared_norm() needs for `count` elements (CUB's temporary storage).
// Asks the current device; throws kDevice if CUDA fails.
std::size_t squared_norm_workspace_bytes(std::size_t count);

// Enqueues on `stream`: *result = {sum of data[i]^2, number of inf / NaN} over i < count.
// `data`, `result` and `workspace` are device pointers; `workspace_bytes` is at least
// squared_norm_workspace_bytes(count) (a kUsage Error otherwise). count 0 writes zeros.
void squared_norm(const float* data, std::size_t count, NormResult* result, void* workspace,
                  std::size_t workspace_bytes, cudaStream_t stream);

}  // namespace zest::cuda
