// Stages 2-3 in a shard group of one rank: a unit's shard is the whole unit, so stage 3 hands it
// out where it lies (no gather ring) and gradients accumulate into their shard (no buckets),
// with the host kept one unit ahead of compute in backward. The plan says so, the allocator
// measures it to the byte, one rank's stage 3 needs no more than its stage 0, and it trains to
// stage 0's numbers bit for bit.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "tests/planner/vocab_pieces_support.h"

namespace zest {
namespace {

using pieces_support::expect_measured_equals_planned;
using pieces_support::plan_gpt;

// A GPT whose embedding (512 x 16 + 8 x 16) is 2.5 blocks, as large_vocabulary_test's.
const GptConfig kWideVocabulary{/*n_layer=*/2, /*n_head=*/2, /*n_embd=*/16, /*vocab_size=*/512,
                                /*seq_len=*/8};
constexpr std::int64_t kSequences = 2;

TEST(OneRank, Stage3PlansNoGatherSlotNorBucket) {
  for (int stage : {2, 3}) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      SCOPED_TRACE("stage " + std::to_string(stage) + " " + dtype_name(dtype));
      const PeakPrediction one = plan_gpt(kWideVocabulary, kSequences, stage, 1, dtype);
      EXPECT_EQ(one.of(Category::kGather), 0u);
      EXPECT_EQ(one.of(Category::kBuckets), 0u);
    }
  }
  // Two ranks still gather and reduce through buckets.
  const PeakPrediction two = plan_gpt(kWideVocabulary, kSequences, 3, 2);
  EXPECT_GT(two.of(Category::kGather), 0u);
  EXPECT_GT(two.of(Category::kBuckets), 0u);
}

// Before: the embedding's gather slot and the blocks' buckets made one rank's stage 3 the
// larger (the 4 x 256 GPT at vocabulary 50257: 455 MiB against stage 0's 449 MiB).
TEST(OneRank, Stage3NeedsNoMoreThanStage0) {
  for (const GptConfig& config : {kWideVocabulary, GptConfig{4, 4, 256, 50257, 128}}) {
    const std::int64_t sequences = config.vocab_size > 1000 ? 4 : kSequences;
    const PeakPrediction stage0 = plan_gpt(config, sequences, 0, 1);
    const PeakPrediction stage3 = plan_gpt(config, sequences, 3, 1);
    EXPECT_LE(stage3.device_total, stage0.device_total) << config.vocab_size;
  }
}

TEST(OneRank, MeasuredEqualsPlannedToTheByte) {
  expect_measured_equals_planned(kWideVocabulary, kSequences, 1, DType::kFloat32, 1);
  expect_measured_equals_planned(kWideVocabulary, kSequences, 1, DType::kFloat32, 2);
  expect_measured_equals_planned(kWideVocabulary, kSequences, 1, DType::kBFloat16, 1);
  expect_measured_equals_planned(kWideVocabulary, kSequences, 1, DType::kFloat32, 1,
                                 RecomputePolicy::kFull);
}

struct Training {
  std::vector<float> losses;
  std::vector<float> grad_norms;
  std::vector<float> wte;
};

Training train_one_rank(int stage, int accumulation) {
  Training run;
  WorldOptions world_options;
  world_options.ranks = 1;
  World(world_options).run([&](RankContext& context) {
    Gpt model(kWideVocabulary);
    EngineOptions options = pieces_support::at_stage(stage);
    options.gradient_accumulation_steps = accumulation;
    Engine engine(context, options);
    auto trainer = engine.shard(model, make_optimizer(OptimizerOptions{}));
    std::mt19937 rng(7);
    std::uniform_int_distribution<std::int32_t> token(0, kWideVocabulary.vocab_size - 1);
    std::vector<std::int32_t> inputs(kSequences * kWideVocabulary.seq_len);
    std::vector<std::int32_t> targets(inputs.size());
    for (int step = 0; step < 3; ++step) {
      for (int micro = 0; micro < accumulation; ++micro) {
        for (auto& id : inputs) id = token(rng);
        for (auto& id : targets) id = token(rng);
        const Batch batch{
            Tensor{inputs.data(), {kSequences, kWideVocabulary.seq_len}, DType::kInt32},
            Tensor{targets.data(), {kSequences, kWideVocabulary.seq_len}, DType::kInt32}};
        run.losses.push_back(trainer->forward_backward(batch));
      }
      run.grad_norms.push_back(trainer->step().grad_norm);
    }
    run.wte = trainer->full_parameter(trainer->parameter_names().front());
  });
  return run;
}

// One rank has nothing to reduce: stage 3's gradients are stage 0's, summed in the same order
// (the tied embedding's two products into one buffer, micro-batch after micro-batch).
TEST(OneRank, Stage3TrainsAsStage0BitForBit) {
  for (int accumulation : {1, 2}) {
    SCOPED_TRACE("accumulation " + std::to_string(accumulation));
    const Training stage0 = train_one_rank(0, accumulation);
    const Training stage3 = train_one_rank(3, accumulation);
    EXPECT_EQ(stage0.losses, stage3.losses);
    EXPECT_EQ(stage0.grad_norms, stage3.grad_norms);
    EXPECT_EQ(stage0.wte, stage3.wte);
  }
}

}  // namespace
}  // namespace zest
