// Block-wise int4 quantization (kernels/quantize.h, bits 4): each block's scale is max|x| / 7 and
// every value comes back within half a scale of the float64 reference; two values a byte, low
// nibble first, an odd count's last high nibble 0, a block starting inside a byte; zero blocks,
// NaN and infinity, a short last block, subnormals; the CPU body packs exactly the bytes of the
// reference written from the header's words; bits other than 4 and 8 are refused.
#include "kernels/quantize.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "base/error.h"
#include "runtime/cpu_device.h"

namespace zest {
namespace {

constexpr int kBits = 4;

std::vector<float> random_values(std::size_t count, std::uint32_t seed, float spread) {
  std::mt19937 generator(seed);
  std::normal_distribution<float> normal(0.0f, spread);
  std::vector<float> values(count);
  for (float& value : values) value = normal(generator);
  return values;
}

std::vector<std::uint8_t> quantize(const std::vector<float>& x, std::size_t block) {
  std::vector<std::uint8_t> packed(quantized_bytes(x.size(), block, kBits));
  cpu::quantize_blocks(x.data(), DType::kFloat32, x.size(), block, packed.data(), kBits);
  return packed;
}

std::vector<float> dequantize(const std::vector<std::uint8_t>& packed, std::size_t count,
                              std::size_t block) {
  std::vector<float> back(count);
  cpu::dequantize_blocks(packed.data(), count, block, back.data(), DType::kFloat32, kBits);
  return back;
}

float scale_at(const std::vector<std::uint8_t>& packed, std::size_t count, std::size_t b) {
  float scale;
  std::memcpy(&scale, packed.data() + quantized_scales_offset(count, kBits) + b * sizeof(float),
              sizeof(float));
  return scale;
}

// The header's words, written out independently: scale max|x| / 7 in fp32 (at least FLT_MIN),
// level = round-to-nearest-even(x * (1/scale)) clamped to [-7, 7], value i in byte i/2 (low nibble
// when i is even, 4-bit two's complement), values padded with zeros to 4 bytes, then the scales;
// a zero block has scale 0, a non-finite one a NaN scale, both levels 0.
std::vector<std::uint8_t> reference(const std::vector<float>& x, std::size_t block) {
  const std::size_t count = x.size();
  const std::size_t value_bytes = ((count + 1) / 2 + 3) / 4 * 4;
  const std::size_t blocks = (count + block - 1) / block;
  std::vector<std::uint8_t> packed(value_bytes + blocks * sizeof(float), 0);
  for (std::size_t b = 0; b < blocks; ++b) {
    const std::size_t first = b * block;
    const std::size_t last = std::min(count, first + block);
    float largest = 0.0f;
    bool finite = true;
    for (std::size_t i = first; i < last; ++i) {
      finite = finite && std::isfinite(x[i]);
      largest = std::max(largest, std::fabs(x[i]));
    }
    float scale = 0.0f;
    if (!finite) {
      scale = std::numeric_limits<float>::quiet_NaN();
    } else if (largest > 0.0f) {
      scale = std::max(largest / 7.0f, FLT_MIN);
      const float inverse = 1.0f / scale;
      for (std::size_t i = first; i < last; ++i) {
        const int level = static_cast<int>(std::clamp(std::nearbyint(x[i] * inverse), -7.0f, 7.0f));
        const unsigned nibble = static_cast<unsigned>(level) & 0xFu;
        packed[i / 2] =
            static_cast<std::uint8_t>(packed[i / 2] | (i % 2 == 0 ? nibble : nibble << 4));
      }
    }
    std::memcpy(packed.data() + value_bytes + b * sizeof(float), &scale, sizeof(float));
  }
  return packed;
}

// Every block: the scale is max|x| / 7 computed in float64 (to fp32 rounding), and every value is
// within s/2 of the float64 reference x. Tolerance: s/2 (the rounding to an integer step) plus
// 1e-5 s, which covers the fp32 product x * (1/s) feeding the rounding (two roundings of a number
// <= 7 in magnitude: < 2^-20 s) and the fp32 product q * s coming back (< 2^-24 |x|).
void expect_within_half_a_scale(const std::vector<float>& x, std::size_t block) {
  const std::size_t count = x.size();
  const std::vector<std::uint8_t> packed = quantize(x, block);
  const std::vector<float> back = dequantize(packed, count, block);
  for (std::size_t first = 0, b = 0; first < count; first += block, ++b) {
    double largest = 0.0;
    for (std::size_t i = first; i < std::min(count, first + block); ++i) {
      largest = std::max(largest, std::fabs(static_cast<double>(x[i])));
    }
    const double scale = largest / 7.0;
    const float stored = scale_at(packed, count, b);
    ASSERT_NEAR(stored, scale, scale * 1e-6) << "block " << b;
    for (std::size_t i = first; i < std::min(count, first + block); ++i) {
      const double error = std::fabs(static_cast<double>(x[i]) - static_cast<double>(back[i]));
      ASSERT_LE(error, stored * (0.5 + 1e-5)) << "element " << i << " of block " << b;
    }
  }
}

TEST(QuantizeInt4, EveryValueWithinHalfAScaleOfTheFloat64Reference) {
  for (std::size_t block : {1, 2, 3, 7, 64, 255, 256, 2048}) {
    expect_within_half_a_scale(random_values(5001, 11, 1.0f), block);
    expect_within_half_a_scale(random_values(4096, 12, 1e-6f), block);
    expect_within_half_a_scale(random_values(777, 13, 3e4f), block);
  }
}

TEST(QuantizeInt4, PackedLayoutIsTwoValuesAByteLowNibbleFirstPaddedToFour) {
  EXPECT_EQ(quantized_bytes(0, 256, kBits), 0u);
  EXPECT_EQ(quantized_bytes(1, 256, kBits), 4u + 4u);
  EXPECT_EQ(quantized_bytes(8, 256, kBits), 4u + 4u);
  EXPECT_EQ(quantized_bytes(9, 256, kBits), 8u + 4u);
  EXPECT_EQ(quantized_bytes(256, 256, kBits), 128u + 4u);
  EXPECT_EQ(quantized_bytes(257, 256, kBits), 132u + 8u);
  EXPECT_EQ(quantized_scales_offset(257, kBits), 132u);
  // Scale 7 / 7 = 1: the levels are the values rounded to nearest, ties to even (2.5 -> 2,
  // 3.5 -> 4, -0.5 -> 0); an odd count's last high nibble and the padding are 0 whatever was there.
  const std::vector<float> x = {7.0f, -7.0f, 1.0f, -1.0f, 3.5f, 2.5f, -0.5f};
  std::vector<std::uint8_t> packed(quantized_bytes(7, 8, kBits), 0xAB);
  cpu::quantize_blocks(x.data(), DType::kFloat32, 7, 8, packed.data(), kBits);
  EXPECT_EQ(packed[0], 0x97);  // 7 | -7 (0b1001) << 4
  EXPECT_EQ(packed[1], 0xF1);  // 1 | -1 (0b1111) << 4
  EXPECT_EQ(packed[2], 0x24);  // 4 | 2 << 4
  EXPECT_EQ(packed[3], 0x00);  // 0 | nothing
  EXPECT_EQ(scale_at(packed, 7, 0), 1.0f);
  std::vector<std::uint8_t> five(quantized_bytes(5, 8, kBits), 0xAB);
  cpu::quantize_blocks(x.data(), DType::kFloat32, 5, 8, five.data(), kBits);
  EXPECT_EQ(five[2], 0x04);  // 4 | nothing
  EXPECT_EQ(five[3], 0x00);  // padding
  const std::vector<float> back = dequantize(packed, 7, 8);
  EXPECT_EQ(back, (std::vector<float>{7.0f, -7.0f, 1.0f, -1.0f, 4.0f, 2.0f, 0.0f}));
}

TEST(QuantizeInt4, AnOddBlockStartsInsideAByteAndKeepsItsOwnScale) {
  // Blocks of 3: byte 1 holds value 2 (block 0, scale 3/7) and value 3 (block 1, scale 700/7).
  const std::vector<float> x = {1.0f, 2.0f, 3.0f, 700.0f, -100.0f, 50.0f, 0.25f};
  const std::vector<std::uint8_t> packed = quantize(x, 3);
  EXPECT_EQ(packed[1], 0x77);  // 7 (3 at scale 3/7) | 7 (700 at scale 100) << 4
  EXPECT_EQ(scale_at(packed, 7, 0), 3.0f / 7.0f);
  EXPECT_EQ(scale_at(packed, 7, 1), 700.0f / 7.0f);
  EXPECT_EQ(scale_at(packed, 7, 2), 0.25f / 7.0f);
  EXPECT_EQ(packed, reference(x, 3));
  expect_within_half_a_scale(x, 3);
}

TEST(QuantizeInt4, CpuPacksExactlyTheBytesOfTheDocumentedReference) {
  for (std::size_t count : {1, 2, 3, 255, 256, 257, 1000, 4097}) {
    for (std::size_t block : {1, 3, 8, 64, 255, 256}) {
      std::vector<float> x = random_values(count, static_cast<std::uint32_t>(count + block), 1.5f);
      if (count > 300) {
        std::fill(x.begin() + 64, x.begin() + 130, 0.0f);  // a zero block or part of one
        x[200] = std::numeric_limits<float>::infinity();
        x[count - 1] = std::numeric_limits<float>::quiet_NaN();
      }
      ASSERT_EQ(quantize(x, block), reference(x, block)) << count << " by " << block;
    }
  }
  // A bf16 source packs as its widened fp32 values do.
  const std::vector<float> wide = random_values(301, 41, 0.5f);
  std::vector<BFloat16> narrow;
  std::vector<float> widened;
  for (float v : wide) {
    narrow.emplace_back(v);
    widened.push_back(static_cast<float>(narrow.back()));
  }
  std::vector<std::uint8_t> from_narrow(quantized_bytes(301, 64, kBits));
  cpu::quantize_blocks(narrow.data(), DType::kBFloat16, 301, 64, from_narrow.data(), kBits);
  EXPECT_EQ(from_narrow, reference(widened, 64));
}

TEST(QuantizeInt4, DequantizeIsLevelTimesScaleAndAccumulateAddsItInFp32) {
  const std::vector<float> x = random_values(1001, 51, 1.0f);
  const std::vector<std::uint8_t> packed = quantize(x, 100);
  const std::vector<float> back = dequantize(packed, 1001, 100);
  std::vector<float> sum(1001, 0.25f);
  cpu::dequantize_accumulate(packed.data(), 1001, 100, sum.data(), kBits);
  std::vector<Float16> half(1001);
  cpu::dequantize_blocks(packed.data(), 1001, 100, half.data(), DType::kFloat16, kBits);
  for (std::size_t i = 0; i < 1001; ++i) {
    int level = (packed[i / 2] >> (4 * (i % 2))) & 0xF;
    if (level >= 8) level -= 16;
    ASSERT_GE(level, -7) << i;
    const float expected = static_cast<float>(level) * scale_at(packed, 1001, i / 100);
    ASSERT_EQ(back[i], expected) << i;
    ASSERT_EQ(sum[i], 0.25f + expected) << i;
    ASSERT_EQ(static_cast<float>(half[i]), static_cast<float>(Float16(expected))) << i;
  }
}

TEST(QuantizeInt4, CountsThatAreNotAMultipleOfTheBlockKeepAShortLastBlock) {
  for (std::size_t count : {1, 3, 255, 257, 1001}) {
    std::vector<float> x = random_values(count, 21, 2.0f);
    x.back() = 100.0f;  // the last block's own scale, not a neighbour's
    expect_within_half_a_scale(x, 256);
    const std::vector<std::uint8_t> packed = quantize(x, 256);
    EXPECT_FLOAT_EQ(scale_at(packed, count, (count - 1) / 256), 100.0f / 7.0f);
    EXPECT_EQ(dequantize(packed, count, 256).back(), 100.0f);
    EXPECT_EQ(packed.size() % 4, 0u);
  }
}

TEST(QuantizeInt4, ZeroBlockHasScaleZeroAndComesBackAsZeros) {
  std::vector<float> x(601, 0.0f);
  x[0] = -0.0f;
  x[600] = 3.0f;  // only the last block is non-zero
  const std::vector<std::uint8_t> packed = quantize(x, 256);
  EXPECT_EQ(scale_at(packed, 601, 0), 0.0f);
  EXPECT_EQ(scale_at(packed, 601, 1), 0.0f);
  std::vector<float> back(601, 9.0f);
  cpu::dequantize_blocks(packed.data(), 601, 256, back.data(), DType::kFloat32, kBits);
  for (std::size_t i = 0; i < 512; ++i) ASSERT_EQ(back[i], 0.0f) << i;
  EXPECT_EQ(back[600], 3.0f);
}

TEST(QuantizeInt4, NanOrInfinityMakesItsWholeBlockNanAndLeavesItsByteNeighbourAlone) {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    // Blocks of 5: block 1 is [5, 10); value 4 (block 0) and 5 share byte 2, 9 and 10 byte 5.
    std::vector<float> x = random_values(21, 31, 1.0f);
    x[7] = bad;
    const std::vector<std::uint8_t> packed = quantize(x, 5);
    EXPECT_TRUE(std::isnan(scale_at(packed, 21, 1)));
    const std::vector<float> back = dequantize(packed, 21, 5);
    for (std::size_t i = 5; i < 10; ++i) EXPECT_TRUE(std::isnan(back[i])) << i;
    for (std::size_t i : {0, 4, 10, 20}) EXPECT_TRUE(std::isfinite(back[i])) << i;
    const std::vector<float> first_block(x.begin(), x.begin() + 5);
    EXPECT_EQ(back[4], dequantize(quantize(first_block, 5), 5, 5)[4]);
    std::vector<float> sum(21, 1.0f);
    cpu::dequantize_accumulate(packed.data(), 21, 5, sum.data(), kBits);
    EXPECT_TRUE(std::isnan(sum[9]));
    EXPECT_TRUE(std::isfinite(sum[10]));
  }
}

TEST(QuantizeInt4, SubnormalBlockUsesTheSmallestNormalScale) {
  const float tiny = std::numeric_limits<float>::denorm_min();
  const std::vector<float> x = {tiny, -3 * tiny, 0.0f, FLT_MIN / 20};
  const std::vector<std::uint8_t> packed = quantize(x, 4);
  EXPECT_EQ(scale_at(packed, 4, 0), FLT_MIN);
  const std::vector<float> back = dequantize(packed, 4, 4);
  for (std::size_t i = 0; i < 4; ++i) EXPECT_LE(std::fabs(back[i] - x[i]), FLT_MIN / 2) << i;
}

TEST(QuantizeInt4, BitsOtherThanFourOrEightAreRefusedBeforeAnythingIsEnqueued) {
  std::vector<float> x(16, 1.0f);
  std::vector<std::uint8_t> packed(64);
  for (int bits : {0, 2, 5, 16}) {
    EXPECT_THROW(quantized_bytes(16, 8, bits), Error) << bits;
    EXPECT_THROW(quantized_scales_offset(16, bits), Error) << bits;
    EXPECT_THROW(cpu::quantize_blocks(x.data(), DType::kFloat32, 16, 8, packed.data(), bits),
                 Error);
    EXPECT_THROW(cpu::dequantize_blocks(packed.data(), 16, 8, x.data(), DType::kFloat32, bits),
                 Error);
    EXPECT_THROW(cpu::dequantize_accumulate(packed.data(), 16, 8, x.data(), bits), Error);
  }
  cpu::CpuDevice device(0);
  auto stream = device.create_stream("comm");
  try {
    quantize_blocks(*stream, x.data(), DType::kFloat32, 16, 8, packed.data(), 3);
    FAIL() << "bits 3 was accepted";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kUsage);
    EXPECT_NE(std::string(error.what()).find("bits must be 8 or 4, got 3"), std::string::npos)
        << error.what();
  }
  EXPECT_THROW(dequantize_accumulate(*stream, packed.data(), 16, 8, x.data(), 1), Error);
  EXPECT_THROW(quantized_bytes(16, 0, kBits), Error);
  stream->synchronize();  // nothing was enqueued to fail here
}

TEST(QuantizeInt4, OnAStreamIsTheBody) {
  cpu::CpuDevice device(0);
  auto stream = device.create_stream("comm");
  const std::vector<float> x = random_values(1001, 61, 1.0f);
  std::vector<std::uint8_t> queued(quantized_bytes(1001, 255, kBits));
  quantize_blocks(*stream, x.data(), DType::kFloat32, 1001, 255, queued.data(), kBits);
  std::vector<float> back(1001), sum(1001, 1.0f);
  dequantize_blocks(*stream, queued.data(), 1001, 255, back.data(), DType::kFloat32, kBits);
  dequantize_accumulate(*stream, queued.data(), 1001, 255, sum.data(), kBits);
  stream->synchronize();
  EXPECT_EQ(queued, quantize(x, 255));
  EXPECT_EQ(back, dequantize(queued, 1001, 255));
  for (std::size_t i = 0; i < 1001; ++i) ASSERT_EQ(sum[i], 1.0f + back[i]) << i;
}

}  // namespace
}  // namespace zest
