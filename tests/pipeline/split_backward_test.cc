// Split backward in the pipeline: the MLP's layers offer it, so ZB-H1 runs their input
// gradients at B and their weight gradients at W; that gives the same bits as the whole backward
// at the same place (GPipe on one pipeline stage runs the same micro-batches in the same order).
// The GPT's blocks split too; a chunk with a unit that does not (embedding, head) runs its whole
// backward at B.
#include <gtest/gtest.h>

#include <string>
#include <vector>

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

// The GPT's blocks split; its embedding and head do not, so only a pipeline stage of blocks splits.
// At 3 pipeline stages with the blocks alone on the middle one, ZB-H1 matches one rank (the
// LayerNorms' parameter gradients are summed in another order, so not bit for bit).
TEST(SplitBackward, GptBlocksSplitOnAStageOfBlocksOnly) {
  PipelineSpec spec;
  spec.model = TestModel::kGpt;
  spec.stages = 3;
  spec.zero_stage = 2;
  spec.pipeline.micro_batches = 4;
  spec.pipeline.schedule = ScheduleKind::kZeroBubbleH1;
  spec.pipeline.units_per_virtual_stage = {2, 3, 1};  // embedding, block0 | block1-3 | head
  std::vector<int> splits(3, -1);
  spec.configure_trainer = [&](int rank, PipelineTrainer& trainer) {
    splits[static_cast<std::size_t>(rank)] = trainer.chunk_trainer(0).splits_backward() ? 1 : 0;
  };
  const TrainResult run = train_pipeline(spec);
  EXPECT_EQ(splits, (std::vector<int>{0, 1, 0}));
  std::string where;
  EXPECT_LE(worst_relative_difference(train_single(TestModel::kGpt, 3, 48), run, &where), 1.0)
      << where;
}

}  // namespace
}  // namespace zest::testing
