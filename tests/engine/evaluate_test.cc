// Trainer::evaluate: the held-out loss is the same at every stage and world size (each rank
// evaluates its slice; the ranks' losses are averaged), and evaluating between steps changes
// nothing about training.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "base/error.h"
#include "models/gpt.h"
#include "engine/engine.h"
#include "runtime/world.h"

namespace zest {
namespace {

const GptConfig kConfig{/*n_layer=*/2, /*n_head=*/2, /*n_embd=*/16, /*vocab_size=*/37,
                        /*seq_len=*/8};
constexpr int kRows = 8;  // global batch rows; divides by every world size below

std::vector<std::int32_t> tokens(unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<std::int32_t> values(static_cast<std::size_t>(kRows) * kConfig.seq_len);
  for (std::int32_t& value : values) value = static_cast<std::int32_t>(rng() % kConfig.vocab_size);
  return values;
}

// This rank's rows of a [kRows, seq_len] batch.
Batch slice(std::vector<std::int32_t>& inputs, std::vector<std::int32_t>& targets,
            const RankContext& context) {
  const std::int64_t rows = kRows / context.world_size;
  const std::size_t first = static_cast<std::size_t>(context.rank * rows * kConfig.seq_len);
  return Batch{Tensor{inputs.data() + first, {rows, kConfig.seq_len}, DType::kInt32},
               Tensor{targets.data() + first, {rows, kConfig.seq_len}, DType::kInt32}};
}

struct TrainRun {
  std::vector<float> losses;      // training, per step
  std::vector<float> val_losses;  // after each step, when evaluating
};

TrainRun train(int stage, int world_size, bool evaluate, int steps = 3) {
  TrainRun run;
  WorldOptions world_options;
  world_options.ranks = world_size;
  world_options.timeout = std::chrono::seconds(60);
  World(world_options).run([&](RankContext& context) {
    Gpt model(kConfig);
    EngineOptions options;
    options.stage = stage;
    Engine engine(context, options);
    OptimizerOptions optimizer;
    optimizer.lr = 1e-2f;
    auto trainer = engine.shard(model, make_optimizer(optimizer));
    std::vector<std::int32_t> val_inputs = tokens(7), val_targets = tokens(8);
    for (int step = 0; step < steps; ++step) {
      std::vector<std::int32_t> inputs = tokens(100 + step), targets = tokens(200 + step);
      trainer->forward_backward(slice(inputs, targets, context));
      const StepStats stats = trainer->step();
      if (context.rank == 0) run.losses.push_back(stats.loss);
      if (!evaluate) continue;
      const float val = trainer->evaluate(slice(val_inputs, val_targets, context));
      if (context.rank == 0) run.val_losses.push_back(val);
    }
  });
  return run;
}

class Evaluate : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(Evaluate, EqualsTheSingleRankLossAndLeavesTrainingAlone) {
  const auto [stage, world] = GetParam();
  static const TrainRun reference = train(0, 1, true);
  const TrainRun with = train(stage, world, true);
  ASSERT_EQ(with.val_losses.size(), reference.val_losses.size());
  for (std::size_t i = 0; i < with.val_losses.size(); ++i) {
    // Only the order of fp32 sums differs (means over fewer rows, averaged across ranks).
    EXPECT_NEAR(with.val_losses[i], reference.val_losses[i], 2e-6 * reference.val_losses[i]) << i;
  }
  // Bit for bit the losses of the same run without evaluation.
  EXPECT_EQ(with.losses, train(stage, world, false).losses);
  // Training changed the model, and evaluation saw it.
  EXPECT_NE(with.val_losses.front(), with.val_losses.back());
}

INSTANTIATE_TEST_SUITE_P(StagesAndWorlds, Evaluate,
                         ::testing::Combine(::testing::Values(0, 1, 2, 3), ::testing::Values(1, 4)));

TEST(EvaluateMisuse, BetweenMicroBatchesIsAUsageError) {
  WorldOptions world_options;
  World(world_options).run([&](RankContext& context) {
    Gpt model(kConfig);
    EngineOptions options;
    options.gradient_accumulation_steps = 2;
    Engine engine(context, options);
    auto trainer = engine.shard(model, make_optimizer(OptimizerOptions{}));
    std::vector<std::int32_t> inputs = tokens(1), targets = tokens(2);
    trainer->forward_backward(slice(inputs, targets, context));
    try {
      trainer->evaluate(slice(inputs, targets, context));
      ADD_FAILURE() << "no error";
    } catch (const Error& error) {
      EXPECT_EQ(error.kind(), ErrorKind::kUsage);
      EXPECT_NE(std::string(error.what()).find("evaluate between steps"), std::string::npos);
    }
  });
}

}  // namespace
}  // namespace zest
