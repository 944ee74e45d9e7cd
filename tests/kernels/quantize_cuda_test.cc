// ctest-labels: gpu
// The CUDA int8 block quantization packs the same bytes as the CPU body for the same input
// (fp32 and bf16; a NaN block, a zero block, a short last block), and its dequantize and
// dequantize-accumulate give the CPU's values bit for bit.
#include "kernels/quantize_cuda.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "base/error.h"
#include "kernels/quantize.h"
#include "tests/support/cuda_test_support.h"

namespace zest {
namespace {

std::vector<float> values_for_test(std::size_t count) {
  std::mt19937 generator(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(count);
  for (float& v : values) v = normal(generator);
  for (std::size_t i = 256; i < 512 && i < count; ++i) values[i] = 0.0f;  // a zero block
  if (count > 600) values[600] = std::numeric_limits<float>::quiet_NaN();
  return values;
}

TEST(QuantizeCuda, PacksTheBytesTheCpuPacks) {
  ZEST_SKIP_WITHOUT_CUDA();
  constexpr std::size_t kCount = 1000;  // a short last block
  constexpr std::size_t kBlock = 256;
  const std::vector<float> values = values_for_test(kCount);
  const std::size_t bytes = quantized_bytes(kCount, kBlock);
  std::vector<std::uint32_t> expected(bytes / 4);
  cpu::quantize_blocks(values.data(), DType::kFloat32, kCount, kBlock, expected.data());
  testing::DeviceArray<float> source(values);
  testing::DeviceArray<std::uint32_t> packed(bytes / 4);
  cuda::quantize_blocks(source.data(), DType::kFloat32, kCount, kBlock, packed.data(), nullptr);
  const std::vector<std::uint32_t> got = packed.download();
  ASSERT_EQ(got.size(), expected.size());
  const std::size_t value_words = quantized_scales_offset(kCount) / 4;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const float* scale = reinterpret_cast<const float*>(&expected[i]);
    if (i >= value_words && std::isnan(*scale)) {
      EXPECT_TRUE(std::isnan(*reinterpret_cast<const float*>(&got[i]))) << i;
      continue;
    }
    ASSERT_EQ(got[i], expected[i]) << "word " << i;
  }

  std::vector<float> back(kCount), sum(kCount, 0.5f);
  cpu::dequantize_blocks(expected.data(), kCount, kBlock, back.data(), DType::kFloat32);
  cpu::dequantize_accumulate(expected.data(), kCount, kBlock, sum.data());
  testing::DeviceArray<float> device_back(kCount);
  testing::DeviceArray<float> device_sum(std::vector<float>(kCount, 0.5f));
  cuda::dequantize_blocks(packed.data(), kCount, kBlock, device_back.data(), DType::kFloat32,
                          nullptr);
  cuda::dequantize_accumulate(packed.data(), kCount, kBlock, device_sum.data(), nullptr);
  const std::vector<float> got_back = device_back.download();
  const std::vector<float> got_sum = device_sum.download();
  for (std::size_t i = 0; i < kCount; ++i) {
    if (std::isnan(back[i])) {
      EXPECT_TRUE(std::isnan(got_back[i]) && std::isnan(got_sum[i])) << i;
      continue;
    }
    ASSERT_EQ(got_back[i], back[i]) << i;
    ASSERT_EQ(got_sum[i], sum[i]) << i;
  }
}

TEST(QuantizeCuda, ZeroCountLaunchesNothingAndOtherTypesAreRefused) {
  EXPECT_NO_THROW(cuda::quantize_blocks(nullptr, DType::kFloat32, 0, 256, nullptr, nullptr));
  EXPECT_THROW(cuda::quantize_blocks(nullptr, DType::kInt32, 0, 256, nullptr, nullptr), Error);
}

}  // namespace
}  // namespace zest
