// Element types zest stores and moves. Compute on the CPU device is always fp32; 2-byte types
// are storage formats converted with round-to-nearest-even, the way CUDA's __float2bfloat16 does.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>

namespace zest {

enum class DType { kFloat32, kBFloat16, kFloat16, kFloat64, kInt32 };

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

}  // namespace zest
