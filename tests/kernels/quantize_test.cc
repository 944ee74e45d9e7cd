// Block-wise int8 quantization (kernels/quantize.h) against a float64 reference: each block's
// scale is max|x| / 127 and every value comes back within half a scale; zero blocks, NaN and
// infinity, subnormal blocks and counts that are not a multiple of the block; the packed layout;
// dequantize-accumulate; the bodies on a stream equal the direct calls.
#include "kernels/quantize.h"

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "base/dtype.h"
#include "base/error.h"
#include "runtime/cpu_device.h"

namespace zest {
namespace {

std::vector<float> random_values(std::size_t count, std::uint32_t seed, float spread) {
  std::mt19937 generator(seed);
  std::normal_distribution<float> normal(0.0f, spread);
  std::vector<float> values(count);
  for (float& value : values) value = normal(generator);
  return values;
}

const float* scales_of(const std::vector<char>& packed, std::size_t count) {
  return reinterpret_cast<const float*>(packed.data() + quantized_scales_offset(count));
}

// Every block: the scale is max|x| / 127 computed in float64 (to fp32 rounding), and every value
// is within s/2 of the float64 reference x. Tolerance: s/2 (the rounding to an integer step) plus
// 1e-5 s, which covers the fp32 product x * (1/s) feeding the rounding (two roundings of a
// number <= 127 in magnitude: < 2^-16 s) and the fp32 product q * s coming back (< 2^-24 |x|).
void expect_within_half_a_scale(const std::vector<float>& x, std::size_t block) {
  const std::size_t count = x.size();
  std::vector<char> packed(quantized_bytes(count, block));
  cpu::quantize_blocks(x.data(), DType::kFloat32, count, block, packed.data());
  std::vector<float> back(count);
  cpu::dequantize_blocks(packed.data(), count, block, back.data(), DType::kFloat32);
  const float* scales = scales_of(packed, count);
  for (std::size_t first = 0, b = 0; first < count; first += block, ++b) {
    double largest = 0.0;
    for (std::size_t i = first; i < std::min(count, first + block); ++i) {
      largest = std::max(largest, std::fabs(static_cast<double>(x[i])));
    }
    const double scale = largest / 127.0;
    ASSERT_NEAR(scales[b], scale, scale * 1e-6) << "block " << b;
    for (std::size_t i = first; i < std::min(count, first + block); ++i) {
      const double error = std::fabs(static_cast<double>(x[i]) - static_cast<double>(back[i]));
      ASSERT_LE(error, scales[b] * (0.5 + 1e-5)) << "element " << i << " of block " << b;
    }
  }
}

TEST(Quantize, EveryValueWithinHalfAScaleOfTheFloat64Reference) {
  for (std::size_t block : {1, 7, 64, 256, 2048}) {
    expect_within_half_a_scale(random_values(5000, 11, 1.0f), block);
    expect_within_half_a_scale(random_values(4096, 12, 1e-6f), block);
    expect_within_half_a_scale(random_values(777, 13, 3e4f), block);
  }
}

TEST(Quantize, CountsThatAreNotAMultipleOfTheBlockKeepAShortLastBlock) {
  for (std::size_t count : {1, 3, 255, 257, 1000}) {
    std::vector<float> x = random_values(count, 21, 2.0f);
    x.back() = 100.0f;  // the last block's own scale, not a neighbour's
    expect_within_half_a_scale(x, 256);
    std::vector<char> packed(quantized_bytes(count, 256));
    cpu::quantize_blocks(x.data(), DType::kFloat32, count, 256, packed.data());
    EXPECT_FLOAT_EQ(scales_of(packed, count)[(count - 1) / 256], 100.0f / 127.0f);
    EXPECT_EQ(packed.size() % 4, 0u);
  }
}

TEST(Quantize, PackedLayoutIsValuesPaddedToFourThenOneScalePerBlock) {
  EXPECT_EQ(quantized_bytes(0, 256), 0u);
  EXPECT_EQ(quantized_bytes(1, 256), 4u + 4u);
  EXPECT_EQ(quantized_bytes(256, 256), 256u + 4u);
  EXPECT_EQ(quantized_bytes(257, 256), 260u + 8u);
  EXPECT_EQ(quantized_scales_offset(257), 260u);
  // The padding is written (it travels on the wire): zeros, whatever was there.
  std::vector<char> packed(quantized_bytes(5, 4), 'x');
  const std::vector<float> x = {1, 2, 3, 4, 5};
  cpu::quantize_blocks(x.data(), DType::kFloat32, 5, 4, packed.data());
  for (std::size_t i = 5; i < 8; ++i) EXPECT_EQ(packed[i], 0) << i;
  EXPECT_EQ(static_cast<std::int8_t>(packed[3]), 127);  // 4 is its block's max
  EXPECT_EQ(static_cast<std::int8_t>(packed[4]), 127);  // 5 is alone in the last block
}

TEST(Quantize, ZeroBlockHasScaleZeroAndComesBackAsZeros) {
  std::vector<float> x(600, 0.0f);
  x[0] = -0.0f;
  x[599] = 3.0f;  // only the last block is non-zero
  std::vector<char> packed(quantized_bytes(600, 256));
  cpu::quantize_blocks(x.data(), DType::kFloat32, 600, 256, packed.data());
  EXPECT_EQ(scales_of(packed, 600)[0], 0.0f);
  EXPECT_EQ(scales_of(packed, 600)[1], 0.0f);
  std::vector<float> back(600, 9.0f);
  cpu::dequantize_blocks(packed.data(), 600, 256, back.data(), DType::kFloat32);
  for (std::size_t i = 0; i < 512; ++i) ASSERT_EQ(back[i], 0.0f) << i;
  EXPECT_EQ(back[599], 3.0f);
}

TEST(Quantize, NanOrInfinityMakesItsWholeBlockNanAndLeavesOtherBlocksAlone) {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    std::vector<float> x = random_values(40, 31, 1.0f);
    x[13] = bad;  // block 1 of [0,10), [10,20), ...
    std::vector<char> packed(quantized_bytes(40, 10));
    cpu::quantize_blocks(x.data(), DType::kFloat32, 40, 10, packed.data());
    EXPECT_TRUE(std::isnan(scales_of(packed, 40)[1]));
    std::vector<float> back(40);
    cpu::dequantize_blocks(packed.data(), 40, 10, back.data(), DType::kFloat32);
    for (std::size_t i = 10; i < 20; ++i) EXPECT_TRUE(std::isnan(back[i])) << i;
    for (std::size_t i : {0, 9, 20, 39}) EXPECT_TRUE(std::isfinite(back[i])) << i;
    std::vector<float> sum(40, 1.0f);
    cpu::dequantize_accumulate(packed.data(), 40, 10, sum.data());
    EXPECT_TRUE(std::isnan(sum[10]));
    EXPECT_TRUE(std::isfinite(sum[0]));
  }
}

TEST(Quantize, SubnormalBlockUsesTheSmallestNormalScale) {
  const float tiny = std::numeric_limits<float>::denorm_min();
  const std::vector<float> x = {tiny, -3 * tiny, 0.0f, FLT_MIN / 200};
  std::vector<char> packed(quantized_bytes(4, 4));
  cpu::quantize_blocks(x.data(), DType::kFloat32, 4, 4, packed.data());
  EXPECT_EQ(scales_of(packed, 4)[0], FLT_MIN);
  std::vector<float> back(4);
  cpu::dequantize_blocks(packed.data(), 4, 4, back.data(), DType::kFloat32);
  for (std::size_t i = 0; i < 4; ++i) EXPECT_LE(std::fabs(back[i] - x[i]), FLT_MIN / 2) << i;
}

TEST(Quantize, TwoByteSourcesAndDestinationsRoundTripThroughFp32) {
  const std::vector<float> wide = random_values(300, 41, 0.5f);
  std::vector<BFloat16> narrow;
  for (float v : wide) narrow.emplace_back(v);
  std::vector<char> from_narrow(quantized_bytes(300, 64)), from_wide(quantized_bytes(300, 64));
  std::vector<float> widened;
  for (BFloat16 v : narrow) widened.push_back(static_cast<float>(v));
  cpu::quantize_blocks(narrow.data(), DType::kBFloat16, 300, 64, from_narrow.data());
  cpu::quantize_blocks(widened.data(), DType::kFloat32, 300, 64, from_wide.data());
  EXPECT_EQ(from_narrow, from_wide);
  std::vector<Float16> half(300);
  std::vector<float> full(300);
  cpu::dequantize_blocks(from_wide.data(), 300, 64, half.data(), DType::kFloat16);
  cpu::dequantize_blocks(from_wide.data(), 300, 64, full.data(), DType::kFloat32);
  for (std::size_t i = 0; i < 300; ++i) {
    ASSERT_EQ(static_cast<float>(half[i]), static_cast<float>(Float16(full[i]))) << i;
  }
  EXPECT_THROW(cpu::quantize_blocks(wide.data(), DType::kInt32, 300, 64, from_wide.data()), Error);
  EXPECT_THROW(cpu::quantize_blocks(wide.data(), DType::kFloat32, 300, 0, from_wide.data()), Error);
}

TEST(Quantize, DequantizeAccumulateAddsTheDequantizedValuesInFp32) {
  const std::vector<float> x = random_values(1000, 51, 1.0f);
  std::vector<char> packed(quantized_bytes(1000, 128));
  cpu::quantize_blocks(x.data(), DType::kFloat32, 1000, 128, packed.data());
  std::vector<float> back(1000), sum(1000, 0.25f);
  cpu::dequantize_blocks(packed.data(), 1000, 128, back.data(), DType::kFloat32);
  cpu::dequantize_accumulate(packed.data(), 1000, 128, sum.data());
  for (std::size_t i = 0; i < 1000; ++i) ASSERT_EQ(sum[i], 0.25f + back[i]) << i;
}

TEST(Quantize, OnAStreamIsTheBody) {
  cpu::CpuDevice device(0);
  auto stream = device.create_stream("comm");
  const std::vector<float> x = random_values(1001, 61, 1.0f);
  std::vector<char> queued(quantized_bytes(1001, 256)), direct(queued.size());
  quantize_blocks(*stream, x.data(), DType::kFloat32, 1001, 256, queued.data());
  std::vector<float> back(1001), sum(1001, 1.0f);
  dequantize_blocks(*stream, queued.data(), 1001, 256, back.data(), DType::kFloat32);
  dequantize_accumulate(*stream, queued.data(), 1001, 256, sum.data());
  scale_values(*stream, sum.data(), 1001, 0.5f);
  stream->synchronize();
  cpu::quantize_blocks(x.data(), DType::kFloat32, 1001, 256, direct.data());
  EXPECT_EQ(queued, direct);
  for (std::size_t i = 0; i < 1001; ++i) ASSERT_EQ(sum[i], (1.0f + back[i]) * 0.5f) << i;
}

}  // namespace
}  // namespace zest
