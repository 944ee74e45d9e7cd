// measure_last_step_bubble: the last step's action slices of each rank against the step's span,
// from hand-made traces whose idle time and mean actions are known exactly; other slices (the
// engine's per-unit ones, sends) and earlier steps left out; traces it cannot split refused.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "base/error.h"
#include "pipeline/measured_bubble.h"

namespace zest {
namespace {

using ::testing::HasSubstr;

TraceRecorder::Slice action(int rank, const std::string& name, std::int64_t begin,
                            std::int64_t end, std::int64_t cpu = -1,
                            const std::string& track = "compute") {
  TraceRecorder::Slice slice;
  slice.rank = rank;
  slice.track = track;
  slice.name = name;
  slice.begin_us = begin;
  slice.end_us = end;
  slice.cpu_us = cpu;
  return slice;
}

// Two steps on two ranks, out of order. Step 2 spans [100, 150]: rank 0 is busy 10 + 20, rank 1
// 10 + 10 + 5, so 55 of 2 x 50 (idle 0.45); CPU time 8 + 15 and 9 + 7 + 4 (idle 0.57).
std::vector<TraceRecorder::Slice> two_steps() {
  return {
      action(1, "backward-weight of micro-batch 0", 140, 145, 4),
      action(0, "forward of micro-batch 0", 100, 110, 8),
      action(0, "backward of micro-batch 0", 130, 150, 15),
      action(1, "forward of micro-batch 0", 110, 120, 9),
      action(1, "backward-input of micro-batch 0", 120, 130, 7),
      // Step 1, far longer: it must not count.
      action(0, "forward of micro-batch 0", 0, 40, 30),
      action(0, "backward of micro-batch 0", 40, 90, 40),
      action(1, "forward of micro-batch 0", 40, 60, 20),
      action(1, "backward-input of micro-batch 0", 60, 80, 20),
      action(1, "backward-weight of micro-batch 0", 80, 95, 10),
      // Not actions: the engine's slices inside them, a send, a collective.
      action(0, "backward-input layer1", 131, 139, 8),
      action(1, "send gradients of micro-batch 0 to pipeline stage 0", 130, 160, 1, "send"),
      action(1, "all_reduce #3", 150, 170, 5, "comm"),
  };
}

TEST(MeasuredBubble, IdleFractionOfTheLastStepOverEveryRank) {
  const MeasuredBubble bubble = measure_last_step_bubble(two_steps(), 2);
  EXPECT_EQ(bubble.ranks, 2);
  EXPECT_DOUBLE_EQ(bubble.makespan_us, 50.0);
  EXPECT_DOUBLE_EQ(bubble.busy_us, 55.0);
  EXPECT_DOUBLE_EQ(bubble.idle_fraction, 0.45);
  EXPECT_DOUBLE_EQ(bubble.busy_cpu_us, 43.0);
  EXPECT_DOUBLE_EQ(bubble.cpu_idle_fraction, 0.57);
}

TEST(MeasuredBubble, MeanActionsAreTheSimulatorsCosts) {
  const MeasuredBubble bubble = measure_last_step_bubble(two_steps(), 2);
  // A whole backward and a backward-input both cost what the simulator calls backward_input.
  EXPECT_DOUBLE_EQ(bubble.mean_wall_us.forward, 10.0);
  EXPECT_DOUBLE_EQ(bubble.mean_wall_us.backward_input, 15.0);
  EXPECT_DOUBLE_EQ(bubble.mean_wall_us.backward_weight, 5.0);
  EXPECT_DOUBLE_EQ(bubble.mean_wall_us.transfer, 0.0);
  EXPECT_DOUBLE_EQ(bubble.mean_cpu_us.forward, 8.5);
  EXPECT_DOUBLE_EQ(bubble.mean_cpu_us.backward_input, 11.0);
  EXPECT_DOUBLE_EQ(bubble.mean_cpu_us.backward_weight, 4.0);
}

TEST(MeasuredBubble, OneStepIsTheWholeTraceAndNoWeightGradientCostsNothing) {
  const std::vector<TraceRecorder::Slice> slices = {
      action(0, "forward of micro-batch 0 (chunk 1)", 0, 10),
      action(0, "backward of micro-batch 0 (chunk 1)", 10, 30),
  };
  const MeasuredBubble bubble = measure_last_step_bubble(slices, 1);
  EXPECT_DOUBLE_EQ(bubble.idle_fraction, 0.0);
  EXPECT_DOUBLE_EQ(bubble.mean_wall_us.backward_weight, 0.0);
  // No CPU time recorded (a CUDA device, or a trace read from a file): said, not made up.
  EXPECT_EQ(bubble.busy_cpu_us, -1.0);
  EXPECT_EQ(bubble.cpu_idle_fraction, -1.0);
  EXPECT_EQ(bubble.mean_cpu_us.forward, -1.0);
}

TEST(MeasuredBubble, RefusesATraceItCannotSplitIntoSteps) {
  const auto refusal = [](const std::vector<TraceRecorder::Slice>& slices, int steps) {
    try {
      measure_last_step_bubble(slices, steps);
    } catch (const Error& error) {
      EXPECT_EQ(error.kind(), ErrorKind::kUsage);
      return std::string(error.what());
    }
    return std::string("accepted");
  };
  EXPECT_THAT(refusal(two_steps(), 3), HasSubstr("rank 0 has 4 action slices, not a multiple "
                                                 "of the 3 steps"));
  EXPECT_THAT(refusal({action(0, "all_reduce #0", 0, 1, -1, "comm")}, 1),
              HasSubstr("no pipeline action"));
  EXPECT_THAT(refusal(two_steps(), 0), HasSubstr("steps must be >= 1"));
}

TEST(MeasuredBubble, ActionsAreTheInterpretersSlicesOnly) {
  EXPECT_TRUE(is_pipeline_action("forward of micro-batch 3"));
  EXPECT_TRUE(is_pipeline_action("backward-weight of micro-batch 0 (chunk 1)"));
  EXPECT_FALSE(is_pipeline_action("backward-input layer1"));
  EXPECT_FALSE(is_pipeline_action("send activations of micro-batch 2 to pipeline stage 1"));
  EXPECT_FALSE(is_pipeline_action("receive gradients of micro-batch 1 from pipeline stage 1"));
}

}  // namespace
}  // namespace zest
