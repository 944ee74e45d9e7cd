// The memory plan: the memory table (docs/architecture.md) as arithmetic, equal to what the engine
// allocates, and the out-of-memory advice that names what the model state needs and the smallest
// change that fits.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "base/byte_size.h"
#include "base/error.h"
#include "models/gpt.h"
#include "engine/engine.h"
#include "engine/model_state.h"
#include "planner/memory_advice.h"
#include "planner/peak_plan.h"
#include "runtime/world.h"

namespace zest {
namespace {

const GptConfig kConfig{/*n_layer=*/2, /*n_head=*/2, /*n_embd=*/32, /*vocab_size=*/64,
                        /*seq_len=*/16};

ModelStateShape gpt_shape(DType dtype) {
  ModelStateShape shape;
  shape.compute_dtype = dtype;
  Gpt model(kConfig);
  for (Unit* unit : model.units()) {
    UnitShapes shapes{unit->name(), {}, unit->borrowed_units()};
    for (const ParamSpec& spec : unit->parameters()) shapes.params.push_back({spec.name, spec.shape});
    shape.units.push_back(std::move(shapes));
  }
  return shape;
}

// Builds the trainer and returns rank 0's measured model-state bytes, or the error message.
std::string shard(int stage, int ranks, DType dtype, std::size_t capacity, MemoryPrediction* measured) {
  WorldOptions world_options;
  world_options.ranks = ranks;
  world_options.device_memory = capacity;
  try {
    World(world_options).run([&](RankContext& context) {
      Gpt model(kConfig);
      EngineOptions options;
      options.stage = stage;
      options.compute_dtype = dtype;
      Engine engine(context, options);
      auto trainer = engine.shard(model, make_optimizer(OptimizerOptions{}));
      if (context.rank != 0 || measured == nullptr) return;
      const MemoryUsage usage = context.allocator().usage();
      measured->params = usage.peak_of(Category::kParams);
      measured->grads = usage.peak_of(Category::kGrads);
      measured->optimizer = usage.peak_of(Category::kOptimizer);
    });
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

TEST(MemoryPlan, EqualsWhatTheEngineAllocatesAtEveryStageAndWorld) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    for (int stage = 0; stage <= 3; ++stage) {
      for (int ranks : {1, 3, 4}) {
        MemoryPrediction measured;
        ASSERT_EQ(shard(stage, ranks, dtype, kUnlimitedCapacity, &measured), "");
        const MemoryPrediction planned = predict_model_state(gpt_shape(dtype), stage, ranks);
        EXPECT_EQ(planned.params, measured.params) << stage << " " << ranks;
        EXPECT_EQ(planned.grads, measured.grads) << stage << " " << ranks;
        EXPECT_EQ(planned.optimizer, measured.optimizer) << stage << " " << ranks;
      }
    }
  }
}

TEST(MemoryPlan, OutOfMemoryNamesTheNeedAndTheStageThatFits) {
  const ModelStateShape shape = gpt_shape(DType::kFloat32);
  const std::size_t stage0 = predict_model_state(shape, 0, 4).total();
  const std::size_t stage2 = predict_model_state(shape, 2, 4).total();
  // Room for stage 2's model state (with the quarter kept for the rest), not for stage 0's.
  const std::size_t capacity = stage2 * 4 / 3 + 4096;
  ASSERT_LT(capacity, stage0);
  const std::string message = shard(0, 4, DType::kFloat32, capacity, nullptr);
  EXPECT_NE(message.find("out of memory"), std::string::npos) << message;
  EXPECT_NE(message.find("the model state alone needs " + format_bytes(stage0)), std::string::npos)
      << message;
  EXPECT_NE(message.find("at zero_optimization.stage 2 it needs " + format_bytes(stage2)),
            std::string::npos)
      << message;
}

TEST(MemoryPlan, WhenNoStageFitsItNamesTheRanksThatWould) {
  const ModelStateShape shape = gpt_shape(DType::kFloat32);
  const std::size_t stage3_on_8 = predict_model_state(shape, 3, 8).total();
  const std::size_t capacity = stage3_on_8 * 4 / 3 + 4096;
  const std::string advice = model_state_advice(shape, 0, 2, capacity);
  EXPECT_NE(advice.find("even stage 3 does not fit on 2 ranks, but on 8 ranks (world.ranks) it "
                        "needs " + format_bytes(stage3_on_8)),
            std::string::npos)
      << advice;
}

TEST(MemoryPlan, WhenNoStageFitsItNamesOffloadBeforeMoreRanks) {
  const ModelStateShape shape = gpt_shape(DType::kFloat32);
  const MemoryPrediction offloaded = predict_model_state(shape, 3, 2, true);
  ASSERT_LT(offloaded.total(), predict_model_state(shape, 3, 2).total());
  const std::size_t capacity = offloaded.total() * 4 / 3 + 4096;
  ASSERT_GT(predict_model_state(shape, 3, 2).total(), capacity / 4 * 3);
  const std::string advice = model_state_advice(shape, 1, 2, capacity);
  EXPECT_NE(advice.find("with zero_optimization.offload_optimizer.device \"cpu\" at stage "),
            std::string::npos)
      << advice;
}

// Activations that overflow while training: the message names the planner's estimate and the
// micro-batch that fits, since the model state fits and a higher stage would not help enough.
TEST(MemoryPlan, TrainingOutOfMemoryNamesTheEstimateAndAMicroBatchThatFits) {
  const GptConfig config{2, 2, 64, 256, 32};
  auto peak_at = [&](std::int64_t sequences) {
    Gpt model(config);
    return predict_peak(plan_input(model, {sequences, config.seq_len}, EngineOptions{}, 2, 1));
  };
  const std::size_t capacity = peak_at(2).device_total + 1024;
  ASSERT_GT(peak_at(4).device_total, capacity);
  WorldOptions world_options;
  world_options.device_memory = capacity;
  std::string message;
  try {
    World(world_options).run([&](RankContext& context) {
      Gpt model(config);
      EngineOptions options;
      options.out_of_memory_advice = training_memory_advice;
      Engine engine(context, options);
      auto trainer = engine.shard(model, make_optimizer(OptimizerOptions{}));
      std::vector<std::int32_t> tokens(8 * config.seq_len, 1);
      Batch batch{Tensor{tokens.data(), {8, config.seq_len}, DType::kInt32},
                  Tensor{tokens.data(), {8, config.seq_len}, DType::kInt32}};
      trainer->forward_backward(batch);
    });
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kOutOfMemory);
    message = error.what();
  }
  EXPECT_NE(message.find("the planner estimates " + format_bytes(peak_at(8).device_total) +
                         " per rank"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("with train_micro_batch_size_per_gpu 2 (gradient_accumulation_steps "
                         "keeps the global batch) it needs " +
                         format_bytes(peak_at(2).device_total)),
            std::string::npos)
      << message;
}

// A micro-batch that runs out of memory after the embedding was enqueued: the caller frees or
// reuses its batch the moment the error reaches it, so nothing may still be queued to read it.
// Stage 3 with slow collectives keeps the compute stream behind the host (it waits on each
// gather), so without the wait the embedding would read the tokens written after the error.
TEST(MemoryPlan, AMicroBatchThatRunsOutOfMemoryLeavesNothingReadingTheBatch) {
  const GptConfig config{2, 2, 64, 256, 32};
  EngineOptions options;
  options.stage = 3;
  auto peak_at = [&](std::int64_t sequences) {
    Gpt model(config);
    return predict_peak(plan_input(model, {sequences, config.seq_len}, options, 2, 1));
  };
  const std::size_t capacity = peak_at(2).device_total + 1024;
  ASSERT_GT(peak_at(8).device_total, capacity);
  WorldOptions world_options;
  world_options.ranks = 2;
  world_options.device_memory = capacity;
  world_options.collective_delay = std::chrono::milliseconds(20);
  World(world_options).run([&](RankContext& context) {
    Gpt model(config);
    Engine engine(context, options);
    auto trainer = engine.shard(model, make_optimizer(OptimizerOptions{}));
    std::vector<std::int32_t> tokens(8 * config.seq_len, 1);
    Batch batch{Tensor{tokens.data(), {8, config.seq_len}, DType::kInt32},
                Tensor{tokens.data(), {8, config.seq_len}, DType::kInt32}};
    EXPECT_THROW(trainer->forward_backward(batch), OutOfMemory);
    // Outside the vocabulary: an embedding that read these now would fail its stream.
    std::fill(tokens.begin(), tokens.end(), config.vocab_size + 7);
    EXPECT_NO_THROW(context.compute.synchronize());
  });
}

}  // namespace
}  // namespace zest
