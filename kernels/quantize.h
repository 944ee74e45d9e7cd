// Block-wise symmetric quantization to int8 or int4, the wire format of ZeRO++'s quantized
// collectives (qwZ's parameter gather, qgZ's gradient reduction; engine/quantized_collectives.h).
// `count` values are cut into blocks of `block` (the last one shorter); each block keeps one fp32
// scale s = max|x| / L, L = 127 (bits 8) or 7 (bits 4), and the values q = round(x / s) in
// [-L, L] (to nearest, ties to even), so |x - q·s| <= s/2. Packed, the values come first -- one
// byte each at 8 bits; at 4 bits two a byte, value i in byte i/2, its low nibble when i is even,
// as a 4-bit two's complement, an odd count's last high nibble 0 -- padded to 4 bytes, then the
// scales: quantized_bytes() per run of values, always a multiple of 4, so packed runs placed end
// to end stay aligned. A block may start inside a byte (an odd block at 4 bits).
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

// `bits` is 8 or 4 everywhere below; any other value is a kUsage Error.
// Bytes of `count` values quantized in blocks of `block`: the values padded to 4, then the scales.
std::size_t quantized_bytes(std::size_t count, std::size_t block, int bits = 8);
// Where the scales start in a packed run of `count` values.
std::size_t quantized_scales_offset(std::size_t count, int bits = 8);

// packed <- quantized `source` (fp32, bf16 or fp16).
void quantize_blocks(Stream& stream, const void* source, DType type, std::size_t count,
                     std::size_t block, void* packed, int bits = 8);
// destination (fp32, bf16 or fp16) <- dequantized `packed`.
void dequantize_blocks(Stream& stream, const void* packed, std::size_t count, std::size_t block,
                       void* destination, DType type, int bits = 8);
// destination[i] += dequantized[i], in fp32 (the accumulation of qgZ).
void dequantize_accumulate(Stream& stream, const void* packed, std::size_t count,
                           std::size_t block, float* destination, int bits = 8);
// data[i] *= factor, fp32 (the mean of a quantized reduction).
void scale_values(Stream& stream, float* data, std::size_t count, float factor);

namespace cpu {
void quantize_blocks(const void* source, DType type, std::size_t count, std::size_t block,
                     void* packed, int bits = 8);
void dequantize_blocks(const void* packed, std::size_t count, std::size_t block,
                       void* destination, DType type, int bits = 8);
void dequantize_accumulate(const void* packed, std::size_t count, std::size_t block,
                           float* destination, int bits = 8);
void scale_values(float* data, std::size_t count, float factor);
}  // namespace cpu

}  // namespace zest
