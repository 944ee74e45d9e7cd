// ctest-labels: gpu
// The CUDA GELU against the CPU body on the same inputs, x in [-8, 8] and random. The CUDA body
// is the tanh form with CUDA's tanhf (within 2 ulps); the CPU body is the logistic form with its
// own exp (kernels/gelu.cc), so their results differ as two accurate evaluations of the same
// function do: by about the error d of tanh, d <= 5e-7 absolute. Forward: 0.5 x d, so |error| <=
// 5e-7 max(1, |x|). Backward: d reaches dt through 1 - t^2 (about 2 d) times sqrt(2/pi)(1 +
// 0.134 x^2), then 0.5 x dt, so |error| <= 5e-7 (1 + |x| (1 + 0.14 x^2)) |dy|, plus an ulp of
// the result. Emulated on the host (glibc's tanhf for CUDA's, the CPU body's operations
// verbatim) on these inputs, the largest error is a quarter of the bound in both directions.
#include "kernels/gelu_cuda.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/gelu.h"
#include "tests/support/cuda_test_support.h"

namespace zest {
namespace {

using testing::DeviceArray;

std::vector<float> inputs() {
  std::vector<float> x = testing::random_floats(3001, 1, 2.0f);
  for (int i = 0; i <= 1600; ++i) x.push_back(-8.0f + 0.01f * static_cast<float>(i));
  return x;
}

TEST(GeluCuda, ForwardMatchesTheCpuBody) {
  ZEST_SKIP_WITHOUT_CUDA();
  const auto x = inputs();
  std::vector<float> want(x.size());
  cpu::gelu_forward(x.data(), want.data(), x.size());
  DeviceArray<float> dx(x), dy(x.size());
  cuda::gelu_forward(dx.data(), dy.data(), x.size(), nullptr);
  testing::expect_within(
      dy.download(), want,
      [&](std::size_t i) {
        return 5e-7 * std::fmax(1.0, std::fabs(x[i])) + std::fabs(want[i]) * 1.2e-7;
      },
      "y");
  cuda::gelu_forward(dx.data(), dx.data(), x.size(), nullptr);  // in place
  testing::expect_bit_identical(dx.download(), dy.download(), "in place");
}

TEST(GeluCuda, BackwardMatchesTheCpuBodyInPlace) {
  ZEST_SKIP_WITHOUT_CUDA();
  const auto x = inputs();
  const auto dy = testing::random_floats(x.size(), 2);
  std::vector<float> want(x.size());
  cpu::gelu_backward(x.data(), dy.data(), want.data(), x.size());
  DeviceArray<float> d_x(x), d_dy(dy);
  cuda::gelu_backward(d_x.data(), d_dy.data(), d_dy.data(), x.size(), nullptr);  // dx = dy
  testing::expect_within(
      d_dy.download(), want,
      [&](std::size_t i) {
        const double a = std::fabs(x[i]);
        return 5e-7 * (1.0 + a * (1.0 + 0.14 * a * a)) * std::fabs(dy[i]) +
               std::fabs(want[i]) * 1.2e-7;
      },
      "dx");
}

TEST(GeluCuda, ZeroCountLaunchesNothing) {
  EXPECT_NO_THROW(cuda::gelu_forward(nullptr, nullptr, 0, nullptr));
  EXPECT_NO_THROW(cuda::gelu_backward(nullptr, nullptr, nullptr, 0, nullptr));
}

}  // namespace
}  // namespace zest
