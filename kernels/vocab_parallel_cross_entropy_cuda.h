// CUDA bodies of kernels/vocab_parallel_cross_entropy.h: one block per row for a rank's row maxima,
// its exp-sums (in double, as on the CPU) and target logits, and its d(logits); one block finishes
// the rows' log-sum-exp and the mean loss in a fixed order, so the loss is deterministic. As in
// kernels/cross_entropy_pieces_cuda.h, a kernel cannot throw: a target outside [0, classes) makes
// its row's target-logit partial NaN on every rank (so the group's sum, and the loss, are NaN,
// which the engine's finite check sees) and leaves the target's term out of its d(logits).
// CUDA-side only: include it from .cu files and *.cc sources under ZEST_HAVE_CUDA.
#pragma once

#ifndef ZEST_HAVE_CUDA
#error \
    "kernels/vocab_parallel_cross_entropy_cuda.h is CUDA-side only; include it under ZEST_HAVE_CUDA"
#endif

#include <cuda_runtime.h>

#include <cstdint>

namespace zest::cuda {

// Device pointers; shapes are checked by the caller (kernels/vocab_parallel_cross_entropy.cc)
// except that rows must be below 2^31 (a grid dimension), a kUsage Error otherwise.
void vocab_parallel_row_max(const float* logits, std::int64_t rows, std::int64_t cols,
                            float* max_out, cudaStream_t stream);
void vocab_parallel_partials(const float* logits, const std::int32_t* targets, std::int64_t rows,
                             std::int64_t cols, std::int64_t begin, std::int64_t classes,
                             const float* gathered_max, int group, float* max_out, float* partial,
                             cudaStream_t stream);
void vocab_parallel_finish(const float* max, const float* summed_partial, std::int64_t rows,
                           float* lse, float* loss, cudaStream_t stream);
void vocab_parallel_cross_entropy_backward(const float* logits, const std::int32_t* targets,
                                           std::int64_t rows, std::int64_t cols, std::int64_t begin,
                                           const float* lse, float scale, float* dlogits,
                                           cudaStream_t stream);

}  // namespace zest::cuda
