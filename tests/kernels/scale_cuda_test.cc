// ctest-labels: gpu
// The CUDA in-place scale against the same fp32 multiply on the host, bit for bit (one rounding
// per element on both), including inf, NaN and subnormal inputs and a misaligned start. A NaN is
// held to be a NaN only: the GPU's multiply returns the canonical NaN (0x7fffffff) where x86
// keeps the operand's bits (0x7fc00000 here).
#include "kernels/scale_cuda.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "tests/support/cuda_test_support.h"

namespace zest {
namespace {

TEST(ScaleCuda, MatchesTheHostMultiplyBitForBit) {
  ZEST_SKIP_WITHOUT_CUDA();
  const std::size_t n = 1027;
  std::vector<float> values(n);
  for (std::size_t i = 0; i < n; ++i) values[i] = static_cast<float>(i) * 0.37f - 100.0f;
  values[3] = std::numeric_limits<float>::infinity();
  values[8] = std::numeric_limits<float>::quiet_NaN();
  values[13] = std::numeric_limits<float>::denorm_min();
  const float factor = 1.0f / 65536.0f;  // an fp16 loss scale's unscale
  for (std::size_t offset : {0, 1}) {
    testing::DeviceArray<float> data(values, offset);
    cuda::scale(data.data(), n, factor, nullptr);
    const std::vector<float> got = data.download();
    for (std::size_t i = 0; i < n; ++i) {
      if (std::isnan(values[i])) {
        ASSERT_TRUE(std::isnan(got[i])) << "at " << i << " (offset " << offset << ")";
        continue;
      }
      ASSERT_EQ(std::bit_cast<std::uint32_t>(got[i]),
                std::bit_cast<std::uint32_t>(values[i] * factor))
          << "at " << i << " (offset " << offset << ")";
    }
  }
}

TEST(ScaleCuda, ZeroCountLaunchesNothing) {
  EXPECT_NO_THROW(cuda::scale(nullptr, 0, 2.0f, nullptr));
}

}  // namespace
}  // namespace zest
