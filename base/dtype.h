// Element types zest stores and moves. Compute on the CPU device is always fp32; 2-byte types
// are storage formats converted with round-to-nearest-even, the way CUDA's __float2bfloat16 does.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>

namespace zest {

// kInt8: the packed bytes of the quantized collectives (kernels/quantize.h); moved, never reduced.
enum class DType { kFloat32, kBFloat16, kFloat16, kFloat64, kInt32, kInt8 };

std::size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);
// Parses "fp32"/"float32", "bf16"/"bfloat16", "fp16"/"float16"; throws a kConfig Error otherwise.
DType parse_dtype(const std::string& name);

// bfloat16 as raw bits. Arithmetic is done in float; this type only stores.
struct BFloat16 {
  std::uint16_t bits = 0;

  BFloat16() = default;
  explicit BFloat16(float value) : bits(round_to_bits(value)) {}
  explicit operator float() const { return std::bit_cast<float>(std::uint32_t{bits} << 16); }

  // Round to nearest even on the 16 dropped bits; NaN stays a quiet NaN with its sign.
  static std::uint16_t round_to_bits(float value) {
    std::uint32_t word = std::bit_cast<std::uint32_t>(value);
    if ((word & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((word >> 16) | 0x40u);
    std::uint32_t rounding_bias = 0x7fffu + ((word >> 16) & 1u);
    return static_cast<std::uint16_t>((word + rounding_bias) >> 16);
  }
};

// IEEE half precision as raw bits, converted with round to nearest even; overflow goes to inf,
// NaN stays NaN, subnormals are kept. Arithmetic is done in float.
struct Float16 {
  std::uint16_t bits = 0;

  Float16() = default;
  explicit Float16(float value) : bits(round_to_bits(value)) {}
  explicit operator float() const { return to_float(bits); }

  static std::uint16_t round_to_bits(float value) {
    std::uint32_t word = std::bit_cast<std::uint32_t>(value);
    const std::uint32_t sign = word & 0x80000000u;
    word ^= sign;
    std::uint16_t half;
    if (word >= (127u + 16u) << 23) {  // at or beyond 65536: inf, or NaN
      half = word > 0x7f800000u ? 0x7e00 : 0x7c00;
    } else if (word < 113u << 23) {  // below the smallest normal half: subnormal or zero
      // Adding a magic float aligns the mantissa so the FPU's own rounding (nearest even) does it.
      const std::uint32_t magic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
      const float sum = std::bit_cast<float>(word) + std::bit_cast<float>(magic);
      half = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(sum) - magic);
    } else {
      const std::uint32_t odd = (word >> 13) & 1u;
      word += (static_cast<std::uint32_t>(15 - 127) << 23) + 0xfffu + odd;
      half = static_cast<std::uint16_t>(word >> 13);
    }
    return static_cast<std::uint16_t>(half | (sign >> 16));
  }

  static float to_float(std::uint16_t half) {
    const std::uint32_t exponent_mask = 0x7c00u << 13;
    std::uint32_t word = (half & 0x7fffu) << 13;
    const std::uint32_t exponent = word & exponent_mask;
    word += (127u - 15u) << 23;
    if (exponent == exponent_mask) {
      word += (128u - 16u) << 23;  // inf or NaN
    } else if (exponent == 0) {    // zero or subnormal: renormalize through the FPU
      word += 1u << 23;
      word = std::bit_cast<std::uint32_t>(std::bit_cast<float>(word) -
                                          std::bit_cast<float>(113u << 23));
    }
    return std::bit_cast<float>(word | (static_cast<std::uint32_t>(half & 0x8000u) << 16));
  }
};

}  // namespace zest
