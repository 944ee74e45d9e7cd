// Fused softmax cross-entropy against float64: the mean loss, the gradient (softmax - onehot)
// * scale / rows, stability for large logits, and the kData error for a target out of range.
#include "kernels/cross_entropy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "base/error.h"
#include "runtime/cpu_device.h"
#include "tests/support/fake_cuda_stream.h"

namespace zest {
namespace {

using ::testing::HasSubstr;

struct Problem {
  std::int64_t rows, classes;
  std::vector<float> logits;
  std::vector<std::int32_t> targets;
};

Problem random_problem(std::int64_t rows, std::int64_t classes, float spread, float offset) {
  std::mt19937 rng(42);
  std::normal_distribution<float> normal(0.0f, spread);
  std::uniform_int_distribution<std::int32_t> label(0, static_cast<std::int32_t>(classes - 1));
  Problem p{rows, classes, std::vector<float>(rows * classes), std::vector<std::int32_t>(rows)};
  for (float& x : p.logits) x = offset + normal(rng);
  for (auto& t : p.targets) t = label(rng);
  return p;
}

// log-sum-exp and softmax of one row in float64, with the row max subtracted.
double row_lse(const Problem& p, std::int64_t r) {
  double max = -INFINITY, sum = 0.0;
  for (std::int64_t j = 0; j < p.classes; ++j)
    max = std::max(max, double{p.logits[r * p.classes + j]});
  for (std::int64_t j = 0; j < p.classes; ++j) sum += std::exp(p.logits[r * p.classes + j] - max);
  return max + std::log(sum);
}

double reference_loss(const Problem& p) {
  double total = 0.0;
  for (std::int64_t r = 0; r < p.rows; ++r) {
    total += row_lse(p, r) - p.logits[r * p.classes + p.targets[r]];
  }
  return total / static_cast<double>(p.rows);
}

std::vector<double> reference_grad(const Problem& p, double scale) {
  std::vector<double> grad(p.logits.size());
  for (std::int64_t r = 0; r < p.rows; ++r) {
    const double lse = row_lse(p, r);
    for (std::int64_t j = 0; j < p.classes; ++j) {
      const double softmax = std::exp(p.logits[r * p.classes + j] - lse);
      grad[r * p.classes + j] = (softmax - (j == p.targets[r] ? 1.0 : 0.0)) * scale / p.rows;
    }
  }
  return grad;
}

float forward(const Problem& p) {
  float loss = -1.0f;
  cpu::cross_entropy_forward(p.logits.data(), p.targets.data(), p.rows, p.classes, &loss);
  return loss;
}

std::vector<float> backward(const Problem& p, float scale) {
  std::vector<float> grad(p.logits.size(), 999.0f);  // written, not accumulated
  cpu::cross_entropy_backward(p.logits.data(), p.targets.data(), p.rows, p.classes, scale,
                              grad.data());
  return grad;
}

TEST(CrossEntropy, ForwardIsTheMeanLossOfFloat64Reference) {
  for (std::int64_t classes : {1, 2, 10, 1000}) {
    SCOPED_TRACE(classes);
    const Problem p = random_problem(17, classes, 3.0f, 0.0f);
    const double want = reference_loss(p);
    // fp32 exp/log per element and row; the sums are in double: 1e-6 relative (+1e-7 for a
    // loss of 0 with one class).
    EXPECT_NEAR(forward(p), want, 1e-6 * std::abs(want) + 1e-7);
  }
}

TEST(CrossEntropy, UniformLogitsGiveLogOfClassCount) {
  Problem p{4, 8, std::vector<float>(32, 0.3f), {0, 3, 7, 5}};
  EXPECT_NEAR(forward(p), std::log(8.0), 1e-6);
}

TEST(CrossEntropy, LargeLogitsStayFinite) {
  // exp(1e4) overflows float; the max subtraction keeps every term <= 1.
  const Problem p = random_problem(9, 50, 5.0f, 1e4f);
  const double want = reference_loss(p);
  const float got = forward(p);
  ASSERT_TRUE(std::isfinite(got));
  // Logits near 1e4 carry fp32 spacing 1e-3, so differences of logits are exact only to ~1e-3.
  EXPECT_NEAR(got, want, 2e-3);
  for (float g : backward(p, 1.0f)) ASSERT_TRUE(std::isfinite(g));
}

TEST(CrossEntropy, BackwardIsSoftmaxMinusOneHotTimesScaleOverRows) {
  const Problem p = random_problem(13, 37, 2.0f, 0.0f);
  for (float scale : {1.0f, 0.25f, 1024.0f}) {
    SCOPED_TRACE(scale);
    const std::vector<double> want = reference_grad(p, scale);
    const std::vector<float> got = backward(p, scale);
    for (std::size_t i = 0; i < got.size(); ++i) {
      // softmax in [0, 1] from fp32 exp: 1e-6 relative of the largest term (scale / rows).
      ASSERT_NEAR(got[i], want[i], 1e-6 * scale / p.rows) << "element " << i;
    }
  }
}

TEST(CrossEntropy, EveryGradientRowSumsToZero) {
  const Problem p = random_problem(8, 100, 2.0f, 0.0f);
  const std::vector<float> grad = backward(p, 1.0f);
  for (std::int64_t r = 0; r < p.rows; ++r) {
    double sum = 0.0;
    for (std::int64_t j = 0; j < p.classes; ++j) sum += grad[r * p.classes + j];
    // 100 fp32 terms of size <= 1/8: 100 * 6e-8 / 8 ~ 1e-6.
    EXPECT_NEAR(sum, 0.0, 2e-6) << "row " << r;
  }
}

TEST(CrossEntropy, BackwardInPlaceEqualsOutOfPlace) {
  Problem p = random_problem(6, 21, 2.0f, 0.0f);
  const std::vector<float> out_of_place = backward(p, 3.0f);
  cpu::cross_entropy_backward(p.logits.data(), p.targets.data(), p.rows, p.classes, 3.0f,
                              p.logits.data());
  EXPECT_EQ(p.logits, out_of_place);
}

TEST(CrossEntropy, TargetOutOfRangeIsADataErrorNamingRowAndValue) {
  for (std::int32_t bad : {-1, 5, 1000}) {
    Problem p = random_problem(4, 5, 1.0f, 0.0f);
    p.targets[2] = bad;
    for (int pass = 0; pass < 2; ++pass) {
      try {
        if (pass == 0) forward(p);
        if (pass == 1) backward(p, 1.0f);
        FAIL() << "expected an Error for target " << bad;
      } catch (const Error& error) {
        EXPECT_EQ(error.kind(), ErrorKind::kData);
        EXPECT_THAT(error.what(), HasSubstr("row 2"));
        EXPECT_THAT(error.what(), HasSubstr("is " + std::to_string(bad)));
        EXPECT_THAT(error.what(), HasSubstr("[0, 5)"));
      }
    }
  }
}

TEST(CrossEntropy, TargetErrorOnTheStreamReachesSynchronizeAsADataError) {
  Problem p = random_problem(3, 4, 1.0f, 0.0f);
  p.targets[1] = 4;
  cpu::CpuDevice device(0);
  auto stream = device.create_stream("compute");
  float loss = 0.0f;
  cross_entropy_forward(*stream, p.logits.data(), p.targets.data(), p.rows, p.classes, &loss);
  try {
    stream->synchronize();
    FAIL() << "expected an Error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kData);
    EXPECT_THAT(error.what(), HasSubstr("row 1"));
  }
}

TEST(CrossEntropy, EmptyShapeIsAUsageErrorOnTheHost) {
  cpu::CpuDevice device(0);
  auto stream = device.create_stream("compute");
  float x = 0.0f, loss = 0.0f;
  std::int32_t t = 0;
  try {
    cross_entropy_forward(*stream, &x, &t, 0, 3, &loss);
    FAIL() << "expected an Error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kUsage);
  }
}

TEST(CrossEntropy, DispatchRunsTheCpuBodiesOnTheStream) {
  const Problem p = random_problem(5, 9, 2.0f, 0.0f);
  cpu::CpuDevice device(0);
  auto stream = device.create_stream("compute");
  float loss = 0.0f;
  std::vector<float> grad(p.logits.size());
  cross_entropy_forward(*stream, p.logits.data(), p.targets.data(), p.rows, p.classes, &loss);
  cross_entropy_backward(*stream, p.logits.data(), p.targets.data(), p.rows, p.classes, 2.0f,
                         grad.data());
  stream->synchronize();
  EXPECT_EQ(loss, forward(p));
  EXPECT_EQ(grad, backward(p, 2.0f));
}

// A stream that only says CUDA is refused before anything is enqueued: in a CUDA build it is not
// a CudaStream to launch on, and a CPU-only build has no CUDA body.
TEST(CrossEntropy, AStreamThatIsNotARealCudaStreamIsRefused) {
  testing::FakeCudaStream stream;
  float x = 0.0f;
  std::int32_t t = 0;
  EXPECT_THROW(cross_entropy_forward(stream, &x, &t, 1, 1, &x), Error);
  EXPECT_THROW(cross_entropy_backward(stream, &x, &t, 1, 1, 1.0f, &x), Error);
  EXPECT_EQ(stream.enqueued, 0);
}

}  // namespace
}  // namespace zest
