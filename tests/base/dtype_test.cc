// Conversions between fp32 and the 2-byte types: exhaustive round trips, and rounding checked
// against an independent reference that picks the nearest representable value by search.
#include "base/dtype.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

namespace zest {
namespace {

template <typename T>
void expect_every_value_round_trips() {
  for (std::uint32_t bits = 0; bits <= 0xffff; ++bits) {
    T value;
    value.bits = static_cast<std::uint16_t>(bits);
    const float wide = static_cast<float>(value);
    const T back(wide);
    if (std::isnan(wide)) {
      EXPECT_TRUE(std::isnan(static_cast<float>(back))) << bits;
    } else {
      EXPECT_EQ(back.bits, value.bits) << "bits " << bits;
    }
  }
}

TEST(BFloat16, EveryValueRoundTripsThroughFloat) { expect_every_value_round_trips<BFloat16>(); }
TEST(Float16, EveryValueRoundTripsThroughFloat) { expect_every_value_round_trips<Float16>(); }

// The reference: among all finite values of T, the nearest to x; on a tie, the one with an even
// last bit; beyond the largest finite value by half an ulp or more, infinity.
template <typename T>
class NearestReference {
 public:
  NearestReference() {
    for (std::uint32_t bits = 0; bits < 0x8000; ++bits) {
      T value;
      value.bits = static_cast<std::uint16_t>(bits);
      const double wide = static_cast<float>(value);
      if (std::isfinite(wide)) positives_.push_back({wide, value.bits});
    }
    std::sort(positives_.begin(), positives_.end());
  }

  std::uint16_t round(float x) const {
    const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
    const double magnitude = std::abs(static_cast<double>(x));
    const auto upper = std::lower_bound(positives_.begin(), positives_.end(),
                                        std::pair<double, std::uint16_t>{magnitude, 0});
    if (upper == positives_.end()) {
      // Past the largest finite value: round to it only within half an ulp.
      const auto& [largest, largest_bits] = positives_.back();
      const double ulp = largest - positives_[positives_.size() - 2].first;
      T infinity(INFINITY);
      return sign | (magnitude < largest + ulp / 2 ? largest_bits : infinity.bits);
    }
    if (upper->first == magnitude || upper == positives_.begin()) return sign | upper->second;
    const auto lower = upper - 1;
    const double below = magnitude - lower->first;
    const double above = upper->first - magnitude;
    if (below < above) return sign | lower->second;
    if (above < below) return sign | upper->second;
    return sign | ((lower->second & 1) == 0 ? lower->second : upper->second);
  }

 private:
  std::vector<std::pair<double, std::uint16_t>> positives_;
};

template <typename T>
void expect_rounding_matches_reference(float largest) {
  NearestReference<T> reference;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> exponent(-30.0f, std::log2(largest) + 0.5f);
  std::uniform_int_distribution<int> coin(0, 1);
  for (int i = 0; i < 200000; ++i) {
    float x = std::exp2(exponent(rng)) * (coin(rng) ? -1.0f : 1.0f);
    EXPECT_EQ(T(x).bits, reference.round(x)) << "x = " << x;
    if (::testing::Test::HasFailure()) return;
  }
  // Exact halfway points between neighbours round to the even one.
  for (std::uint16_t bits : {std::uint16_t{0x3c00}, std::uint16_t{0x3c01}, std::uint16_t{0x0001}}) {
    T low, high;
    low.bits = bits;
    high.bits = static_cast<std::uint16_t>(bits + 1);
    const float middle = static_cast<float>(
        (static_cast<double>(static_cast<float>(low)) + static_cast<float>(high)) / 2);
    EXPECT_EQ(T(middle).bits, (bits & 1) == 0 ? low.bits : high.bits);
  }
}

TEST(BFloat16, RoundsToNearestEven) { expect_rounding_matches_reference<BFloat16>(3.3e38f); }
TEST(Float16, RoundsToNearestEven) { expect_rounding_matches_reference<Float16>(65504.0f); }

TEST(Float16, KeepsInfinityAndNaN) {
  EXPECT_TRUE(std::isinf(static_cast<float>(Float16(INFINITY))));
  EXPECT_TRUE(std::isinf(static_cast<float>(Float16(70000.0f))));
  EXPECT_TRUE(std::isnan(static_cast<float>(Float16(NAN))));
  EXPECT_TRUE(std::isinf(static_cast<float>(BFloat16(-INFINITY))));
  EXPECT_TRUE(std::isnan(static_cast<float>(BFloat16(NAN))));
}

}  // namespace
}  // namespace zest
