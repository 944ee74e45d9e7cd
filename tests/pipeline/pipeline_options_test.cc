// PipelineOptions::validate: every shape the interpreter cannot run is one kConfig line naming
// the key; the uniform partition puts the remainder on the first virtual stages.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "base/error.h"
#include "pipeline/pipeline_options.h"

namespace zest {
namespace {

using ::testing::HasSubstr;

std::string refusal(const PipelineOptions& options, std::size_t units) {
  try {
    options.validate(units);
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kConfig);
    const std::string message = error.what();
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    return message;
  }
  return "accepted";
}

PipelineOptions options(int pipeline_stages, int micro_batches,
                        ScheduleKind kind = ScheduleKind::kOneFOneB, int chunks = 1) {
  PipelineOptions result;
  result.stages = pipeline_stages;
  result.micro_batches = micro_batches;
  result.schedule = kind;
  result.virtual_chunks = chunks;
  return result;
}

TEST(PipelineOptions, RefusesWhatCannotRunNamingTheKey) {
  EXPECT_THAT(refusal(options(0, 4), 8), HasSubstr("pipeline.stages: must be >= 1"));
  EXPECT_THAT(refusal(options(2, 0), 8), HasSubstr("pipeline.micro_batches: must be >= 1"));
  EXPECT_THAT(refusal(options(2, 4, ScheduleKind::kOneFOneB, 0), 8),
              HasSubstr("pipeline.virtual_chunks: must be >= 1"));
  EXPECT_THAT(refusal(options(2, 4, ScheduleKind::kOneFOneB, 2), 8),
              HasSubstr("pipeline.virtual_chunks: 1f1b runs one chunk per pipeline stage"));
  EXPECT_THAT(refusal(options(2, 4, ScheduleKind::kInterleavedOneFOneB, 1), 8),
              HasSubstr("pipeline.virtual_chunks: interleaved_1f1b needs >= 2"));
  EXPECT_THAT(refusal(options(4, 6, ScheduleKind::kInterleavedOneFOneB, 2), 16),
              HasSubstr("pipeline.micro_batches: interleaved_1f1b needs a multiple of "
                        "pipeline.stages (4), got 6"));
  EXPECT_THAT(refusal(options(4, 2, ScheduleKind::kInterleavedOneFOneB, 2), 16),
              HasSubstr("pipeline.micro_batches"));  // fewer than the pipeline stages
  EXPECT_THAT(
      refusal(options(4, 8), 3),
      HasSubstr("pipeline.partition: the model has 3 units, fewer than its 4 virtual stages"));
  PipelineOptions partition = options(2, 4);
  partition.units_per_virtual_stage = {3, 0};
  EXPECT_THAT(refusal(partition, 3),
              HasSubstr("pipeline.partition: [1] is 0: virtual stage 1 would hold no unit"));
  partition.units_per_virtual_stage = {2, 2};
  EXPECT_THAT(refusal(partition, 5), HasSubstr("pipeline.partition: the list sums to 4 units, "
                                               "but the model has 5"));
  partition.units_per_virtual_stage = {2, 2, 1};
  EXPECT_THAT(
      refusal(partition, 5),
      HasSubstr("pipeline.partition: lists 3 entries, not one per virtual stage (2"));
}

TEST(PipelineOptions, FewerMicroBatchesThanStagesRunUnderGPipeOneFOneBAndZeroBubble) {
  EXPECT_EQ(refusal(options(4, 2, ScheduleKind::kGPipe), 8), "accepted");
  EXPECT_EQ(refusal(options(4, 2, ScheduleKind::kOneFOneB), 8), "accepted");
  EXPECT_EQ(refusal(options(4, 1, ScheduleKind::kZeroBubbleH1), 8), "accepted");
}

TEST(PipelineOptions, UniformPartitionPutsTheRemainderFirst) {
  EXPECT_EQ(options(3, 4).partition(7), (std::vector<std::size_t>{3, 2, 2}));
  EXPECT_EQ(options(2, 4, ScheduleKind::kInterleavedOneFOneB, 2).partition(6),
            (std::vector<std::size_t>{2, 2, 1, 1}));
  PipelineOptions explicit_split = options(2, 4);
  explicit_split.units_per_virtual_stage = {1, 4};
  EXPECT_EQ(explicit_split.partition(5), (std::vector<std::size_t>{1, 4}));
}

}  // namespace
}  // namespace zest
