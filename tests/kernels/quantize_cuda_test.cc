// ctest-labels: gpu
// The CUDA int8 and int4 block quantization packs the same bytes as the CPU body for the same
// input (fp32 and bf16; a NaN block, a zero block, a short last block; at 4 bits an odd block, so
// that blocks share bytes), and its dequantize and dequantize-accumulate give the CPU's values bit
// for bit.
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

void expect_cuda_packs_the_cpus_bytes(std::size_t count, std::size_t block, int bits) {
  const std::vector<float> values = values_for_test(count);
  const std::size_t bytes = quantized_bytes(count, block, bits);
  std::vector<std::uint32_t> expected(bytes / 4);
  cpu::quantize_blocks(values.data(), DType::kFloat32, count, block, expected.data(), bits);
  testing::DeviceArray<float> source(values);
  testing::DeviceArray<std::uint32_t> packed(bytes / 4);
  cuda::quantize_blocks(source.data(), DType::kFloat32, count, block, packed.data(), nullptr,
                        bits);
  const std::vector<std::uint32_t> got = packed.download();
  ASSERT_EQ(got.size(), expected.size());
  const std::size_t value_words = quantized_scales_offset(count, bits) / 4;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const float* scale = reinterpret_cast<const float*>(&expected[i]);
    if (i >= value_words && std::isnan(*scale)) {
      EXPECT_TRUE(std::isnan(*reinterpret_cast<const float*>(&got[i]))) << i;
      continue;
    }
    ASSERT_EQ(got[i], expected[i]) << "word " << i;
  }

  std::vector<float> back(count), sum(count, 0.5f);
  cpu::dequantize_blocks(expected.data(), count, block, back.data(), DType::kFloat32, bits);
  cpu::dequantize_accumulate(expected.data(), count, block, sum.data(), bits);
  testing::DeviceArray<float> device_back(count);
  testing::DeviceArray<float> device_sum(std::vector<float>(count, 0.5f));
  cuda::dequantize_blocks(packed.data(), count, block, device_back.data(), DType::kFloat32,
                          nullptr, bits);
  cuda::dequantize_accumulate(packed.data(), count, block, device_sum.data(), nullptr, bits);
  const std::vector<float> got_back = device_back.download();
  const std::vector<float> got_sum = device_sum.download();
  for (std::size_t i = 0; i < count; ++i) {
    if (std::isnan(back[i])) {
      EXPECT_TRUE(std::isnan(got_back[i]) && std::isnan(got_sum[i])) << i;
      continue;
    }
    ASSERT_EQ(got_back[i], back[i]) << i;
    ASSERT_EQ(got_sum[i], sum[i]) << i;
  }
}

TEST(QuantizeCuda, PacksTheBytesTheCpuPacks) {
  ZEST_SKIP_WITHOUT_CUDA();
  expect_cuda_packs_the_cpus_bytes(1000, 256, 8);  // a short last block
}

TEST(QuantizeCuda, Int4PacksTheBytesTheCpuPacks) {
  ZEST_SKIP_WITHOUT_CUDA();
  expect_cuda_packs_the_cpus_bytes(1000, 256, 4);
  expect_cuda_packs_the_cpus_bytes(1001, 255, 4);  // odd blocks: bytes shared by two blocks
}

TEST(QuantizeCuda, ZeroCountLaunchesNothingAndOtherTypesAreRefused) {
  EXPECT_NO_THROW(cuda::quantize_blocks(nullptr, DType::kFloat32, 0, 256, nullptr, nullptr));
  EXPECT_THROW(cuda::quantize_blocks(nullptr, DType::kInt32, 0, 256, nullptr, nullptr), Error);
  EXPECT_THROW(cuda::quantize_blocks(nullptr, DType::kFloat32, 0, 256, nullptr, nullptr, 2), Error);
}

}  // namespace
}  // namespace zest
