// The row softmax attention uses, by every body (portable, AVX2, AVX-512): the same bits as the
// portable body for every length, in place too, and each element within a few ulps of float64.
// A body this CPU or build cannot run is skipped, saying so.
#include "kernels/softmax_row.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace zest {
namespace {

std::vector<float> random_row(std::int64_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  std::vector<float> row(static_cast<std::size_t>(n));
  for (float& x : row) x = normal(rng);
  return row;
}

class SoftmaxRowBody : public ::testing::TestWithParam<CpuBody> {
 protected:
  void SetUp() override {
    if (!cpu_body_supported(GetParam())) {
      GTEST_SKIP() << "this CPU or build cannot run the " << cpu_body_name(GetParam()) << " body";
    }
  }
};

TEST_P(SoftmaxRowBody, SameBitsAsPortableAndCloseToFloat64) {
  for (std::int64_t n : {1, 2, 7, 8, 9, 16, 17, 31, 64, 127, 128, 1000}) {
    SCOPED_TRACE(n);
    const std::vector<float> row = random_row(n, static_cast<std::uint32_t>(n));
    std::vector<float> out(row.size()), want(row.size()), in_place = row;
    cpu::softmax_row(GetParam(), row.data(), n, out.data());
    cpu::softmax_row(CpuBody::kPortable, row.data(), n, want.data());
    cpu::softmax_row(GetParam(), in_place.data(), n, in_place.data());
    EXPECT_EQ(out, want);
    EXPECT_EQ(in_place, want);
    double max = row[0], sum = 0.0;
    for (float x : row) max = std::max<double>(max, x);
    for (float x : row) sum += std::exp(double(x) - max);
    for (std::int64_t j = 0; j < n; ++j) {
      const double p = std::exp(double(row[j]) - max) / sum;
      // exp to ~2 ulps, the reciprocal and two multiplies: 6 ulps (of 6e-8) relative; x - max
      // rounds to half an ulp of itself, which exp turns into |x - max| ulps relative; plus the
      // flush to 0 of terms below exp(-87.7).
      const double shift = std::abs(double(row[j]) - max);
      ASSERT_NEAR(out[j], p, 6e-8 * (6.0 + shift) * p + 1e-37) << "element " << j;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllBodies, SoftmaxRowBody,
                         ::testing::Values(CpuBody::kPortable, CpuBody::kAvx2, CpuBody::kAvx512),
                         [](const auto& info) { return std::string(cpu_body_name(info.param)); });

}  // namespace
}  // namespace zest
