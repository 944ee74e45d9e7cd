// ZeroTrainer's hooks (make_pass, forward_unit, begin_backward, backward_unit, step_totals,
// finish_step): a caller that keeps two micro-batches in flight, each pass on its own replica of
// the units, trains bit for bit as forward_backward() does, at every ZeRO stage, on the GPT whose
// head borrows the embedding (engine/borrowed_units.h); a pass over another model's units is
// refused.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "engine/device_batch.h"
#include "engine/engine.h"
#include "engine/zero_trainer.h"
#include "models/gpt.h"
#include "models/mlp.h"
#include "runtime/host_collectives.h"
#include "runtime/host_copies.h"
#include "runtime/world.h"

namespace zest {
namespace {

const GptConfig kConfig{/*n_layer=*/2, /*n_head=*/2, /*n_embd=*/16, /*vocab_size=*/37,
                        /*seq_len=*/8};
constexpr int kWorld = 2;
constexpr int kMicroBatches = 2;
constexpr int kRows = 2;  // per rank and micro-batch
constexpr int kSteps = 2;

std::vector<std::int32_t> tokens(unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<std::int32_t> values(static_cast<std::size_t>(kRows) * kConfig.seq_len);
  for (std::int32_t& value : values) value = static_cast<std::int32_t>(rng() % kConfig.vocab_size);
  return values;
}

struct Trained {
  std::vector<float> losses;  // per step
  std::vector<float> wte;     // the tied embedding at the end
};

Trained train(int stage, bool hooks) {
  Trained run;
  WorldOptions world_options;
  world_options.ranks = kWorld;
  world_options.timeout = std::chrono::seconds(60);
  World(world_options).run([&](RankContext& context) {
    Gpt model(kConfig);
    Gpt replica(kConfig);  // the second pass's units: they keep what their backward reads
    EngineOptions options;
    options.stage = stage;
    options.gradient_accumulation_steps = kMicroBatches;
    Engine engine(context, options);
    OptimizerOptions optimizer;
    optimizer.lr = 1e-2f;
    std::unique_ptr<Trainer> owned = engine.shard(model, make_optimizer(optimizer));
    auto& trainer = dynamic_cast<ZeroTrainer&>(*owned);
    for (int step = 0; step < kSteps; ++step) {
      std::vector<std::vector<std::int32_t>> inputs, targets;
      std::vector<Batch> batches;
      for (int m = 0; m < kMicroBatches; ++m) {
        const unsigned seed = static_cast<unsigned>(100 * step + 10 * m + context.rank);
        inputs.push_back(tokens(seed));
        targets.push_back(tokens(seed + 1000));
      }
      for (int m = 0; m < kMicroBatches; ++m) {
        batches.push_back(Batch{Tensor{inputs[m].data(), {kRows, kConfig.seq_len}, DType::kInt32},
                                Tensor{targets[m].data(), {kRows, kConfig.seq_len}, DType::kInt32}});
      }
      StepStats stats;
      if (!hooks) {
        for (const Batch& batch : batches) trainer.forward_backward(batch);
        stats = owned->step();
      } else {
        const std::size_t units = trainer.layouts().size();
        std::vector<std::unique_ptr<DeviceBatch>> staged;
        std::vector<MicroBatchPass> passes;
        double loss_sum = 0.0;
        for (int m = 0; m < kMicroBatches; ++m) {
          staged.push_back(std::make_unique<DeviceBatch>(context.device, context.compute, batches[m]));
          passes.push_back(trainer.make_pass(m == 0 ? model.units() : replica.units()));
          for (std::size_t u = 0; u < units; ++u) trainer.forward_unit(u, staged[m]->batch(), passes[m]);
          float loss = 0.0f;
          read_to_host(context.device, context.compute, &loss, trainer.loss_buffer(), sizeof loss);
          loss_sum += loss;
        }
        for (int m = 0; m < kMicroBatches; ++m) {
          trainer.begin_backward(m + 1 == kMicroBatches);
          for (std::size_t u = units; u-- > 0;) trainer.backward_unit(u, staged[m]->batch(), passes[m]);
          trainer.release_pass(passes[m]);  // the first unit's input gradient: tokens have none
        }
        ZeroTrainer::StepTotals totals = trainer.step_totals(loss_sum / kMicroBatches / kWorld);
        all_reduce_host(context, totals.values, totals.values, 3, DType::kFloat32, Reduction::kSum);
        stats = trainer.finish_step(-1.0f, totals);
      }
      if (context.rank == 0) run.losses.push_back(stats.loss);
    }
    std::vector<float> wte = trainer.full_parameter("embedding.wte");
    if (context.rank == 0) run.wte = wte;
  });
  return run;
}

class TrainerHooks : public ::testing::TestWithParam<int> {};

TEST_P(TrainerHooks, TwoPassesInFlightTrainBitForBitAsForwardBackward) {
  const Trained plain = train(GetParam(), false);
  const Trained hooked = train(GetParam(), true);
  ASSERT_EQ(plain.losses.size(), static_cast<std::size_t>(kSteps));
  EXPECT_EQ(hooked.losses, plain.losses);
  ASSERT_FALSE(plain.wte.empty());
  EXPECT_EQ(hooked.wte, plain.wte);
  // Training moved the loss: the comparison is of something that ran.
  EXPECT_NE(plain.losses.front(), plain.losses.back());
}

INSTANTIATE_TEST_SUITE_P(Stages, TrainerHooks, ::testing::Values(0, 1, 2, 3));

TEST(TrainerHooksMisuse, APassOverAnotherModelsUnitsIsAUsageError) {
  World(WorldOptions{}).run([&](RankContext& context) {
    Gpt model(kConfig);
    Mlp other(MlpConfig{{4, 8, 3}});
    Engine engine(context, EngineOptions{});
    std::unique_ptr<Trainer> owned = engine.shard(model, make_optimizer(OptimizerOptions{}));
    auto& trainer = dynamic_cast<ZeroTrainer&>(*owned);
    try {
      (void)trainer.make_pass(other.units());
      ADD_FAILURE() << "no error";
    } catch (const Error& error) {
      EXPECT_EQ(error.kind(), ErrorKind::kUsage);
      EXPECT_NE(std::string(error.what()).find("units for a trainer of"), std::string::npos)
          << error.what();
    }
  });
}

}  // namespace
}  // namespace zest
