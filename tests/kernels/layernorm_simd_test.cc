// Every LayerNorm body (portable, AVX2, AVX-512) against the portable body, as bits: forward's y,
// mean and rstd, backward's dx, dweight and dbias (accumulated onto nonzero values), for row
// widths around every vector width and the GPT's, unaligned rows, rows far from zero mean and of
// tiny spread; and each body against float64. A body this CPU or build cannot run is skipped,
// saying so.
#include "kernels/layernorm.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/cpu_body.h"

namespace zest {
namespace {

class LayerNormBody : public ::testing::TestWithParam<CpuBody> {
 protected:
  void SetUp() override {
    if (!cpu_body_supported(GetParam())) {
      GTEST_SKIP() << "this CPU or build cannot run the " << cpu_body_name(GetParam()) << " body";
    }
  }
};

struct Case {
  std::vector<float> x, weight, bias, dy;
};

// Row r has mean offset 1000 when r % 3 == 1 and spread 0.001 when r % 3 == 2.
Case make_case(std::int64_t rows, std::int64_t cols, std::int64_t offset, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Case c;
  const std::size_t n = static_cast<std::size_t>(rows * cols + offset);
  c.x.resize(n);
  c.dy.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t r = static_cast<std::int64_t>(i) / cols;
    const float spread = r % 3 == 2 ? 0.001f : 1.0f, shift = r % 3 == 1 ? 1000.0f : 0.0f;
    c.x[i] = shift + spread * normal(rng);
    c.dy[i] = normal(rng);
  }
  for (std::int64_t j = 0; j < cols + offset; ++j) {
    c.weight.push_back(1.0f + 0.3f * normal(rng));
    c.bias.push_back(0.2f * normal(rng));
  }
  return c;
}

// Note: 0 ulps apart: every body performs the same operations in the same order, each correctly
// rounded (kernels/layernorm_body.h).
void expect_same_bits(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(std::bit_cast<std::uint32_t>(a[i]), std::bit_cast<std::uint32_t>(b[i]))
        << what << "[" << i << "]: " << a[i] << " vs portable " << b[i];
  }
}

struct Outputs {
  std::vector<float> y, mean, rstd, dx, dweight, dbias;
};

Outputs run(CpuBody body, const Case& c, std::int64_t rows, std::int64_t cols,
            std::int64_t offset) {
  Outputs o;
  o.y.assign(c.x.size(), 0.0f);
  o.mean.assign(static_cast<std::size_t>(rows), 0.0f);
  o.rstd.assign(static_cast<std::size_t>(rows), 0.0f);
  // Nonzero starting values: backward accumulates.
  o.dx.assign(c.x.size(), 0.25f);
  o.dweight.assign(c.weight.size(), -0.5f);
  o.dbias.assign(c.weight.size(), 0.125f);
  cpu::layernorm_forward(body, c.x.data() + offset, c.weight.data() + offset,
                         c.bias.data() + offset, rows, cols, kLayerNormEps, o.y.data() + offset,
                         o.mean.data(), o.rstd.data());
  cpu::layernorm_backward(body, c.dy.data() + offset, c.x.data() + offset,
                          c.weight.data() + offset, o.mean.data(), o.rstd.data(), rows, cols,
                          o.dx.data() + offset, o.dweight.data() + offset,
                          o.dbias.data() + offset);
  return o;
}

TEST_P(LayerNormBody, SameBitsAsPortableForEveryWidthAndOffset) {
  for (std::int64_t cols : {1, 3, 7, 8, 9, 15, 16, 17, 24, 31, 33, 48, 64, 192, 255, 256, 257,
                            1000, 1031}) {
    for (std::int64_t offset : {0, 1, 5}) {
      SCOPED_TRACE(testing::Message() << "cols " << cols << " offset " << offset);
      const std::int64_t rows = 7;
      const Case c = make_case(rows, cols, offset, static_cast<std::uint32_t>(cols + offset));
      const Outputs got = run(GetParam(), c, rows, cols, offset);
      const Outputs want = run(CpuBody::kPortable, c, rows, cols, offset);
      expect_same_bits(got.y, want.y, "y");
      expect_same_bits(got.mean, want.mean, "mean");
      expect_same_bits(got.rstd, want.rstd, "rstd");
      expect_same_bits(got.dx, want.dx, "dx");
      expect_same_bits(got.dweight, want.dweight, "dweight");
      expect_same_bits(got.dbias, want.dbias, "dbias");
    }
  }
}

// The forward against float64 (the test of layernorm_test.cc, per body): normalized in double,
// so only the last fp32 multiply and add round, a few 1e-7 of |y| <= 5, in the rows at mean 1000
// and of rstd 1000 too.
TEST_P(LayerNormBody, ForwardMatchesFloat64) {
  constexpr std::int64_t rows = 6, cols = 257;
  const Case c = make_case(rows, cols, 0, 11);
  const Outputs o = run(GetParam(), c, rows, cols, 0);
  for (std::int64_t r = 0; r < rows; ++r) {
    double m = 0.0, v = 0.0;
    for (std::int64_t j = 0; j < cols; ++j) m += static_cast<double>(c.x[r * cols + j]) / cols;
    for (std::int64_t j = 0; j < cols; ++j) v += std::pow(c.x[r * cols + j] - m, 2) / cols;
    const double s = 1.0 / std::sqrt(v + 1e-5);
    ASSERT_NEAR(o.rstd[r], s, 1e-6 * s) << r;
    for (std::int64_t j = 0; j < cols; ++j) {
      const double want = (c.x[r * cols + j] - m) * s * c.weight[j] + c.bias[j];
      ASSERT_NEAR(o.y[r * cols + j], want, 4e-6) << r << ", " << j;
    }
  }
}

TEST_P(LayerNormBody, SameResultOnEveryRun) {
  constexpr std::int64_t rows = 5, cols = 256;
  const Case c = make_case(rows, cols, 0, 3);
  const Outputs a = run(GetParam(), c, rows, cols, 0), b = run(GetParam(), c, rows, cols, 0);
  expect_same_bits(a.y, b.y, "y");
  expect_same_bits(a.dx, b.dx, "dx");
  expect_same_bits(a.dweight, b.dweight, "dweight");
}

INSTANTIATE_TEST_SUITE_P(AllBodies, LayerNormBody,
                         ::testing::Values(CpuBody::kPortable, CpuBody::kAvx2, CpuBody::kAvx512),
                         [](const ::testing::TestParamInfo<CpuBody>& info) {
                           return std::string(cpu_body_name(info.param));
                         });

}  // namespace
}  // namespace zest
