// Elementwise operations on flat fp32 buffers that the engine needs between collectives:
// accumulating a reduced gradient shard and the squared norm for clipping. Each is enqueued on
// the stream it is given.
#pragma once

#include <cstddef>

#include "runtime/stream.h"

namespace zest {

// destination[i] += source[i] for i < count.
void accumulate(Stream& stream, float* destination, const float* source, std::size_t count);

// *result += sum of data[i]^2 for i < count, summed in double so that the norm of a large shard
// does not lose the small terms.
void add_sum_of_squares(Stream& stream, const float* data, std::size_t count, double* result);

namespace cpu {
void accumulate(float* destination, const float* source, std::size_t count);
double sum_of_squares(const float* data, std::size_t count);
}  // namespace cpu

}  // namespace zest
