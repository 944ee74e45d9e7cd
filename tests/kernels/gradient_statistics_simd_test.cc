// Every body of the fp32 gradient statistics (portable, AVX2, AVX-512) against the portable body,
// as bits, for lengths around the lanes and unaligned starts, with values of very different
// magnitudes and with inf and NaN; and against a float64 sum. A body this CPU or build cannot run
// is skipped, saying so.
#include "kernels/gradient_statistics.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu_body.h"

namespace zest {
namespace {

class StatisticsBody : public ::testing::TestWithParam<CpuBody> {
 protected:
  void SetUp() override {
    if (!cpu_body_supported(GetParam())) {
      GTEST_SKIP() << "this CPU or build cannot run the " << cpu_body_name(GetParam()) << " body";
    }
  }
};

// Magnitudes from 1e-20 to 1e20: the double sum rounds, so a body adding in another order would
// differ in the last bits.
std::vector<float> make_values(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-20, 20);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng) * std::pow(10.0f, static_cast<float>(exponent(rng)));
  return v;
}

GradientStatistics run(CpuBody body, const float* values, std::size_t count) {
  GradientStatistics s;
  s.sum_of_squares = 0.5;  // accumulates onto what is there
  s.non_finite = 1;
  cpu::add_gradient_statistics(body, values, DType::kFloat32, count, &s);
  return s;
}

TEST_P(StatisticsBody, SameBitsAsPortableForEveryLengthAndOffset) {
  for (std::size_t n : {0, 1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 64, 1000, 4099}) {
    for (std::size_t offset : {0, 1, 3}) {
      SCOPED_TRACE(testing::Message() << "n " << n << " offset " << offset);
      const std::vector<float> v = make_values(n + offset, static_cast<std::uint32_t>(n + 7));
      const GradientStatistics got = run(GetParam(), v.data() + offset, n);
      const GradientStatistics want = run(CpuBody::kPortable, v.data() + offset, n);
      EXPECT_EQ(std::bit_cast<std::uint64_t>(got.sum_of_squares),
                std::bit_cast<std::uint64_t>(want.sum_of_squares))
          << got.sum_of_squares << " vs portable " << want.sum_of_squares;
      EXPECT_EQ(got.non_finite, want.non_finite);
    }
  }
}

TEST_P(StatisticsBody, InfAndNaNAreCountedAsThePortableBodyCountsThem) {
  std::vector<float> v = make_values(203, 5);
  v[3] = std::numeric_limits<float>::infinity();
  v[100] = std::numeric_limits<float>::quiet_NaN();
  v[202] = -std::numeric_limits<float>::infinity();  // in the tail past the last full vector
  const GradientStatistics got = run(GetParam(), v.data(), v.size());
  EXPECT_EQ(got.non_finite, 1u + 3u);
  EXPECT_FALSE(std::isfinite(got.sum_of_squares));
}

// The double lanes against one float64 sum of the same squares (exact in double): only the
// additions round, each by at most 2^-53 of the running sum, so 1e-13 relative has room.
TEST_P(StatisticsBody, MatchesFloat64) {
  const std::vector<float> v = make_values(100003, 9);
  double want = 0.5;
  for (float x : v) want += static_cast<double>(x) * x;
  const GradientStatistics got = run(GetParam(), v.data(), v.size());
  EXPECT_NEAR(got.sum_of_squares, want, 1e-13 * want);
}

INSTANTIATE_TEST_SUITE_P(AllBodies, StatisticsBody,
                         ::testing::Values(CpuBody::kPortable, CpuBody::kAvx2, CpuBody::kAvx512),
                         [](const ::testing::TestParamInfo<CpuBody>& info) {
                           return std::string(cpu_body_name(info.param));
                         });

}  // namespace
}  // namespace zest
