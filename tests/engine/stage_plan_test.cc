// The stage plan against the design (docs/architecture.md): its memory table (what each stage
// shards, and the bytes per rank that follow: 2Ψ + 2Ψ + 12Ψ, each term divided by N once its state
// is sharded) and its step (when gradients are reduced and parameters gathered).
#include <gtest/gtest.h>

#include <string>

#include "base/error.h"
#include "engine/model_state.h"
#include "engine/stage_plan.h"

namespace zest {
namespace {

// docs/architecture.md, "Sharding: flat units": | stage | what is sharded |, one row per stage,
// each adding to the last.
struct DesignRow {
  int stage;
  bool optimizer, grads, params;  // sharded
};
constexpr DesignRow kDesignTable[] = {
    {0, false, false, false},  // nothing (DDP)
    {1, true, false, false},   // optimizer state
    {2, true, true, false},    // + gradients
    {3, true, true, true},     // + parameters
};

TEST(StagePlan, ShardsWhatDesignsMemoryTableSays) {
  ASSERT_EQ(StagePlan::kStages, 4);
  for (const DesignRow& row : kDesignTable) {
    const StagePlan plan = StagePlan::of(row.stage);
    EXPECT_EQ(plan.stage, row.stage);
    EXPECT_EQ(plan.optimizer_sharded, row.optimizer) << "stage " << row.stage;
    EXPECT_EQ(plan.grads_sharded, row.grads) << "stage " << row.stage;
    EXPECT_EQ(plan.params_sharded, row.params) << "stage " << row.stage;
    EXPECT_EQ(plan.can_offload_optimizer(), row.optimizer) << "stage " << row.stage;
  }
}

TEST(StagePlan, ReducesAndGathersWhenDesignsStepSays) {
  // Stage 0 all-reduces, stages 1-3 reduce-scatter.
  EXPECT_EQ(StagePlan::of(0).reduction, GradientReduction::kAllReduce);
  for (int stage = 1; stage < StagePlan::kStages; ++stage) {
    EXPECT_EQ(StagePlan::of(stage).reduction, GradientReduction::kReduceScatter) << stage;
  }
  // Stages >= 2 reduce each unit right after its backward, every micro-batch; stages 0-1 in
  // buckets, once per step.
  for (int stage = 0; stage < StagePlan::kStages; ++stage) {
    const StagePlan plan = StagePlan::of(stage);
    EXPECT_EQ(plan.reduce_per_unit, stage >= 2) << stage;
    EXPECT_EQ(plan.reduce_every_micro_batch, stage >= 2) << stage;
  }
  // Stage 3 gathers before each unit's forward and backward; stages 1-2 after the step.
  EXPECT_EQ(StagePlan::of(0).gathers, ParameterGathers::kNever);
  EXPECT_TRUE(StagePlan::of(1).gathers_after_step());
  EXPECT_TRUE(StagePlan::of(2).gathers_after_step());
  EXPECT_TRUE(StagePlan::of(3).gathers_before_each_use());
  EXPECT_FALSE(StagePlan::of(3).gathers_after_step());
}

TEST(StagePlan, GivesDesignsBytesPerRank) {
  // One unit of Ψ elements that divides evenly, bf16 with AdamW (K = 12: master + two moments).
  constexpr std::size_t kPsi = 4096;
  constexpr int kRanks = 4;
  ModelStateShape model;
  model.compute_dtype = DType::kBFloat16;
  model.optimizer_states = 2;
  model.alignment = 1;
  model.units.push_back({"unit", {{"w", {static_cast<std::int64_t>(kPsi)}}}, {}});
  const std::size_t expected[] = {
      2 * kPsi + 2 * kPsi + 12 * kPsi,
      2 * kPsi + 2 * kPsi + 12 * kPsi / kRanks,
      2 * kPsi + (2 * kPsi + 12 * kPsi) / kRanks,
      (2 * kPsi + 2 * kPsi + 12 * kPsi) / kRanks,
  };
  for (int stage = 0; stage < StagePlan::kStages; ++stage) {
    EXPECT_EQ(predict_model_state(model, stage, kRanks).total(), expected[stage]) << stage;
  }
}

TEST(StagePlan, RefusesAStageOutsideZeroToThree) {
  for (int stage : {-1, 4}) {
    EXPECT_FALSE(StagePlan::valid(stage));
    try {
      StagePlan::of(stage);
      FAIL() << "stage " << stage << " accepted";
    } catch (const Error& error) {
      EXPECT_EQ(error.kind(), ErrorKind::kConfig);
      EXPECT_NE(std::string(error.what()).find("zero_optimization.stage: must be 0, 1, 2 or 3"),
                std::string::npos)
          << error.what();
    }
  }
}

// DeepSpeed's rules, written here as a table independent of StagePlan's columns: which stages
// serve each feature (offload and qgZ from stage 1, qwZ, hpZ and keeping a pipeline stage's
// units gathered only at stage 3).
TEST(StagePlan, ServesEachFeatureAtTheStagesDeepSpeedAllows) {
  struct Rule {
    StageFeature feature;
    int lowest;  // served from this stage up
  };
  const Rule rules[] = {{StageFeature::kOffloadOptimizer, 1},
                        {StageFeature::kOffloadParameters, 3},
                        {StageFeature::kQuantizedGradients, 1},
                        {StageFeature::kQuantizedWeights, 3},
                        {StageFeature::kSecondaryShard, 3},
                        {StageFeature::kGatheredForStep, 3}};
  for (const Rule& rule : rules) {
    for (int stage = 0; stage < StagePlan::kStages; ++stage) {
      EXPECT_EQ(StagePlan::of(stage).serves(rule.feature), stage >= rule.lowest)
          << "feature " << static_cast<int>(rule.feature) << " at stage " << stage;
    }
  }
  EXPECT_EQ(StagePlan::kFullySharded, 3);
  EXPECT_TRUE(StagePlan::of(StagePlan::kFullySharded).params_sharded);
}

// The words users read (the config's, the engine's and the planner's errors all end in them).
TEST(StagePlan, RefusalNamesTheStagesThatServeAndWhy) {
  EXPECT_EQ(StagePlan::of(0).refusal(StageFeature::kOffloadOptimizer),
            "needs zero_optimization.stage 1, 2 or 3 (got 0): only a sharded optimizer state is "
            "offloaded");
  EXPECT_EQ(StagePlan::of(2).refusal(StageFeature::kOffloadParameters),
            "needs zero_optimization.stage 3 (got 2): only stage 3 shards the parameters, and a "
            "full copy would not leave the device");
  EXPECT_EQ(StagePlan::of(0).refusal(StageFeature::kQuantizedGradients),
            "needs zero_optimization.stage 1, 2 or 3 (got 0): stage 0 all-reduces gradients "
            "instead of reduce-scattering them");
  EXPECT_EQ(StagePlan::of(2).refusal(StageFeature::kQuantizedWeights),
            "needs zero_optimization.stage 3 (got 2): only stage 3 gathers parameters before "
            "each use");
  EXPECT_EQ(StagePlan::of(1).refusal(StageFeature::kSecondaryShard),
            "needs zero_optimization.stage 3 (got 1): only stage 3 gathers parameters in "
            "backward");
  EXPECT_EQ(StagePlan::of(0).refusal(StageFeature::kGatheredForStep),
            "needs zero_optimization.stage 3 (got 0): only stage 3 gathers parameters per "
            "micro-batch");
}

}  // namespace
}  // namespace zest
