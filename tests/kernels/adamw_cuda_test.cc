// ctest-labels: gpu
// The CUDA AdamW / Adam body against the portable CPU body over several steps: bit-identical
// parameters, moments and 2-byte copies (0 ulps: both perform the same IEEE fp32 operations in
// the same order, each rounded once, from the same host-computed constants — see
// kernels/adamw_cuda.h), on aligned arrays (the float4 path) and misaligned ones (scalar only).
#include "kernels/adamw_cuda.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "tests/support/cuda_test_support.h"

namespace zest {
namespace {

using testing::DeviceArray;

struct State {
  std::vector<float> p, m, v;
  std::vector<std::uint16_t> copy;
};

State random_state(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  State s{std::vector<float>(n), std::vector<float>(n), std::vector<float>(n),
          std::vector<std::uint16_t>(n)};
  for (std::size_t i = 0; i < n; ++i) {
    s.p[i] = normal(rng);
    s.m[i] = 0.1f * normal(rng);
    s.v[i] = 0.01f * std::abs(normal(rng));
  }
  return s;
}

std::vector<float> random_grads(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> g(n);
  for (std::size_t i = 0; i < n; ++i) g[i] = i % 97 == 0 ? 0.0f : normal(rng) * (i % 5 + 1);
  return g;
}

void expect_same_bits(const std::vector<float>& gpu, const std::vector<float>& cpu,
                      const char* what) {
  ASSERT_EQ(gpu.size(), cpu.size());
  for (std::size_t i = 0; i < gpu.size(); ++i) {
    ASSERT_EQ(std::bit_cast<std::uint32_t>(gpu[i]), std::bit_cast<std::uint32_t>(cpu[i]))
        << what << "[" << i << "]: gpu " << gpu[i] << ", cpu " << cpu[i];
  }
}

// Runs `steps` updates on both bodies from the same state and compares after each.
void compare(const AdamWArgs& base_args, bool with_copy, DType copy_dtype, std::size_t offset) {
  const std::size_t n = 10007;  // not a multiple of 4: the vector path leaves a tail
  State cpu_state = random_state(n, 7);
  DeviceArray<float> p(cpu_state.p, offset), m(cpu_state.m, offset), v(cpu_state.v, offset);
  DeviceArray<std::uint16_t> copy(n, offset);
  for (int step = 1; step <= 5; ++step) {
    AdamWArgs args = base_args;
    args.step = step;
    const std::vector<float> grads = random_grads(n, 100 + step);
    DeviceArray<float> g(grads, offset);
    RoundedCopy cpu_copy{with_copy ? cpu_state.copy.data() : nullptr, copy_dtype};
    RoundedCopy gpu_copy{with_copy ? copy.data() : nullptr, copy_dtype};
    cpu::adamw(CpuBody::kPortable, cpu_state.p.data(), grads.data(), cpu_state.m.data(),
               cpu_state.v.data(), n, args, cpu_copy);
    cuda::adamw(p.data(), g.data(), m.data(), v.data(), n, args, gpu_copy, nullptr);
    SCOPED_TRACE("step " + std::to_string(step));
    expect_same_bits(p.download(), cpu_state.p, "params");
    expect_same_bits(m.download(), cpu_state.m, "exp_avg");
    expect_same_bits(v.download(), cpu_state.v, "exp_avg_sq");
    if (with_copy) {
      EXPECT_EQ(copy.download(), cpu_state.copy);
    }
  }
}

AdamWArgs adamw_args() {
  AdamWArgs args;
  args.lr = 1e-2f;
  args.weight_decay = 0.1f;
  args.grad_scale = 0.5f;
  return args;
}

TEST(AdamWCuda, MatchesThePortableCpuBodyBitForBit) {
  ZEST_SKIP_WITHOUT_CUDA();
  for (std::size_t offset : {0, 1}) {
    SCOPED_TRACE(offset == 0 ? "aligned" : "misaligned");
    compare(adamw_args(), false, DType::kBFloat16, offset);
  }
}

TEST(AdamWCuda, AdamWithL2MatchesThePortableCpuBody) {
  ZEST_SKIP_WITHOUT_CUDA();
  AdamWArgs args = adamw_args();
  args.decoupled = false;
  args.weight_decay = 0.01f;
  compare(args, false, DType::kBFloat16, 0);
}

TEST(AdamWCuda, RoundedCopiesMatchTheCpuBody) {
  ZEST_SKIP_WITHOUT_CUDA();
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    for (std::size_t offset : {0, 1}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + (offset == 0 ? " aligned" : " misaligned"));
      compare(adamw_args(), true, dtype, offset);
    }
  }
}

TEST(AdamWCuda, BadArgumentsAreRefusedOnTheHost) {
  // No GPU needed: the checks run before any CUDA call.
  AdamWArgs args = adamw_args();
  args.step = 0;
  EXPECT_THROW(cuda::adamw(nullptr, nullptr, nullptr, nullptr, 4, args, {}, nullptr), Error);
  args.step = 1;
  float fake = 0.0f;
  EXPECT_THROW(
      cuda::adamw(nullptr, nullptr, nullptr, nullptr, 4, args, {&fake, DType::kFloat32}, nullptr),
      Error);
  EXPECT_NO_THROW(cuda::adamw(nullptr, nullptr, nullptr, nullptr, 0, args, {}, nullptr));
}

}  // namespace
}  // namespace zest
