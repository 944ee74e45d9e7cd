// ctest-labels: gpu
// The CUDA softmax + cross-entropy against the CPU body on the same logits and targets. Both sum
// exp in double and take the loss terms in double; they differ by CUDA's expf against glibc's
// (each within 2 ulps) and the summation order, so the loss is held to 1e-6 relative. Each
// gradient element is exp * inv_sum * scale with the same roundings, so to 1e-6 relative, plus
// 1e-6 of row_scale where the target's subtraction cancels. The argument checks need no GPU.
#include "kernels/cross_entropy_cuda.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "base/error.h"
#include "kernels/cross_entropy.h"
#include "tests/support/cuda_test_support.h"

namespace zest {
namespace {

using testing::DeviceArray;

constexpr std::int64_t kRows = 37;
constexpr std::int64_t kClasses = 1003;  // not a multiple of the block's 256 threads

std::vector<std::int32_t> targets() {
  std::vector<std::int32_t> t(kRows);
  for (std::int64_t r = 0; r < kRows; ++r) t[r] = static_cast<std::int32_t>((r * 389) % kClasses);
  return t;
}

float gpu_loss(const std::vector<float>& logits, const std::vector<std::int32_t>& t) {
  DeviceArray<float> d_logits(logits), d_loss(1);
  DeviceArray<std::int32_t> d_targets(t);
  const std::size_t bytes = cuda::cross_entropy_forward_workspace_bytes(kRows);
  DeviceArray<unsigned char> workspace(bytes);
  cuda::cross_entropy_forward(d_logits.data(), d_targets.data(), kRows, kClasses, d_loss.data(),
                              workspace.data(), bytes, nullptr);
  return d_loss.download()[0];
}

TEST(CrossEntropyCuda, LossMatchesTheCpuBody) {
  ZEST_SKIP_WITHOUT_CUDA();
  const auto logits = testing::random_floats(kRows * kClasses, 1, 3.0f, 20.0f);
  const auto t = targets();
  float want = 0.0f;
  cpu::cross_entropy_forward(logits.data(), t.data(), kRows, kClasses, &want);
  const float got = gpu_loss(logits, t);
  EXPECT_NEAR(got, want, 1e-6 * std::fabs(want));
  EXPECT_EQ(gpu_loss(logits, t), got) << "the loss is deterministic";
}

TEST(CrossEntropyCuda, GradientMatchesTheCpuBodyInPlace) {
  ZEST_SKIP_WITHOUT_CUDA();
  const auto logits = testing::random_floats(kRows * kClasses, 2, 3.0f);
  const auto t = targets();
  const float scale = 1024.0f;  // a loss scale
  std::vector<float> want(logits.size());
  cpu::cross_entropy_backward(logits.data(), t.data(), kRows, kClasses, scale, want.data());
  DeviceArray<float> d_logits(logits);
  DeviceArray<std::int32_t> d_targets(t);
  cuda::cross_entropy_backward(d_logits.data(), d_targets.data(), kRows, kClasses, scale,
                               d_logits.data(), nullptr);
  const double row_scale = scale / kRows;
  testing::expect_within(
      d_logits.download(), want,
      [&](std::size_t i) { return 1e-6 * (std::fabs(want[i]) + row_scale); }, "dlogits");
}

TEST(CrossEntropyCuda, TargetOutsideTheClassesMakesTheLossNaN) {
  ZEST_SKIP_WITHOUT_CUDA();
  auto t = targets();
  t[5] = static_cast<std::int32_t>(kClasses);
  EXPECT_TRUE(std::isnan(gpu_loss(testing::random_floats(kRows * kClasses, 3), t)));
}

TEST(CrossEntropyCudaArguments, ShapesAndWorkspaceAreCheckedOnTheHost) {
  float loss = 0.0f;
  EXPECT_THROW(cuda::cross_entropy_forward(nullptr, nullptr, 0, 10, &loss, nullptr, 0, nullptr),
               Error);
  EXPECT_THROW(cuda::cross_entropy_forward(nullptr, nullptr, 4, 10, &loss, nullptr, 8, nullptr),
               Error);  // 4 rows need 32 bytes
  EXPECT_THROW(cuda::cross_entropy_backward(nullptr, nullptr, 4, 0, 1.0f, nullptr, nullptr), Error);
}

}  // namespace
}  // namespace zest
