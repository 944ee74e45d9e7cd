// The per-pipeline-stage peak plan against hand-computed bytes: a toy model of four units of 64
// fp32 parameters (256 bytes each, no padding at 1 or 2 ranks), each leaving a 100-byte output
// and 1000 saved bytes per micro-batch, on 2 pipeline stages.
#include "planner/pipeline_plan.h"

#include <cstdint>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/error.h"
#include "kernels/gradient_statistics.h"
#include "pipeline/schedule_generators.h"

namespace zest {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr std::size_t kUnitBytes = 64 * sizeof(float);
constexpr std::size_t kOutput = 100;
constexpr std::size_t kSaved = 1000;
constexpr std::size_t kKept = kOutput + kSaved;  // per unit and micro-batch

// `tied`: the last unit borrows the first (the GPT's head and embedding).
PeakPlanInput toy_model(int pipeline_stage, int data_parallel, int micro_batches,
                        bool tied = false) {
  PeakPlanInput input;
  for (int u = 0; u < 4; ++u) {
    UnitShapes shapes{"unit" + std::to_string(u), {{"w", {64}}}, {}, false};
    if (tied && u == 3) shapes.borrowed = {0};
    input.model.units.push_back(shapes);
    UnitMemory memory;
    memory.output = kOutput;
    memory.saved = kSaved;
    input.units.push_back(memory);
  }
  input.model.optimizer_states = 2;
  input.engine.stage = pipeline_stage;
  input.engine.gradient_accumulation_steps = micro_batches;
  input.world_size = data_parallel;
  return input;
}

PipelinePlanInput pipeline(PeakPlanInput model, ScheduleKind kind, std::vector<std::size_t> split,
                           int micro_batches, int chunks = 1) {
  PipelinePlanInput input;
  input.model = std::move(model);
  input.units_per_virtual_stage = std::move(split);
  input.schedule = make_schedule(kind, 2, micro_batches, chunks);
  return input;
}

// The replay's constant workspace: the loss and the gradient checks' slot per unit and the norm.
std::size_t fixed_workspace(std::size_t units) {
  return sizeof(float) + (units + 1) * sizeof(GradientStatistics);
}

// What a pipeline stage's trainer adds to it: each micro-batch's loss slot, and the 64-byte shape
// header of the first activations it sends or receives in a step (pipeline/interpreter.cc).
std::size_t pipeline_workspace(int micro_batches) {
  return static_cast<std::size_t>(micro_batches) * sizeof(float) + 8 * sizeof(std::int64_t);
}

TEST(PipelinePlan, OneFOneBHoldsTwoMicroBatchesOnTheFirstStageAndOneOnTheLast) {
  const auto peaks =
      predict_pipeline_peaks(pipeline(toy_model(0, 1, 4), ScheduleKind::kOneFOneB, {2, 2}, 4));
  ASSERT_EQ(peaks.size(), 2u);
  EXPECT_THAT(peaks[0].units, ElementsAre(0, 1));
  EXPECT_THAT(peaks[1].units, ElementsAre(2, 3));
  EXPECT_EQ(peaks[0].peak_in_flight, 2);
  EXPECT_EQ(peaks[1].peak_in_flight, 1);
  // Stage 0: two micro-batches of 2 units kept, and the gradient of its output (unit 1's).
  EXPECT_EQ(peaks[0].kept_per_micro_batch, 2 * kKept);
  EXPECT_EQ(peaks[0].in_flight_activations, 2 * 2 * kKept);
  EXPECT_EQ(peaks[0].received_gradients, kOutput);
  EXPECT_EQ(peaks[0].peak.of(Category::kActivations), 4 * kKept + kOutput);
  // Stage 1: one micro-batch, and the activations it received (unit 1's output) with it.
  EXPECT_EQ(peaks[1].received_activations, kOutput);
  EXPECT_EQ(peaks[1].in_flight_activations, 2 * kKept + kOutput);
  EXPECT_EQ(peaks[1].received_gradients, 0u);
  EXPECT_EQ(peaks[1].peak.of(Category::kActivations), 2 * kKept + kOutput);
  for (const PipelineStagePeak& peak : peaks) {
    // Stage 0 on one rank: params, grads and AdamW's two moments of its two units.
    EXPECT_EQ(peak.peak.of(Category::kParams), 2 * kUnitBytes);
    EXPECT_EQ(peak.peak.of(Category::kGrads), 2 * kUnitBytes);
    EXPECT_EQ(peak.peak.of(Category::kOptimizer), 2 * 2 * kUnitBytes);
    EXPECT_EQ(peak.peak.of(Category::kWorkspace), fixed_workspace(2) + pipeline_workspace(4));
    // Stage 0 keeps the header it sent until the step's end; stage 1 frees the one it received
    // once read, before its activations peak.
    const std::size_t header = peak.pipeline_stage == 0 ? 8 * sizeof(std::int64_t) : 0;
    EXPECT_EQ(peak.peak.device_total, 8 * kUnitBytes + peak.peak.of(Category::kActivations) +
                                          fixed_workspace(2) + 4 * sizeof(float) + header);
  }
}

TEST(PipelinePlan, GPipeHoldsEveryMicroBatch) {
  const auto peaks =
      predict_pipeline_peaks(pipeline(toy_model(0, 1, 4), ScheduleKind::kGPipe, {2, 2}, 4));
  EXPECT_EQ(peaks[0].peak_in_flight, 4);
  EXPECT_EQ(peaks[0].peak.of(Category::kActivations), 4 * 2 * kKept + kOutput);
  EXPECT_EQ(peaks[1].peak_in_flight, 4);
  EXPECT_EQ(peaks[1].peak.of(Category::kActivations), 4 * (2 * kKept + kOutput));
}

TEST(PipelinePlan, OnePipelineStageIsThePlanOfTheWholeModel) {
  PipelinePlanInput input;
  input.model = toy_model(2, 2, 3);
  input.units_per_virtual_stage = {4};
  input.schedule = make_schedule(ScheduleKind::kOneFOneB, 1, 3);
  const auto peaks = predict_pipeline_peaks(input);
  ASSERT_EQ(peaks.size(), 1u);
  PeakPrediction whole = predict_peak(input.model);
  // The pipeline's trainer keeps each micro-batch's loss (3 here); nothing crosses pipeline stages.
  whole.peak[static_cast<std::size_t>(Category::kWorkspace)] += 3 * sizeof(float);
  whole.device_total += 3 * sizeof(float);
  EXPECT_EQ(peaks[0].peak.peak, whole.peak);
  EXPECT_EQ(peaks[0].peak.device_total, whole.device_total);
}

TEST(PipelinePlan, TheLastStageHoldsACopyOfTheTiedUnit) {
  const auto peaks = predict_pipeline_peaks(
      pipeline(toy_model(1, 2, 4, /*tied=*/true), ScheduleKind::kOneFOneB, {2, 2}, 4));
  EXPECT_THAT(peaks[0].tied_copies, ElementsAre());
  EXPECT_THAT(peaks[1].tied_copies, ElementsAre(0));
  // Stage 1 on 2 ranks: full params and grads, the optimizer's shard (half of 2 x 256 bytes).
  EXPECT_EQ(peaks[0].peak.of(Category::kParams), 2 * kUnitBytes);
  EXPECT_EQ(peaks[1].peak.of(Category::kParams), 3 * kUnitBytes);
  EXPECT_EQ(peaks[1].peak.of(Category::kOptimizer), 3 * kUnitBytes);
  // The copy computes nothing: the activations are the two own units' and the received input.
  EXPECT_EQ(peaks[1].peak.of(Category::kActivations), 2 * kKept + kOutput);
}

TEST(PipelinePlan, StageThreeWithoutReshardKeepsTheStagesUnitsGathered) {
  PipelinePlanInput input =
      pipeline(toy_model(3, 2, 4), ScheduleKind::kOneFOneB, {3, 1}, 4);
  const auto resharded = predict_pipeline_peaks(input);
  input.reshard_after_forward = false;
  const auto kept = predict_pipeline_peaks(input);
  EXPECT_EQ(resharded[0].gathered_for_step, 0u);
  // Shards of 32 elements each; gathered, stage 0's three units are whole for the step.
  EXPECT_EQ(kept[0].peak.of(Category::kParams), 3 * kUnitBytes / 2);
  EXPECT_EQ(kept[0].gathered_for_step, 3 * kUnitBytes);
  EXPECT_EQ(kept[0].peak.of(Category::kGather), 3 * kUnitBytes);
  EXPECT_GE(kept[0].peak.of(Category::kGather), resharded[0].peak.of(Category::kGather));
  EXPECT_EQ(kept[0].peak.device_total - resharded[0].peak.device_total,
            3 * kUnitBytes - resharded[0].peak.of(Category::kGather));
}

TEST(PipelinePlan, InterleavedStagesHoldTheirChunksUnitsAndReceiveEachChunksInput) {
  const auto peaks = predict_pipeline_peaks(pipeline(
      toy_model(0, 1, 4), ScheduleKind::kInterleavedOneFOneB, {1, 1, 1, 1}, 4, /*chunks=*/2));
  EXPECT_THAT(peaks[0].units, ElementsAre(0, 2));
  EXPECT_THAT(peaks[1].units, ElementsAre(1, 3));
  // Stage 0 receives chunk 1's input from unit 1; stage 1 both chunks' (units 0 and 2).
  EXPECT_EQ(peaks[0].received_activations, kOutput);
  EXPECT_EQ(peaks[1].received_activations, 2 * kOutput);
  EXPECT_EQ(peaks[0].kept_per_micro_batch, 2 * kKept + kOutput);
  // Megatron's order on stage 0: warm-up forwards chunk 0 of micro-batches 0, 1, chunk 1 of 0, 1,
  // then chunk 0 of 2 before the first backward: five in flight, two of them chunk 1's with
  // their received input.
  EXPECT_EQ(peaks[0].peak_in_flight, 5);
  EXPECT_EQ(peaks[0].in_flight_activations, 5 * kKept + 2 * kOutput);
}

TEST(PipelinePlan, StagesRecomputeAsTheWholeModelDoes) {
  // The first unit can never recompute (an embedding); alone on pipeline stage 0 it recomputes
  // nothing, and stage 1's units recompute fully but its last, as the whole model's plan says.
  PeakPlanInput model = toy_model(0, 1, 4);
  model.model.units[0].gradients_replace_parameters = true;
  model.engine.activation_checkpointing.policy = RecomputePolicy::kFull;
  const auto peaks =
      predict_pipeline_peaks(pipeline(model, ScheduleKind::kOneFOneB, {1, 3}, 4));
  EXPECT_EQ(peaks[0].kept_per_micro_batch, kKept);
  EXPECT_EQ(peaks[1].kept_per_micro_batch, 3 * kOutput + kSaved + kOutput);
  EXPECT_EQ(peaks[1].in_flight_activations, 3 * kOutput + kSaved + kOutput);
}

TEST(PipelinePlan, MemoryCostWeighsActivationsByTheMicroBatchesInFlight) {
  const PeakPlanInput model = toy_model(0, 1, 4);
  const UnitCost cost = pipeline_memory_cost(model, make_schedule(ScheduleKind::kOneFOneB, 2, 4));
  const std::size_t state = kUnitBytes + kUnitBytes + 2 * kUnitBytes;
  EXPECT_EQ(cost(0, 1), state + 2 * kKept);
  EXPECT_EQ(cost(1, 1), state + 1 * kKept);
  // Four equal units: 1 + 3 (3224 and 6372 bytes) beats 2 + 2 (6448 and 4248).
  EXPECT_THAT(balanced_partition(4, 2, cost), ElementsAre(1, 3));
}

TEST(PipelinePlan, APartitionThatDoesNotFitTheScheduleIsAConfigError) {
  try {
    predict_pipeline_peaks(pipeline(toy_model(0, 1, 4), ScheduleKind::kOneFOneB, {1, 1, 2}, 4));
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kConfig);
    EXPECT_THAT(error.what(), HasSubstr("pipeline.partition: 3 virtual stages partitioned"));
  }
}

}  // namespace
}  // namespace zest
