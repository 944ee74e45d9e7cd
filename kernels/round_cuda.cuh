// Device-side rounding of fp32 to the 2-byte storage types, bit-identical to base/dtype.h's
// BFloat16::round_to_bits and Float16::round_to_bits (round to nearest even; NaN stays a quiet
// NaN with its sign, as 0x7e00 | sign in fp16; fp16 overflow goes to inf; subnormals kept), so a
// CPU run and a GPU run write the same 2-byte parameters. Not CUDA's __float2half_rn: its NaN is
// 0x7fff. For .cu files only.
#pragma once

#include <cstdint>

namespace zest::cuda {

__device__ __forceinline__ std::uint16_t round_to_bfloat16_bits(float value) {
  const std::uint32_t word = __float_as_uint(value);
  if ((word & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((word >> 16) | 0x40u);
  const std::uint32_t rounding_bias = 0x7fffu + ((word >> 16) & 1u);
  return static_cast<std::uint16_t>((word + rounding_bias) >> 16);
}

__device__ __forceinline__ std::uint16_t round_to_float16_bits(float value) {
  std::uint32_t word = __float_as_uint(value);
  const std::uint32_t sign = word & 0x80000000u;
  word ^= sign;
  std::uint16_t half;
  if (word >= (127u + 16u) << 23) {  // at or beyond 65536: inf, or NaN
    half = word > 0x7f800000u ? 0x7e00 : 0x7c00;
  } else if (word < 113u << 23) {  // below the smallest normal half: subnormal or zero
    // The magic add aligns the mantissa so the FPU's own rounding (nearest even) does it; __fadd_rn
    // keeps the compiler from folding it into anything else.
    const std::uint32_t magic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
    const float sum = __fadd_rn(__uint_as_float(word), __uint_as_float(magic));
    half = static_cast<std::uint16_t>(__float_as_uint(sum) - magic);
  } else {
    const std::uint32_t odd = (word >> 13) & 1u;
    word += (static_cast<std::uint32_t>(15 - 127) << 23) + 0xfffu + odd;
    half = static_cast<std::uint16_t>(word >> 13);
  }
  return static_cast<std::uint16_t>(half | (sign >> 16));
}

// Float16::to_float, exactly (every fp16 value is an fp32 value).
__device__ __forceinline__ float float16_bits_to_float(std::uint16_t half) {
  const std::uint32_t exponent_mask = 0x7c00u << 13;
  std::uint32_t word = (half & 0x7fffu) << 13;
  const std::uint32_t exponent = word & exponent_mask;
  word += (127u - 15u) << 23;
  if (exponent == exponent_mask) {
    word += (128u - 16u) << 23;  // inf or NaN
  } else if (exponent == 0) {    // zero or subnormal: renormalize through the FPU
    word += 1u << 23;
    word = __float_as_uint(__fsub_rn(__uint_as_float(word), __uint_as_float(113u << 23)));
  }
  return __uint_as_float(word | (static_cast<std::uint32_t>(half & 0x8000u) << 16));
}

}  // namespace zest::cuda
