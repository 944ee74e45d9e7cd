// The schedule check that runs before the first step: every generated schedule passes it at
// every shape; a schedule that would hang or compute wrongly fails with one line naming the
// schedule, the pipeline stage and the action; shapes a schedule cannot run are one-line
// kConfig errors naming the key.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "base/error.h"
#include "pipeline/schedule_generators.h"
#include "pipeline/schedule_simulator.h"
#include "tests/support/capture_error.h"

namespace zest {
namespace {

using ::testing::HasSubstr;
using testing::capture_error;

// The index of the first action of `pipeline_stage` equal to `action`.
std::size_t find(const Schedule& schedule, int pipeline_stage, const Action& action) {
  const auto& list = schedule.actions[pipeline_stage];
  const auto at = std::find(list.begin(), list.end(), action);
  EXPECT_NE(at, list.end()) << describe_action(action);
  return static_cast<std::size_t>(at - list.begin());
}

std::string check_message(const Schedule& schedule) {
  const Error error = capture_error([&] { (void)simulate_schedule(schedule); });
  EXPECT_EQ(error.kind(), ErrorKind::kUsage);
  EXPECT_EQ(std::string(error.what()).find('\n'), std::string::npos) << error.what();
  return error.what();
}

TEST(ScheduleSimulator, EveryGeneratedScheduleChecksOutAtEveryShape) {
  for (int p = 1; p <= 5; ++p) {
    for (int m = 1; m <= 10; ++m) {
      for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB,
                                ScheduleKind::kZeroBubbleH1}) {
        const Schedule schedule = make_schedule(kind, p, m);
        EXPECT_NO_THROW((void)simulate_schedule(schedule)) << schedule.name;
      }
      for (int v = 2; v <= 3 && m % p == 0; ++v) {
        EXPECT_NO_THROW((void)simulate_schedule(interleaved_schedule(p, m, v))) << p << m << v;
      }
    }
  }
}

TEST(ScheduleSimulator, FewerMicroBatchesThanStagesStillRunsUnder1F1B) {
  // The users' hang with micro-batches < pipeline stages: here it is a schedule that checks out.
  const ScheduleSimulation run = simulate_schedule(one_f_one_b_schedule(4, 2));
  EXPECT_NEAR(run.makespan, 3.0 * (2 + 4 - 1), 1e-12);
}

TEST(ScheduleSimulator, ASendNobodyReceivesIsNamed) {
  Schedule schedule = one_f_one_b_schedule(2, 2);
  auto& list = schedule.actions[1];
  list.erase(list.begin() + static_cast<std::ptrdiff_t>(
                                find(schedule, 1, {ActionKind::kReceiveActivations, 1, 0, 0})));
  EXPECT_THAT(check_message(schedule),
              HasSubstr("pipeline schedule 1f1b (2 pipeline stages, 2 micro-batches): pipeline "
                        "stage 1 runs forward of micro-batch 1 before receiving its activations"));
}

TEST(ScheduleSimulator, ReceivesInAnotherOrderThanTheSendsAreAMismatch) {
  Schedule schedule = gpipe_schedule(2, 2);
  auto& list = schedule.actions[1];
  std::swap(list[find(schedule, 1, {ActionKind::kReceiveActivations, 0, 0, 0})],
            list[find(schedule, 1, {ActionKind::kReceiveActivations, 1, 0, 0})]);
  EXPECT_THAT(check_message(schedule),
              HasSubstr("pipeline stage 1 runs receive activations of micro-batch 1 from "
                        "pipeline stage 0, but the next transfer pipeline stage 0 sends it is "
                        "activations of micro-batch 0"));
}

TEST(ScheduleSimulator, StagesThatBothReceiveFirstAreADeadlock) {
  Schedule schedule = one_f_one_b_schedule(2, 1);
  // Stage 0 waits for gradients before sending its activations.
  auto& list = schedule.actions[0];
  std::swap(list[find(schedule, 0, {ActionKind::kReceiveGradients, 0, 0, 1})],
            list[find(schedule, 0, {ActionKind::kSendActivations, 0, 0, 1})]);
  EXPECT_THAT(check_message(schedule),
              HasSubstr("deadlock: pipeline stage 0 waits at action 1 (receive gradients of "
                        "micro-batch 0 from pipeline stage 1), which pipeline stage 1 sends only "
                        "later or never; pipeline stage 1 waits at action 0 (receive activations "
                        "of micro-batch 0 from pipeline stage 0)"));
}

TEST(ScheduleSimulator, ARankWaitingOnItselfIsRefused) {
  Schedule schedule = gpipe_schedule(2, 1);
  schedule.actions[0][find(schedule, 0, {ActionKind::kSendActivations, 0, 0, 1})].peer = 0;
  EXPECT_THAT(check_message(schedule), HasSubstr("a rank cannot wait on itself"));
}

TEST(ScheduleSimulator, AMicroBatchWithoutItsBackwardIsNamed) {
  Schedule schedule = gpipe_schedule(1, 2);
  auto& list = schedule.actions[0];
  list.erase(list.begin() + static_cast<std::ptrdiff_t>(
                                find(schedule, 0, {ActionKind::kBackward, 1, 0, -1})));
  EXPECT_THAT(check_message(schedule),
              HasSubstr("pipeline stage 0 runs reduce before the weight gradient of micro-batch 1"));
}

TEST(ScheduleSimulator, AWeightGradientBeforeItsInputGradientIsNamed) {
  Schedule schedule = zero_bubble_h1_schedule(1, 1);
  auto& list = schedule.actions[0];
  std::swap(list[find(schedule, 0, {ActionKind::kBackwardInput, 0, 0, -1})],
            list[find(schedule, 0, {ActionKind::kBackwardWeight, 0, 0, -1})]);
  EXPECT_THAT(check_message(schedule),
              HasSubstr("pipeline stage 0 runs backward-weight of micro-batch 0 before its "
                        "backward-input"));
}

TEST(ScheduleSimulator, ShapesAScheduleCannotRunAreOneLineConfigErrors) {
  using testing::error_message;
  EXPECT_THAT(error_message([] { (void)interleaved_schedule(4, 6, 2); }, ErrorKind::kConfig),
              HasSubstr("pipeline.micro_batches: interleaved_1f1b runs micro-batches in groups of "
                        "the 4 pipeline stages, so it needs a multiple of 4, got 6"));
  EXPECT_THAT(error_message([] { (void)interleaved_schedule(2, 4, 1); }, ErrorKind::kConfig),
              HasSubstr("pipeline.virtual_chunks: interleaved_1f1b needs at least 2"));
  EXPECT_THAT(error_message([] { (void)make_schedule(ScheduleKind::kOneFOneB, 2, 4, 2); },
                            ErrorKind::kConfig),
              HasSubstr("pipeline.virtual_chunks: 2 chunks per pipeline stage need schedule "
                        "interleaved_1f1b, not 1f1b"));
  EXPECT_THAT(error_message([] { (void)one_f_one_b_schedule(2, 0); }, ErrorKind::kConfig),
              HasSubstr("pipeline.micro_batches: must be >= 1, got 0"));
  EXPECT_THAT(error_message([] { (void)gpipe_schedule(0, 4); }, ErrorKind::kConfig),
              HasSubstr("pipeline.stages: must be >= 1, got 0"));
  EXPECT_THAT(error_message([] { (void)parse_schedule_kind("1F1B"); }, ErrorKind::kConfig),
              HasSubstr("pipeline.schedule: '1F1B' is not a schedule (allowed: gpipe, 1f1b, "
                        "interleaved_1f1b, zb_h1)"));
  EXPECT_EQ(parse_schedule_kind("zb_h1"), ScheduleKind::kZeroBubbleH1);
}

TEST(ScheduleSimulator, GeneratedTransfersSitNextToWhatMakesAndNeedsThem) {
  const Schedule schedule = one_f_one_b_schedule(2, 1);
  EXPECT_EQ(schedule.actions[0],
            (std::vector<Action>{{ActionKind::kForward, 0, 0, -1},
                                 {ActionKind::kSendActivations, 0, 0, 1},
                                 {ActionKind::kReceiveGradients, 0, 0, 1},
                                 {ActionKind::kBackward, 0, 0, -1},
                                 {ActionKind::kReduce, -1, 0, -1},
                                 {ActionKind::kStep, -1, 0, -1}}));
}

}  // namespace
}  // namespace zest
