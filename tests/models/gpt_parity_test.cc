// The GPT trained through the engine at every stage and world size matches one rank at stage 0:
// per-step losses and every final parameter. The LM head borrows the embedding's wte, so this
// is the engine's tied-weight path at every stage (a gradient accumulated into another unit's
// bucket at stages 2-3, another unit's shard gathered beside the head's at stage 3).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "models/gpt.h"
#include "engine/engine.h"
#include "runtime/world.h"
#include "tests/models/gpt_parity_support.h"

namespace zest {
namespace {

const GptConfig kConfig{/*n_layer=*/2, /*n_head=*/2, /*n_embd=*/16, /*vocab_size=*/37,
                        /*seq_len=*/8};
constexpr int kGlobalBatch = 8;  // sequences per step; divides by every world size below
constexpr int kSteps = 10;

struct RunResult {
  std::vector<float> losses;
  std::map<std::string, std::vector<float>> params;
};

void make_global_batch(int step, std::vector<std::int32_t>& inputs,
                       std::vector<std::int32_t>& targets) {
  testing::make_gpt_batch(kConfig, 500 + step, kGlobalBatch, inputs, targets);
}

RunResult run_gpt(int stage, int world_size, int accumulation = 1) {
  RunResult result;
  result.losses.resize(kSteps);
  WorldOptions world_options;
  world_options.ranks = world_size;
  world_options.timeout = std::chrono::seconds(60);
  World world(world_options);
  world.run([&](RankContext& context) {
    Gpt model(kConfig);
    EngineOptions options;
    options.stage = stage;
    options.gradient_accumulation_steps = accumulation;
    Engine engine(context, options);
    auto trainer = engine.shard(model, make_optimizer(testing::parity_adamw()));
    const std::int64_t rows = kGlobalBatch / world_size / accumulation;
    const std::int64_t seq = kConfig.seq_len;
    std::vector<std::int32_t> inputs, targets;
    for (int step = 0; step < kSteps; ++step) {
      make_global_batch(step, inputs, targets);
      for (int micro = 0; micro < accumulation; ++micro) {
        // Sequences are dealt rank-major within each micro-batch: rank r's m-th micro-batch is
        // rows [(m·world + r)·rows, ...) of the global batch.
        const std::size_t first =
            static_cast<std::size_t>((micro * world_size + context.rank) * rows * seq);
        Batch batch{Tensor{inputs.data() + first, {rows, seq}, DType::kInt32},
                    Tensor{targets.data() + first, {rows, seq}, DType::kInt32}};
        trainer->forward_backward(batch);
      }
      const StepStats stats = trainer->step();
      if (context.rank == 0) result.losses[step] = stats.loss;
    }
    for (const std::string& name : trainer->parameter_names()) {
      std::vector<float> value = trainer->full_parameter(name);
      if (context.rank == 0) result.params[name] = std::move(value);
    }
  });
  return result;
}

const RunResult& reference() {
  static const RunResult result = run_gpt(0, 1);
  return result;
}

void expect_same_training(const RunResult& expected, const RunResult& run) {
  for (int step = 0; step < kSteps; ++step) {
    EXPECT_NEAR(
        run.losses[step], expected.losses[step],
        testing::kParityRelative * std::abs(expected.losses[step]) + testing::kParityAbsolute)
        << "loss at step " << step;
  }
  // Training must have done something for the comparison to mean anything.
  EXPECT_LT(expected.losses.back(), expected.losses.front() - 0.1f);
  testing::expect_same_parameters(kConfig, expected.params, run.params);
}

class GptParity : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(GptParity, MatchesSingleRankStage0) {
  const auto [stage, world] = GetParam();
  expect_same_training(reference(), run_gpt(stage, world));
}

TEST(GptParityAccumulation, TwoMicroBatchesPerRankMatchSingleRankStage0) {
  // Stages 2-3 reduce every micro-batch: the embedding's bucket is made by the head's backward
  // and reduced after the embedding's, once per micro-batch.
  for (int stage : {0, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    expect_same_training(reference(), run_gpt(stage, 2, 2));
  }
}

INSTANTIATE_TEST_SUITE_P(StagesAndWorlds, GptParity,
                         ::testing::Combine(::testing::Values(0, 1, 2, 3),
                                            ::testing::Values(1, 2, 4)),
                         [](const auto& info) {
                           return "stage" + std::to_string(std::get<0>(info.param)) + "_world" +
                                  std::to_string(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace zest
