// A rank that fails in the middle of a pipeline step — its peers inside sends, receives and
// collectives that wait for it — ends every rank with an error naming it, within seconds, never
// a hang (debug.fault "throw" fires mid-schedule in a pipeline).
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "base/error.h"
#include "tests/pipeline/pipeline_test_support.h"

namespace zest::testing {
namespace {

void expect_named_failure(int stages, int data_parallel, int failing_rank, ScheduleKind kind) {
  PipelineSpec spec;
  spec.model = TestModel::kGpt;
  spec.stages = stages;
  spec.data_parallel = data_parallel;
  spec.zero_stage = 3;
  spec.pipeline.micro_batches = 4;
  spec.pipeline.schedule = kind;
  spec.configure_engine = [&](EngineOptions& options) {
    options.fault.kind = FaultInjection::Kind::kThrow;
    options.fault.rank = failing_rank;
    options.fault.step = 2;
  };
  const auto start = std::chrono::steady_clock::now();
  try {
    (void)train_pipeline(spec);
    ADD_FAILURE() << "the injected failure did not end the run";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("rank " + std::to_string(failing_rank)), std::string::npos) << message;
    EXPECT_NE(message.find("injected failure"), std::string::npos) << message;
    EXPECT_NE(message.find("at step 2"), std::string::npos) << message;
  }
  // The world's timeout is 30 s: the peers learnt of the failure, not of a timeout.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

TEST(PipelineFailure, AFailingRankMidScheduleEndsEveryRankNamingIt) {
  expect_named_failure(2, 2, 1, ScheduleKind::kOneFOneB);  // the first stage
  expect_named_failure(2, 2, 3, ScheduleKind::kZeroBubbleH1);  // the last stage
  expect_named_failure(4, 1, 2, ScheduleKind::kGPipe);  // a middle stage
}

}  // namespace
}  // namespace zest::testing
