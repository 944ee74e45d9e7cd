// The schedules against values computed with DeepSpeed's formulas (lr_schedules.py, in Python,
// float64) at last_batch_iteration = step - 1.
#include "optim/lr_schedule.h"

#include <gtest/gtest.h>

#include "base/error.h"

namespace zest {
namespace {

// float32 results of float64 formulas: 1e-6 relative covers the final rounding.
void expect_rate(const LrSchedule& schedule, std::int64_t step, double expected) {
  EXPECT_NEAR(schedule.lr_at(step), expected, 1e-6 * expected + 1e-12) << "step " << step;
}

TEST(LrSchedule, ConstantWithoutAType) {
  LrSchedule schedule({}, 0.003f);
  expect_rate(schedule, 1, 0.003);
  expect_rate(schedule, 1000, 0.003);
}

TEST(LrSchedule, WarmupLRLogMatchesDeepSpeed) {
  LrScheduleOptions options{.type = "WarmupLR", .warmup_min_lr = 0.0001f, .warmup_max_lr = 0.01f,
                            .warmup_num_steps = 10, .warmup_type = "log"};
  LrSchedule schedule(options, 0.5f);
  expect_rate(schedule, 1, 0.0001);
  expect_rate(schedule, 2, 0.0030801969570734135);
  expect_rate(schedule, 5, 0.007019803042926586);
  expect_rate(schedule, 10, 0.01);
  expect_rate(schedule, 50, 0.01);
}

TEST(LrSchedule, WarmupLRLinearMatchesDeepSpeed) {
  LrScheduleOptions options{.type = "WarmupLR", .warmup_max_lr = 0.01f, .warmup_num_steps = 10,
                            .warmup_type = "linear"};
  LrSchedule schedule(options, 0.5f);
  expect_rate(schedule, 2, 0.001);
  expect_rate(schedule, 5, 0.004);
  expect_rate(schedule, 10, 0.009);
  expect_rate(schedule, 11, 0.01);
}

TEST(LrSchedule, WarmupDecayLRMatchesDeepSpeed) {
  LrScheduleOptions options{.type = "WarmupDecayLR", .warmup_max_lr = 0.01f,
                            .warmup_num_steps = 10, .warmup_type = "linear",
                            .total_num_steps = 50};
  LrSchedule schedule(options, 0.5f);
  expect_rate(schedule, 5, 0.004);
  expect_rate(schedule, 11, 0.01);
  expect_rate(schedule, 50, 0.00025);
}

TEST(LrSchedule, WarmupCosineLRMatchesDeepSpeed) {
  LrScheduleOptions options{.type = "WarmupCosineLR", .warmup_num_steps = 10,
                            .warmup_type = "linear", .total_num_steps = 50,
                            .warmup_min_ratio = 0.1f, .cos_min_ratio = 0.001f};
  LrSchedule schedule(options, 0.01f);
  expect_rate(schedule, 1, 0.001);
  expect_rate(schedule, 2, 0.0019);
  expect_rate(schedule, 5, 0.004600000000000001);
  expect_rate(schedule, 11, 0.009984602081996976);
  expect_rate(schedule, 50, 1e-05);
}

TEST(LrSchedule, BadParametersNameTheKey) {
  try {
    LrSchedule({.type = "WarmupDecayLR", .warmup_num_steps = 10, .total_num_steps = 5}, 0.1f);
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kConfig);
    EXPECT_NE(std::string(error.what()).find("scheduler.params.total_num_steps"), std::string::npos);
  }
  try {
    LrSchedule({.type = "OneCycle"}, 0.1f);
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("scheduler.type: unknown scheduler 'OneCycle'"),
              std::string::npos);
  }
}

}  // namespace
}  // namespace zest
