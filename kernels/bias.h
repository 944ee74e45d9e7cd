// A bias row added to every row of a [rows, cols] matrix, and its gradient: the column sums of
// the output gradient. Invariant: bias_grad ACCUMULATES (dbias += colsum(dy)), as every
// parameter gradient in zest does; add_bias adds to y in place.
#pragma once

#include <cstdint>

#include "runtime/stream.h"

namespace zest {

namespace cpu {

void add_bias(float* y, const float* bias, std::int64_t rows, std::int64_t cols);
void bias_grad(const float* dy, float* dbias, std::int64_t rows, std::int64_t cols);

}  // namespace cpu

void add_bias(Stream& stream, float* y, const float* bias, std::int64_t rows, std::int64_t cols);
void bias_grad(Stream& stream, const float* dy, float* dbias, std::int64_t rows, std::int64_t cols);

}  // namespace zest
