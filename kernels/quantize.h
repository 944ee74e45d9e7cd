// Block-wise symmetric int8 quantization, the wire format of ZeRO++'s quantized collectives
// (qwZ's parameter gather, qgZ's gradient reduction; engine/quantized_collectives.h). `count`
// values are cut into blocks of `block` (the last one shorter); each block keeps one fp32 scale
// s = max|x| / 127 and the values q = round(x / s) in [-127, 127], so |x - q·s| <= s/2. Packed,
// the int8 values come first, padded to 4 bytes, then the scales: quantized_bytes() per run of
// values, always a multiple of 4, so packed runs placed end to end stay aligned.
// Policy, as the tests state it: a block of zeros has scale 0 and comes back as zeros; a block
// holding a NaN or an infinity has a NaN scale and comes back as NaN throughout (a non-finite
// value is never turned into a finite one, so overflow checks and the gradient norm still see
// it); a block whose scale would be below the smallest normal fp32 uses that instead.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/dtype.h"
#include "runtime/stream.h"

namespace zest {

// Bytes of `count` values quantized in blocks of `block`: the values padded to 4, then the scales.
std::size_t quantized_bytes(std::size_t count, std::size_t block);
// Where the scales start in a packed run of `count` values.
std::size_t quantized_scales_offset(std::size_t count);

// packed <- quantized `source` (fp32, bf16 or fp16).
void quantize_blocks(Stream& stream, const void* source, DType type, std::size_t count,
                     std::size_t block, void* packed);
// destination (fp32, bf16 or fp16) <- dequantized `packed`.
void dequantize_blocks(Stream& stream, const void* packed, std::size_t count, std::size_t block,
                       void* destination, DType type);
// destination[i] += dequantized[i], in fp32 (the accumulation of qgZ).
void dequantize_accumulate(Stream& stream, const void* packed, std::size_t count,
                           std::size_t block, float* destination);
// data[i] *= factor, fp32 (the mean of a quantized reduction).
void scale_values(Stream& stream, float* data, std::size_t count, float factor);

namespace cpu {
void quantize_blocks(const void* source, DType type, std::size_t count, std::size_t block,
                     void* packed);
void dequantize_blocks(const void* packed, std::size_t count, std::size_t block,
                       void* destination, DType type);
void dequantize_accumulate(const void* packed, std::size_t count, std::size_t block,
                           float* destination);
void scale_values(float* data, std::size_t count, float factor);
}  // namespace cpu

}  // namespace zest
