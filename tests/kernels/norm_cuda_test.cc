// ctest-labels: gpu
// The CUDA squared norm and non-finite count against a float64 host computation. Each square of
// an fp32 value is exact in double, so only the additions round: for n positive terms the
// relative error of any summation order is at most (n - 1) * 2^-53, about 1.2e-10 for 2^20
// terms. The host's sequential sum and the device's tree each lie that close to the exact sum,
// so they differ by at most twice that: the test allows 3e-10.
#include "kernels/norm_cuda.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "base/error.h"
#include "tests/support/cuda_test_support.h"

namespace zest {
namespace {

using testing::DeviceArray;

cuda::NormResult run_norm(const std::vector<float>& values) {
  DeviceArray<float> data(values);
  DeviceArray<cuda::NormResult> result(1);
  const std::size_t bytes = cuda::squared_norm_workspace_bytes(values.size());
  DeviceArray<unsigned char> workspace(bytes);
  cuda::squared_norm(data.data(), values.size(), result.data(), workspace.data(), bytes, nullptr);
  return result.download()[0];
}

TEST(NormCuda, SumOfSquaresMatchesFloat64) {
  ZEST_SKIP_WITHOUT_CUDA();
  const std::size_t n = (std::size_t{1} << 20) + 3;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(n);
  double expected = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    // Magnitudes from 1e-6 to 1e3: the small terms would vanish in an fp32 sum.
    values[i] = normal(rng) * (i % 3 == 0 ? 1e-6f : (i % 3 == 1 ? 1.0f : 1e3f));
    expected += static_cast<double>(values[i]) * values[i];
  }
  const cuda::NormResult got = run_norm(values);
  EXPECT_NEAR(got.sum_of_squares, expected, 3e-10 * expected);
  EXPECT_EQ(got.non_finite, 0u);
}

TEST(NormCuda, CountsInfAndNaN) {
  ZEST_SKIP_WITHOUT_CUDA();
  std::vector<float> values(5000, 0.5f);
  values[0] = std::numeric_limits<float>::infinity();
  values[1234] = -std::numeric_limits<float>::infinity();
  values[4999] = std::numeric_limits<float>::quiet_NaN();
  const cuda::NormResult got = run_norm(values);
  EXPECT_EQ(got.non_finite, 3u);
  EXPECT_FALSE(std::isfinite(got.sum_of_squares));
}

TEST(NormCuda, EmptyShardIsZero) {
  ZEST_SKIP_WITHOUT_CUDA();
  DeviceArray<cuda::NormResult> result(std::vector<cuda::NormResult>{{7.0, 7}});
  cuda::squared_norm(nullptr, 0, result.data(), nullptr, 0, nullptr);
  const cuda::NormResult got = result.download()[0];
  EXPECT_EQ(got.sum_of_squares, 0.0);
  EXPECT_EQ(got.non_finite, 0u);
}

TEST(NormCuda, TooSmallAWorkspaceIsRefused) {
  ZEST_SKIP_WITHOUT_CUDA();
  DeviceArray<float> data(std::vector<float>(1000, 1.0f));
  DeviceArray<cuda::NormResult> result(1);
  EXPECT_THROW(cuda::squared_norm(data.data(), 1000, result.data(), nullptr, 0, nullptr), Error);
}

}  // namespace
}  // namespace zest
