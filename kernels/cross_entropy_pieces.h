// Softmax cross-entropy over logits that exist a block of classes at a time (the GPT head's
// logits by vocabulary pieces, models/gpt_pieces.h): forward keeps per row a running max and
// exp-sum (the online softmax) and the target's logit, so the [rows, classes] logits are never
// whole; finishing writes each row's log-sum-exp and the mean loss; backward turns a piece's
// recomputed logits into its d(logits) = (exp(x - lse) - onehot(target)) * (scale / rows).
// A piece is columns [begin, begin + cols) of the classes, stored with leading dimension `ld`.
// Invariant: pieces are fed to forward in order of `begin`, the first at 0 (which resets the
// state); a target outside [0, classes) is a kData Error naming its row and value (CPU: raised
// by the first piece's body, on the stream; CUDA: the row's loss is NaN). The results are within
// fp32 rounding of kernels/cross_entropy.h's on the whole logits, not the same bits (the exp-sum
// is rescaled from piece to piece). Every CPU body gives the same bits.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu_body.h"
#include "runtime/stream.h"

namespace zest {

// Bytes of the running state for `rows` rows: a double exp-sum, a float max and a float target
// logit per row (8-byte aligned, as every allocation is).
inline std::size_t cross_entropy_running_bytes(std::int64_t rows) {
  return static_cast<std::size_t>(rows) * (sizeof(double) + 2 * sizeof(float));
}

namespace cpu {

void cross_entropy_piece_forward(CpuBody body, const float* piece, std::int64_t ld,
                                 const std::int32_t* targets, std::int64_t rows,
                                 std::int64_t begin, std::int64_t cols, std::int64_t classes,
                                 void* running);
void cross_entropy_pieces_finish(const void* running, std::int64_t rows, float* lse, float* loss);
void cross_entropy_piece_backward(CpuBody body, const float* piece, std::int64_t ld,
                                  const std::int32_t* targets, std::int64_t rows,
                                  std::int64_t begin, std::int64_t cols, const float* lse,
                                  float scale, float* dpiece, std::int64_t ldd);

}  // namespace cpu

// Each throws a kUsage Error, on the host, unless rows >= 1, 0 <= begin, cols >= 1,
// begin + cols <= classes and the leading dimensions are at least cols.
void cross_entropy_piece_forward(Stream& stream, const float* piece, std::int64_t ld,
                                 const std::int32_t* targets, std::int64_t rows,
                                 std::int64_t begin, std::int64_t cols, std::int64_t classes,
                                 void* running);
// lse[r] = max + log(exp-sum) (float [rows]); *loss = mean over rows of lse - target logit.
void cross_entropy_pieces_finish(Stream& stream, const void* running, std::int64_t rows,
                                 float* lse, float* loss);
// dpiece may be piece (in place, with the same leading dimension).
void cross_entropy_piece_backward(Stream& stream, const float* piece, std::int64_t ld,
                                  const std::int32_t* targets, std::int64_t rows,
                                  std::int64_t begin, std::int64_t cols, const float* lse,
                                  float scale, float* dpiece, std::int64_t ldd);

}  // namespace zest
