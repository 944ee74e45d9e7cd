// ctest-labels: gpu
// The CUDA bias add and bias gradient against the CPU bodies. add_bias is one fp32 add per
// element on both: bit for bit. bias_grad sums rows in chunks, the CPU row by row: any order of
// n terms is within n * 2^-24 of the sum of their magnitudes (n = 300 here: 1.8e-5), so two
// orders are within twice that at worst; the kernel's order is fixed (64-row chunks from 0, then
// the chunks in order: adds only, nothing to contract), and emulated on the host on these inputs
// its largest error is 0.3% of the bound held here, 2e-5 of each column's sum |dy| plus its
// starting value. Two runs give the same bits.
#include "kernels/bias_cuda.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "base/error.h"
#include "kernels/bias.h"
#include "tests/support/cuda_test_support.h"

namespace zest {
namespace {

using testing::DeviceArray;

constexpr std::int64_t kRows = 300;  // four chunks and a part
constexpr std::int64_t kCols = 77;

TEST(BiasCuda, AddBiasIsTheCpuBodyBitForBit) {
  ZEST_SKIP_WITHOUT_CUDA();
  const auto y = testing::random_floats(kRows * kCols, 1);
  const auto bias = testing::random_floats(kCols, 2);
  std::vector<float> want = y;
  cpu::add_bias(want.data(), bias.data(), kRows, kCols);
  DeviceArray<float> d_y(y), d_bias(bias);
  cuda::add_bias(d_y.data(), d_bias.data(), kRows, kCols, nullptr);
  testing::expect_bit_identical(d_y.download(), want, "y");
}

TEST(BiasCuda, BiasGradAccumulatesColumnSumsDeterministically) {
  ZEST_SKIP_WITHOUT_CUDA();
  const auto dy = testing::random_floats(kRows * kCols, 3);
  const auto dbias0 = testing::random_floats(kCols, 4);
  std::vector<float> want = dbias0;
  cpu::bias_grad(dy.data(), want.data(), kRows, kCols);
  std::vector<double> magnitude(kCols);
  for (std::int64_t c = 0; c < kCols; ++c) {
    magnitude[c] = std::fabs(dbias0[c]);
    for (std::int64_t r = 0; r < kRows; ++r) magnitude[c] += std::fabs(dy[r * kCols + c]);
  }
  DeviceArray<float> d_dy(dy);
  const std::size_t bytes = cuda::bias_grad_workspace_bytes(kRows, kCols);
  DeviceArray<unsigned char> workspace(bytes);
  std::vector<std::vector<float>> runs;
  for (int run = 0; run < 2; ++run) {
    DeviceArray<float> d_dbias(dbias0);
    cuda::bias_grad(d_dy.data(), d_dbias.data(), kRows, kCols, workspace.data(), bytes, nullptr);
    runs.push_back(d_dbias.download());
    testing::expect_within(
        runs.back(), want, [&](std::size_t c) { return 2e-5 * magnitude[c]; }, "dbias");
  }
  testing::expect_bit_identical(runs[1], runs[0], "second run");
}

TEST(BiasCudaArguments, ShapesAndWorkspaceAreCheckedOnTheHost) {
  EXPECT_THROW(cuda::add_bias(nullptr, nullptr, -1, 4, nullptr), Error);
  EXPECT_THROW(cuda::bias_grad(nullptr, nullptr, 100, 4, nullptr, 0, nullptr), Error);
  EXPECT_NO_THROW(cuda::bias_grad(nullptr, nullptr, 0, 4, nullptr, 0, nullptr));
  EXPECT_EQ(cuda::bias_grad_workspace_bytes(kRows, kCols), 5 * kCols * sizeof(float));
}

}  // namespace
}  // namespace zest
