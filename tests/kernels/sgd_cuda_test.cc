// ctest-labels: gpu
// The CUDA SGD body against the CPU body over several steps, bit for bit (0 ulps: the same IEEE
// fp32 operations in the same order, none fused; kernels/sgd_cuda.h): plain, momentum (its first
// step starts the buffer from the gradient), nesterov, aligned and misaligned arrays.
#include "kernels/sgd_cuda.h"

#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "tests/support/cuda_test_support.h"

namespace zest {
namespace {

using testing::DeviceArray;

std::vector<float> random_values(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(n);
  for (float& value : values) value = normal(rng);
  return values;
}

void expect_same_bits(const std::vector<float>& gpu, const std::vector<float>& cpu,
                      const char* what) {
  ASSERT_EQ(gpu.size(), cpu.size());
  for (std::size_t i = 0; i < gpu.size(); ++i) {
    ASSERT_EQ(std::bit_cast<std::uint32_t>(gpu[i]), std::bit_cast<std::uint32_t>(cpu[i]))
        << what << "[" << i << "]: gpu " << gpu[i] << ", cpu " << cpu[i];
  }
}

void compare(float momentum, bool nesterov, std::size_t offset) {
  const std::size_t n = 4099;  // a tail after the vector groups
  std::vector<float> cpu_p = random_values(n, 1);
  // Garbage in the buffer: step 1 must not read it.
  std::vector<float> cpu_buf(n, 12345.0f);
  DeviceArray<float> p(cpu_p, offset), buf(cpu_buf, offset);
  for (int step = 1; step <= 4; ++step) {
    SgdArgs args;
    args.lr = 0.05f;
    args.momentum = momentum;
    args.nesterov = nesterov;
    args.weight_decay = 0.01f;
    args.grad_scale = 0.25f;
    args.step = step;
    const std::vector<float> grads = random_values(n, 10 + step);
    DeviceArray<float> g(grads, offset);
    float* cpu_buffer = momentum == 0.0f ? nullptr : cpu_buf.data();
    float* gpu_buffer = momentum == 0.0f ? nullptr : buf.data();
    cpu::sgd(cpu_p.data(), grads.data(), cpu_buffer, n, args);
    cuda::sgd(p.data(), g.data(), gpu_buffer, n, args, nullptr);
    SCOPED_TRACE("step " + std::to_string(step));
    expect_same_bits(p.download(), cpu_p, "params");
    if (momentum != 0.0f) expect_same_bits(buf.download(), cpu_buf, "momentum_buffer");
  }
}

TEST(SgdCuda, MatchesTheCpuBodyBitForBit) {
  ZEST_SKIP_WITHOUT_CUDA();
  for (std::size_t offset : {0, 1}) {
    SCOPED_TRACE(offset == 0 ? "aligned" : "misaligned");
    compare(0.0f, false, offset);
    compare(0.9f, false, offset);
    compare(0.9f, true, offset);
  }
}

TEST(SgdCuda, BadArgumentsAreRefusedOnTheHost) {
  SgdArgs args;
  args.step = 0;
  EXPECT_THROW(cuda::sgd(nullptr, nullptr, nullptr, 4, args, nullptr), Error);
  args.step = 1;
  args.momentum = 0.9f;
  EXPECT_THROW(cuda::sgd(nullptr, nullptr, nullptr, 4, args, nullptr), Error);
}

}  // namespace
}  // namespace zest
