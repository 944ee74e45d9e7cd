// Every GELU body (portable, AVX2, AVX-512) against float64 and against the portable body: the
// same bits for every length, alignment and thread count, and on the special values; relative
// accuracy in the tails, where 0.5 x (1 + tanh u) in fp32 loses every digit (1 + tanh u rounds to
// 0 near x = -5) and the logistic form keeps them. A body this CPU or build cannot run is
// skipped, saying so.
#include "kernels/gelu.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <random>
#include <vector>

#include "kernels/cpu_body.h"
#include "kernels/kernel_threads.h"

namespace zest {
namespace {

double gelu64(double x) {
  const double c = std::sqrt(2.0 / std::numbers::pi);
  return 0.5 * x * (1.0 + std::tanh(c * (x + 0.044715 * x * x * x)));
}

// 1 + tanh(u) = 2 / (1 + exp(-2u)) in float64, exact in the far negative tail too.
double gelu64_tail(double x) {
  const double c = std::sqrt(2.0 / std::numbers::pi);
  return x / (1.0 + std::exp(-2.0 * c * (x + 0.044715 * x * x * x)));
}

double dgelu64(double x) {
  const double c = std::sqrt(2.0 / std::numbers::pi);
  const double u = c * (x + 0.044715 * x * x * x);
  const double s = 1.0 / (1.0 + std::exp(-2.0 * u));
  return s + x * c * (1.0 + 3.0 * 0.044715 * x * x) * 2.0 * s * (1.0 - s);
}

std::vector<float> random_points(std::size_t n, std::uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  return x;
}

class GeluBody : public ::testing::TestWithParam<CpuBody> {
 protected:
  void SetUp() override {
    if (!cpu_body_supported(GetParam())) {
      GTEST_SKIP() << "this CPU or build cannot run the " << cpu_body_name(GetParam()) << " body";
    }
  }
};

// Note: 0 ulps apart, as bits: every body performs the same fp32 operations in the same order
// (kernels/gelu_body.h), each correctly rounded, so nothing may differ, NaNs included.
void expect_same_bits(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    ASSERT_EQ(std::bit_cast<std::uint32_t>(a[i]), std::bit_cast<std::uint32_t>(b[i]))
        << what << "[" << i << "]: " << a[i] << " vs portable " << b[i];
  }
}

TEST_P(GeluBody, SameBitsAsPortableForEveryLengthAndOffset) {
  for (std::size_t n : {1, 7, 8, 9, 15, 16, 17, 33, 64, 65, 1000, 4099}) {
    for (std::size_t offset : {0, 1, 3}) {
      SCOPED_TRACE(testing::Message() << "n " << n << " offset " << offset);
      const std::vector<float> all = random_points(n + offset, static_cast<std::uint32_t>(n), 3);
      const std::vector<float> dy_all = random_points(n + offset, 7, 1);
      std::vector<float> y(n + offset), want(n + offset), dx(n + offset), dwant(n + offset);
      cpu::gelu_forward(GetParam(), all.data() + offset, y.data() + offset, n);
      cpu::gelu_forward(CpuBody::kPortable, all.data() + offset, want.data() + offset, n);
      expect_same_bits(y, want, "y");
      cpu::gelu_backward(GetParam(), all.data() + offset, dy_all.data() + offset,
                         dx.data() + offset, n);
      cpu::gelu_backward(CpuBody::kPortable, all.data() + offset, dy_all.data() + offset,
                         dwant.data() + offset, n);
      expect_same_bits(dx, dwant, "dx");
    }
  }
}

TEST_P(GeluBody, SpecialValuesMatchPortableAndStayFinite) {
  const float inf = std::numeric_limits<float>::infinity();
  const float big = std::numeric_limits<float>::max();
  std::vector<float> x = {0.0f, -0.0f, 1e-30f, -1e-30f, 1e-45f, 9.0f, -9.0f, 20.0f, -20.0f,
                          1e20f, -1e20f, big,   -big,   inf,    -inf,
                          std::numeric_limits<float>::quiet_NaN()};
  while (x.size() % 16 != 0 || x.size() < 32) x.push_back(-10.0f + 0.7f * x.size());
  const std::vector<float> dy(x.size(), 1.0f);
  std::vector<float> y(x.size()), want(x.size()), dx(x.size()), dwant(x.size());
  cpu::gelu_forward(GetParam(), x.data(), y.data(), x.size());
  cpu::gelu_forward(CpuBody::kPortable, x.data(), want.data(), x.size());
  cpu::gelu_backward(GetParam(), x.data(), dy.data(), dx.data(), x.size());
  cpu::gelu_backward(CpuBody::kPortable, x.data(), dy.data(), dwant.data(), x.size());
  expect_same_bits(y, want, "y");
  expect_same_bits(dx, dwant, "dx");
  EXPECT_TRUE(std::isnan(y[15]));  // NaN in, NaN out
  EXPECT_TRUE(std::isnan(dx[15]));
  EXPECT_TRUE(std::isnan(y[14]));  // -inf * 0, as PyTorch's 0.5 x (1 + tanh u) gives
  EXPECT_EQ(y[13], inf);           // gelu(+inf) = +inf, gelu'(+inf) = 1
  EXPECT_EQ(dx[13], 1.0f);
  EXPECT_EQ(dx[14], 0.0f);
  EXPECT_EQ(y[7], 20.0f);
  EXPECT_EQ(dx[7], 1.0f);
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_EQ(dx[0], 0.5f);
  // The negative tail underflows to (negative) zero: not NaN, not the clamp's quotient.
  for (std::size_t i : {8, 10, 12}) {
    EXPECT_LE(std::abs(y[i]), 1e-37f) << x[i];
    EXPECT_LE(std::abs(dx[i]), 1e-37f) << x[i];
  }
  for (std::size_t i = 0; i < 13; ++i) {
    EXPECT_TRUE(std::isfinite(y[i])) << x[i];
    EXPECT_TRUE(std::isfinite(dx[i])) << x[i];
  }
}

TEST_P(GeluBody, RelativelyAccurateAgainstFloat64EvenInTheTails) {
  // exp to ~2 ulps, then a few roundings (6 ulps of 6e-8 together); u itself carries up to ~4
  // ulps relative (x^3 and the sum), which exp(-2u) turns into 2|u| times that: at x = -9
  // (u = -32) about 1.5e-5 relative, shrinking toward 0.
  for (int i = -900; i <= 900; ++i) {
    const float x = static_cast<float>(i) * 0.01f + 0.0031f;
    float y = 0.0f, dx = 0.0f;
    const float one = 1.0f;
    cpu::gelu_forward(GetParam(), &x, &y, 1);
    cpu::gelu_backward(GetParam(), &x, &one, &dx, 1);
    const double want = gelu64_tail(x);
    const double u = std::abs(0.7978845608 * (x + 0.044715 * x * x * x));
    const double bound = 1.2e-7 * (6.0 + 4.0 * u);
    ASSERT_NEAR(y, want, bound * std::abs(want)) << "x = " << x;
    // gelu' crosses zero near x = -0.75: relative there, absolute 1e-7 of its range elsewhere.
    const double dwant = dgelu64(x);
    ASSERT_NEAR(dx, dwant, bound * std::abs(dwant) + 2e-7) << "x = " << x;
    // The two float64 forms agree where both are exact (a check of gelu64_tail).
    if (x > -3.0f) {
      ASSERT_NEAR(gelu64(x), want, 1e-15);
    }
  }
}

TEST_P(GeluBody, SameResultOnEveryRunAndThreadCount) {
  const std::size_t n = 3 * (std::size_t{1} << 16) + 5;  // long enough to split three ways
  const std::vector<float> x = random_points(n, 11, 2);
  const std::vector<float> dy = random_points(n, 12, 1);
  std::vector<float> y1(n), y3(n), dx1(n), dx3(n), again(n);
  cpu::gelu_forward(GetParam(), x.data(), y1.data(), n);
  cpu::gelu_forward(GetParam(), x.data(), again.data(), n);
  cpu::gelu_backward(GetParam(), x.data(), dy.data(), dx1.data(), n);
  set_kernel_threads(3);
  cpu::gelu_forward(GetParam(), x.data(), y3.data(), n);
  cpu::gelu_backward(GetParam(), x.data(), dy.data(), dx3.data(), n);
  set_kernel_threads(1);
  expect_same_bits(again, y1, "again");
  expect_same_bits(y3, y1, "y with 3 threads");
  expect_same_bits(dx3, dx1, "dx with 3 threads");
}

INSTANTIATE_TEST_SUITE_P(AllBodies, GeluBody,
                         ::testing::Values(CpuBody::kPortable, CpuBody::kAvx2, CpuBody::kAvx512),
                         [](const auto& info) { return std::string(cpu_body_name(info.param)); });

}  // namespace
}  // namespace zest
