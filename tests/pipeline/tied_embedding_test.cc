// GPT's head borrows the embedding's wte across the first and last pipeline stage: the last
// pipeline stage trains a copy, and the two pipeline stages sum their reduced gradients before
// either updates. At 2×2 and ZeRO stages 2 and 3 (a data-parallel size where a sum of the wrong
// things — a full local gradient against a reduced shard — would show): the run matches one rank;
// the two copies end bit-identical; and with the cross-stage sum left out the same run is far from
// one rank, so the parity check sees the tied gradient.
#include <gtest/gtest.h>

#include <mutex>
#include <string>
#include <vector>

#include "tests/pipeline/pipeline_test_support.h"

namespace zest::testing {
namespace {

PipelineSpec tied_spec(int zero) {
  PipelineSpec spec;
  spec.model = TestModel::kGpt;
  spec.stages = 2;
  spec.data_parallel = 2;
  spec.zero_stage = zero;
  spec.pipeline.micro_batches = 4;
  spec.pipeline.schedule = ScheduleKind::kOneFOneB;
  return spec;
}

TEST(TiedEmbedding, CopiesOnTheFirstAndLastStageStayIdenticalAndMatchOneRank) {
  const TrainResult single = train_single(TestModel::kGpt, 3, 48);
  for (int zero : {0, 2, 3}) {
    PipelineSpec spec = tied_spec(zero);
    std::mutex mutex;
    std::vector<std::vector<float>> wte(4);  // per rank: its chunk's embedding.wte
    spec.after_training = [&](int rank, PipelineTrainer& trainer) {
      // Stage 0 owns the embedding; stage 1's only chunk holds the copy (its unit 0).
      std::vector<float> value = trainer.chunk_trainer(0).full_parameter("embedding.wte");
      const std::lock_guard<std::mutex> lock(mutex);
      wte[static_cast<std::size_t>(rank)] = std::move(value);
    };
    const TrainResult run = train_pipeline(spec);
    std::string where;
    EXPECT_LE(worst_relative_difference(single, run, &where), 1.0)
        << "zero " << zero << ": " << where;
    ASSERT_FALSE(wte[0].empty());
    EXPECT_EQ(wte[0], wte[2]) << "zero " << zero << ": the last pipeline stage's copy drifted";
    EXPECT_EQ(wte[1], wte[3]) << "zero " << zero;
  }
}

TEST(TiedEmbedding, LeavingTheCrossStageSumOutIsSeen) {
  const TrainResult single = train_single(TestModel::kGpt, 3, 48);
  for (int zero : {2, 3}) {
    PipelineSpec spec = tied_spec(zero);
    spec.configure_trainer = [](int, PipelineTrainer& trainer) { trainer.skip_tied_sum_for_tests(); };
    const TrainResult run = train_pipeline(spec);
    EXPECT_GT(worst_relative_difference(single, run), 100.0) << "zero " << zero;
  }
}

}  // namespace
}  // namespace zest::testing
