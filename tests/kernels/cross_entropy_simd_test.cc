// Every softmax cross-entropy body (portable, AVX2, AVX-512) against the portable body, bit for
// bit, and against float64: class counts below, at and past the vector widths and the 16 lanes,
// GPT-2's 50257, unaligned rows, in place; the same result on every run. A body this CPU or
// build cannot run is skipped, saying so.
#include "kernels/cross_entropy.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/cpu_body.h"

namespace zest {
namespace {

struct Problem {
  std::int64_t rows, classes;
  std::vector<float> logits;  // one spare element in front: rows start unaligned
  std::vector<std::int32_t> targets;

  Problem(std::int64_t r, std::int64_t c, std::uint32_t seed) : rows(r), classes(c) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 3.0f);
    logits.resize(static_cast<std::size_t>(r * c + 1));
    for (float& x : logits) x = normal(rng);
    for (std::int64_t i = 0; i < r; ++i) {
      targets.push_back(static_cast<std::int32_t>((i * 7919 + seed) % c));
    }
  }
  const float* data() const { return logits.data() + 1; }
};

double loss64(const Problem& p) {
  double total = 0.0;
  for (std::int64_t r = 0; r < p.rows; ++r) {
    const float* row = p.data() + r * p.classes;
    double max = row[0], sum = 0.0;
    for (std::int64_t j = 0; j < p.classes; ++j) max = std::max<double>(max, row[j]);
    for (std::int64_t j = 0; j < p.classes; ++j) sum += std::exp(double(row[j]) - max);
    total += std::log(sum) - (double(row[p.targets[r]]) - max);
  }
  return total / static_cast<double>(p.rows);
}

class CrossEntropyBody : public ::testing::TestWithParam<CpuBody> {
 protected:
  void SetUp() override {
    if (!cpu_body_supported(GetParam())) {
      GTEST_SKIP() << "this CPU or build cannot run the " << cpu_body_name(GetParam()) << " body";
    }
  }
};

constexpr std::int64_t kClasses[] = {1, 2, 7, 8, 9, 15, 16, 17, 31, 33, 256, 1000, 50257};

// Note: 0 ulps, as bits: lanes, exp and the order of every addition are the same in every body
// (kernels/cross_entropy_body.h).
TEST_P(CrossEntropyBody, SameBitsAsPortableForEveryClassCount) {
  for (std::int64_t classes : kClasses) {
    SCOPED_TRACE(classes);
    const std::int64_t rows = classes > 1000 ? 3 : 5;
    const Problem p(rows, classes, static_cast<std::uint32_t>(classes));
    float loss = 0.0f, want = 0.0f;
    cpu::cross_entropy_forward(GetParam(), p.data(), p.targets.data(), rows, classes, &loss);
    cpu::cross_entropy_forward(CpuBody::kPortable, p.data(), p.targets.data(), rows, classes,
                               &want);
    EXPECT_EQ(std::bit_cast<std::uint32_t>(loss), std::bit_cast<std::uint32_t>(want));
    std::vector<float> grad(rows * classes), grad_want(rows * classes);
    cpu::cross_entropy_backward(GetParam(), p.data(), p.targets.data(), rows, classes, 0.5f,
                                grad.data());
    cpu::cross_entropy_backward(CpuBody::kPortable, p.data(), p.targets.data(), rows, classes,
                                0.5f, grad_want.data());
    for (std::size_t i = 0; i < grad.size(); ++i) {
      ASSERT_EQ(std::bit_cast<std::uint32_t>(grad[i]), std::bit_cast<std::uint32_t>(grad_want[i]))
          << "element " << i << ": " << grad[i] << " vs portable " << grad_want[i];
    }
  }
}

TEST_P(CrossEntropyBody, LossMatchesFloat64AtEveryClassCount) {
  for (std::int64_t classes : kClasses) {
    SCOPED_TRACE(classes);
    const Problem p(4, classes, 3);
    float loss = 0.0f;
    cpu::cross_entropy_forward(GetParam(), p.data(), p.targets.data(), 4, classes, &loss);
    // exp to ~2 ulps per term, summed in double: the log of the sum is ~2.4e-7 off at most,
    // then one fp32 rounding of a loss below ~30.
    const double want = loss64(p);
    EXPECT_NEAR(loss, want, 3e-7 + 1.2e-7 * std::abs(want));
  }
}

TEST_P(CrossEntropyBody, InPlaceAndRepeatedRunsGiveTheSameBits) {
  const Problem p(3, 50257, 11);
  std::vector<float> out(3 * 50257), again(3 * 50257);
  std::vector<float> in_place(p.data(), p.data() + 3 * 50257);
  cpu::cross_entropy_backward(GetParam(), p.data(), p.targets.data(), 3, 50257, 1.0f, out.data());
  cpu::cross_entropy_backward(GetParam(), p.data(), p.targets.data(), 3, 50257, 1.0f,
                              again.data());
  cpu::cross_entropy_backward(GetParam(), in_place.data(), p.targets.data(), 3, 50257, 1.0f,
                              in_place.data());
  EXPECT_EQ(out, again);
  EXPECT_EQ(out, in_place);
}

INSTANTIATE_TEST_SUITE_P(AllBodies, CrossEntropyBody,
                         ::testing::Values(CpuBody::kPortable, CpuBody::kAvx2, CpuBody::kAvx512),
                         [](const auto& info) { return std::string(cpu_body_name(info.param)); });

}  // namespace
}  // namespace zest
