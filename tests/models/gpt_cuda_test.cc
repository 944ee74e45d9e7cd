// ctest-labels: gpu
// The GPT on the CUDA device against the same GPT on the CPU device (issue 13's parity): fp32
// within 1e-4 relative at stages 0 and 3, and bf16 within a stated tolerance over 20 steps. The
// CUDA side runs every GPT op through its CUDA body (cuBLASLt products without TF32, LayerNorm,
// attention, GELU, cross-entropy, embedding). Skips, printing why, where no GPU is visible.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "models/gpt.h"
#include "engine/engine.h"
#include "runtime/world.h"
#include "tests/support/cuda_test_support.h"

namespace zest {
namespace {

const GptConfig kConfig{/*n_layer=*/2, /*n_head=*/2, /*n_embd=*/32, /*vocab_size=*/67,
                        /*seq_len=*/16};
constexpr int kRows = 4;  // sequences per step

struct RunResult {
  std::vector<float> losses;
  std::map<std::string, std::vector<float>> params;
};

// A fixed rule (t -> 3t + 1 mod vocab, with noise) so that the loss has something to fall on.
void make_batch(int step, std::vector<std::int32_t>& inputs, std::vector<std::int32_t>& targets) {
  std::mt19937 rng(900 + step);
  std::uniform_int_distribution<std::int32_t> token(0, kConfig.vocab_size - 1);
  const std::size_t count = static_cast<std::size_t>(kRows) * kConfig.seq_len;
  inputs.resize(count);
  targets.resize(count);
  for (std::size_t i = 0; i < count; ++i) {
    inputs[i] = token(rng);
    targets[i] = rng() % 4 == 0 ? token(rng) : (3 * inputs[i] + 1) % kConfig.vocab_size;
  }
}

RunResult run_gpt(DeviceKind device, int stage, DType dtype, int steps) {
  RunResult result;
  WorldOptions world_options;
  world_options.device = device;
  world_options.backend = device == DeviceKind::kCuda ? "nccl" : "local";
  world_options.timeout = std::chrono::seconds(60);
  World world(world_options);
  world.run([&](RankContext& context) {
    Gpt model(kConfig);
    EngineOptions options;
    options.stage = stage;
    options.compute_dtype = dtype;
    options.communication_dtype = dtype;
    Engine engine(context, options);
    OptimizerOptions optimizer;
    optimizer.type = "AdamW";
    optimizer.lr = 3e-3f;
    optimizer.weight_decay = 0.1f;
    auto trainer = engine.shard(model, make_optimizer(optimizer));
    std::vector<std::int32_t> inputs, targets;
    for (int step = 0; step < steps; ++step) {
      make_batch(step, inputs, targets);
      const std::int64_t seq = kConfig.seq_len;
      Batch batch{Tensor{inputs.data(), {kRows, seq}, DType::kInt32},
                  Tensor{targets.data(), {kRows, seq}, DType::kInt32}};
      trainer->forward_backward(batch);
      result.losses.push_back(trainer->step().loss);
    }
    for (const std::string& name : trainer->parameter_names()) {
      result.params[name] = trainer->full_parameter(name);
    }
  });
  return result;
}

// The key bias (c_attn.bias[C, 2C)) has an identically zero gradient (softmax ignores a constant
// added to every key), so its fp32 gradient is rounding noise that Adam normalizes into updates;
// it must only stay near its initial 0 (tests/models/gpt_parity_test.cc measures 3e-6).
bool is_key_bias(const std::string& name, std::size_t index) {
  const auto C = static_cast<std::size_t>(kConfig.n_embd);
  return name.ends_with(".attn.c_attn.bias") && index >= C && index < 2 * C;
}

TEST(GptCuda, Fp32MatchesTheCpuDeviceWithin1e4) {
  ZEST_SKIP_WITHOUT_CUDA();
  // cuBLASLt without TF32 and OpenBLAS sum products in other orders (~1e-7 relative per
  // gradient), as two CPU runs with other reduction orders do (gpt_parity_test: 7e-7 absolute
  // after 10 steps). 1e-4 relative is issue 13's bound; the 2e-5 absolute floor covers
  // parameters near 0, which Adam moves by up to lr = 3e-3 a step, so a wrong op still shows.
  constexpr int kSteps = 10;
  for (int stage : {0, 3}) {
    const RunResult cpu = run_gpt(DeviceKind::kCpu, stage, DType::kFloat32, kSteps);
    const RunResult gpu = run_gpt(DeviceKind::kCuda, stage, DType::kFloat32, kSteps);
    for (int step = 0; step < kSteps; ++step) {
      EXPECT_NEAR(gpu.losses[step], cpu.losses[step], 1e-4 * std::fabs(cpu.losses[step]))
          << "stage " << stage << ", step " << step;
    }
    EXPECT_LT(cpu.losses.back(), cpu.losses.front() - 0.1f);
    for (const auto& [name, values] : cpu.params) {
      const std::vector<float>& other = gpu.params.at(name);
      ASSERT_EQ(other.size(), values.size()) << name;
      for (std::size_t i = 0; i < values.size(); ++i) {
        if (is_key_bias(name, i)) continue;
        ASSERT_NEAR(other[i], values[i], 1e-4 * std::fabs(values[i]) + 2e-5)
            << "stage " << stage << ", " << name << "[" << i << "]";
      }
    }
  }
}

TEST(GptCuda, Bf16TracksTheCpuDeviceOver20Steps) {
  ZEST_SKIP_WITHOUT_CUDA();
  // Both devices cast to bf16 bit-identically, but the GPU's products round their inputs to
  // bf16 (as autocast) where the CPU multiplies exactly, and a result that such a difference
  // tips rounds to the neighbouring bf16 value (2^-8 relative); these compound over the steps.
  // 2e-2 of the loss over 20 steps is the stated bf16 tolerance; a wrong cast or a lost gradient
  // moves the loss by more than 1e-1 within a few steps.
  constexpr int kSteps = 20;
  for (int stage : {0, 3}) {
    const RunResult cpu = run_gpt(DeviceKind::kCpu, stage, DType::kBFloat16, kSteps);
    const RunResult gpu = run_gpt(DeviceKind::kCuda, stage, DType::kBFloat16, kSteps);
    for (int step = 0; step < kSteps; ++step) {
      EXPECT_NEAR(gpu.losses[step], cpu.losses[step], 2e-2 * std::fabs(cpu.losses[step]))
          << "stage " << stage << ", step " << step;
    }
    EXPECT_LT(gpu.losses.back(), gpu.losses.front() - 0.1f);
  }
}

}  // namespace
}  // namespace zest
