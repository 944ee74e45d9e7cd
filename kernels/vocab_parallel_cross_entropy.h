// Softmax cross-entropy over logits whose classes are split across the ranks of a tensor-parallel
// group (models/tensor_parallel_gpt.h): each rank holds columns [begin, begin + cols) of the
// [rows, classes] logits, never the whole. The caller runs the group's collectives between the
// steps: (1) row_max of its columns, all-gathered; (2) partials: the global max from the gathered
// maxima, then this rank's exp-sum and (where the target is its column) the target logit,
// all-reduced (sum); (3) finish: lse = max + log(exp-sum) and the mean loss; backward:
// d(logits) = (exp(x - lse) - onehot(target)) * (scale / rows) on the rank's columns.
// Invariant: on the CPU a target outside [0, classes) is a kData Error naming its row and value,
// raised by partials' body on the stream; on CUDA (kernels/vocab_parallel_cross_entropy_cuda.h),
// which cannot throw, it makes the loss NaN. The cpu:: bodies are the stream-free halves.
#pragma once

#include <cstdint>

#include "runtime/stream.h"

namespace zest {

// max_out[r] = the largest of row r's `cols` logits (leading dimension cols).
void vocab_parallel_row_max(Stream& stream, const float* logits, std::int64_t rows,
                            std::int64_t cols, float* max_out);

// `gathered_max` [group, rows]: every rank's row maxima. Writes max_out [rows] (their largest),
// and partial [2, rows]: this rank's sum of exp(x - max) per row, then the target's logit where
// the target is in [begin, begin + cols), else 0.
void vocab_parallel_partials(Stream& stream, const float* logits, const std::int32_t* targets,
                             std::int64_t rows, std::int64_t cols, std::int64_t begin,
                             std::int64_t classes, const float* gathered_max, int group,
                             float* max_out, float* partial);

// From max [rows] and the summed partial [2, rows]: lse [rows], and *loss = mean(lse - target).
void vocab_parallel_finish(Stream& stream, const float* max, const float* summed_partial,
                           std::int64_t rows, float* lse, float* loss);

// dlogits (may alias logits) = (exp(x - lse) - onehot(target)) * (scale / rows).
void vocab_parallel_cross_entropy_backward(Stream& stream, const float* logits,
                                           const std::int32_t* targets, std::int64_t rows,
                                           std::int64_t cols, std::int64_t begin,
                                           const float* lse, float scale, float* dlogits);

namespace cpu {

void vocab_parallel_row_max(const float* logits, std::int64_t rows, std::int64_t cols,
                            float* max_out);
void vocab_parallel_partials(const float* logits, const std::int32_t* targets, std::int64_t rows,
                             std::int64_t cols, std::int64_t begin, std::int64_t classes,
                             const float* gathered_max, int group, float* max_out, float* partial);
void vocab_parallel_finish(const float* max, const float* summed_partial, std::int64_t rows,
                           float* lse, float* loss);
void vocab_parallel_cross_entropy_backward(const float* logits, const std::int32_t* targets,
                                           std::int64_t rows, std::int64_t cols, std::int64_t begin,
                                           const float* lse, float scale, float* dlogits);

}  // namespace cpu

}  // namespace zest
