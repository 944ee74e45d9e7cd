// The `scheduler`, `log` and `wall_clock_breakdown` keys of the trainer's config.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "config/train_config.h"

namespace zest {
namespace {

nlohmann::json base() {
  return nlohmann::json::parse(R"({
    "model": {"type": "mlp", "sizes": [4, 8, 3]},
    "steps": 50, "train_micro_batch_size_per_gpu": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}
  })");
}

std::string config_error(const std::vector<std::string>& overrides) {
  try {
    parse_train_config(base(), overrides);
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kConfig);
    return error.what();
  }
  ADD_FAILURE() << "expected a config error";
  return "";
}

TEST(SchedulerConfig, DeepSpeedBlockReachesTheSchedule) {
  const TrainConfig config = parse_train_config(
      base(), {R"(scheduler={"type": "WarmupDecayLR", "params": {"warmup_num_steps": 10,
               "warmup_type": "linear", "warmup_max_lr": 0.02}})"});
  EXPECT_EQ(config.scheduler.type, "WarmupDecayLR");
  EXPECT_EQ(config.scheduler.warmup_num_steps, 10);
  EXPECT_EQ(config.scheduler.total_num_steps, 50);  // defaults to `steps`
  const LrSchedule schedule(config.scheduler, config.optimizer.lr);
  EXPECT_FLOAT_EQ(schedule.lr_at(1), 0.0f);
  EXPECT_FLOAT_EQ(schedule.lr_at(11), 0.02f);
  EXPECT_FLOAT_EQ(schedule.lr_at(50), 0.02f * 1.0f / 40.0f);
}

TEST(SchedulerConfig, NoBlockMeansTheOptimizersRate) {
  const TrainConfig config = parse_train_config(base());
  EXPECT_TRUE(config.scheduler.type.empty());
  EXPECT_FLOAT_EQ(LrSchedule(config.scheduler, config.optimizer.lr).lr_at(7), 0.01f);
}

TEST(SchedulerConfig, BadValuesNameTheirPath) {
  EXPECT_NE(config_error({R"(scheduler={"type": "OneCycle"})"}).find("scheduler.type: unknown scheduler 'OneCycle'"),
            std::string::npos);
  EXPECT_NE(config_error({R"(scheduler={"type": "WarmupLR", "params": {"warmup_type": "cubic"}})"})
                .find("scheduler.params.warmup_type"),
            std::string::npos);
  EXPECT_NE(config_error({R"(scheduler={"type": "WarmupLR", "params": {"warmup_steps": 3}})"})
                .find("scheduler.params"),
            std::string::npos);
}

TEST(LogConfig, TraceAndBreakdownAreRead) {
  const TrainConfig config =
      parse_train_config(base(), {"log.trace=out/trace.json", "wall_clock_breakdown=true"});
  EXPECT_EQ(config.trace_path, "out/trace.json");
  EXPECT_TRUE(config.wall_clock_breakdown);
  EXPECT_NE(config_error({"log.trace=3"}).find("log.trace"), std::string::npos);
}

}  // namespace
}  // namespace zest
