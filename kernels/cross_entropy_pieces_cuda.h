// CUDA bodies of kernels/cross_entropy_pieces.h: one block per row for a piece's running max,
// exp-sum (in double, as on the CPU) and target logit and for its d(logits); one block finishes
// the rows' log-sum-exp and the mean loss in a fixed order, so the loss is deterministic. As in
// kernels/cross_entropy_cuda.h, a kernel cannot throw: a target outside [0, classes) leaves its
// row's target logit NaN (the loss is NaN, which the engine's finite check sees) and its
// d(logits) without the target's term. CUDA-side only: include it from .cu files and *.cc
// sources under ZEST_HAVE_CUDA.
#pragma once

#ifndef ZEST_HAVE_CUDA
#error "kernels/cross_entropy_pieces_cuda.h is CUDA-side only; include it under ZEST_HAVE_CUDA"
#endif

#include <cuda_runtime.h>

#include <cstdint>

namespace zest::cuda {

// Device pointers; shapes are checked by the caller (kernels/cross_entropy_pieces.cc) except
// that rows must be below 2^31 (a grid dimension), a kUsage Error otherwise.
void cross_entropy_piece_forward(const float* piece, std::int64_t ld, const std::int32_t* targets,
                                 std::int64_t rows, std::int64_t begin, std::int64_t cols,
                                 std::int64_t classes, void* running, cudaStream_t stream);
void cross_entropy_pieces_finish(const void* running, std::int64_t rows, float* lse, float* loss,
                                 cudaStream_t stream);
void cross_entropy_piece_backward(const float* piece, std::int64_t ld,
                                  const std::int32_t* targets, std::int64_t rows,
                                  std::int64_t begin, std::int64_t cols, const float* lse,
                                  float scale, float* dpiece, std::int64_t ldd,
                                  cudaStream_t stream);

}  // namespace zest::cuda
