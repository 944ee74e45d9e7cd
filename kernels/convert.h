// Moving values between fp32 and the 2-byte storage types (bf16, fp16) with round to nearest
// even: the engine's bridge between fp32 master weights, 2-byte parameters and gradients, and
// the fp32 views units compute with. Same-type calls are plain copies / adds.
#pragma once

#include <cstddef>

#include "base/dtype.h"
#include "runtime/stream.h"

namespace zest {

// destination[i] = source[i], converting between any of fp32, bf16, fp16.
void convert(Stream& stream, const void* source, DType source_type, void* destination,
             DType destination_type, std::size_t count);

// destination[i] += source[i], computed in fp32 and stored in the destination's type.
void accumulate_into(Stream& stream, void* destination, DType destination_type,
                     const void* source, DType source_type, std::size_t count);

namespace cpu {
void convert(const void* source, DType source_type, void* destination, DType destination_type,
             std::size_t count);
void accumulate_into(void* destination, DType destination_type, const void* source,
                     DType source_type, std::size_t count);
// Sum of squares in double, and whether any value is inf or NaN, of data in any float type.
double sum_of_squares(const void* data, DType type, std::size_t count);
bool has_non_finite(const void* data, DType type, std::size_t count);
}  // namespace cpu

}  // namespace zest
