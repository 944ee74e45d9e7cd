// Split backward in the pipeline: the MLP's layers offer it, so ZB-H1 runs their input
// gradients at B and their weight gradients at W; that gives the same bits as the whole backward
// at the same place (GPipe on one stage runs the same micro-batches in the same order). The
// GPT's units do not split (yet): its chunks run the whole backward at B.
#include <gtest/gtest.h>

#include "tests/pipeline/pipeline_test_support.h"

namespace zest::testing {
namespace {

TEST(SplitBackward, WeightGradientsDeferredToWGiveTheSameBits) {
  for (int zero : {0, 2, 3}) {
    PipelineSpec whole;
    whole.model = TestModel::kMlp;
    whole.stages = 1;
    whole.data_parallel = 2;
    whole.zero_stage = zero;
    whole.pipeline.micro_batches = 3;
    whole.pipeline.schedule = ScheduleKind::kGPipe;
    PipelineSpec split = whole;
    split.pipeline.schedule = ScheduleKind::kZeroBubbleH1;
    bool splits = false;
    split.configure_trainer = [&](int rank, PipelineTrainer& trainer) {
      if (rank == 0) splits = trainer.chunk_trainer(0).splits_backward();
    };
    const TrainResult a = train_pipeline(whole);
    const TrainResult b = train_pipeline(split);
    EXPECT_TRUE(splits);
    EXPECT_EQ(a.losses, b.losses) << "zero " << zero;
    EXPECT_EQ(a.params, b.params) << "zero " << zero;
  }
}

TEST(SplitBackward, UnitsWithoutItRunTheWholeBackwardAtB) {
  PipelineSpec spec;
  spec.model = TestModel::kGpt;
  spec.stages = 2;
  spec.pipeline.micro_batches = 2;
  spec.pipeline.schedule = ScheduleKind::kZeroBubbleH1;
  bool splits = true;
  spec.configure_trainer = [&](int rank, PipelineTrainer& trainer) {
    if (rank == 0) splits = trainer.chunk_trainer(0).splits_backward();
  };
  const TrainResult run = train_pipeline(spec);
  EXPECT_FALSE(splits);
  EXPECT_LE(worst_relative_difference(train_single(TestModel::kGpt, 3, 48), run), 1.0);
}

}  // namespace
}  // namespace zest::testing
