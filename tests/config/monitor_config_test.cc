// DeepSpeed's monitor keys in the trainer config: csv_monitor is read with DeepSpeed's defaults
// and its unknown keys refused; tensorboard, wandb and comet load switched off (DeepSpeed configs
// list them so) and are refused switched on, with one line that points to zest-report and the CSV
// monitor; a config without any of them resolves exactly as before.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "base/error.h"
#include "config/train_config.h"

namespace zest {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

json mlp_config() {
  return json::parse(R"({
    "model": {"type": "mlp", "sizes": [8, 16, 4]},
    "world": {"ranks": 2},
    "steps": 10,
    "train_batch_size": 8
  })");
}

std::string message_of(const std::vector<std::string>& overrides) {
  try {
    parse_train_config(mlp_config(), overrides);
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kConfig);
    return error.what();
  }
  ADD_FAILURE() << "accepted";
  return "";
}

TEST(MonitorConfig, CsvMonitorTakesDeepSpeedsDefaults) {
  const TrainConfig config = parse_train_config(mlp_config(), {"csv_monitor.enabled=true"});
  EXPECT_TRUE(config.csv_monitor.enabled);
  EXPECT_EQ(config.csv_monitor.output_path, "");
  EXPECT_EQ(config.csv_monitor.job_name, "DeepSpeedJobName");
  EXPECT_EQ(config.json["csv_monitor"],
            json::parse(R"({"enabled": true, "output_path": "", "job_name": "DeepSpeedJobName"})"));
}

TEST(MonitorConfig, CsvMonitorReadsItsKeys) {
  const TrainConfig config = parse_train_config(
      mlp_config(), {"csv_monitor={\"enabled\": true, \"output_path\": \"logs\", "
                     "\"job_name\": \"run7\"}"});
  EXPECT_EQ(config.csv_monitor.output_path, "logs");
  EXPECT_EQ(config.csv_monitor.job_name, "run7");
}

TEST(MonitorConfig, AbsentBlocksLeaveTheResolvedConfigAsItWas) {
  const TrainConfig config = parse_train_config(mlp_config());
  EXPECT_FALSE(config.csv_monitor.enabled);
  for (const char* key : {"csv_monitor", "tensorboard", "wandb", "comet"}) {
    EXPECT_FALSE(config.json.contains(key)) << key;
  }
}

TEST(MonitorConfig, BadCsvMonitorValuesNameTheirPath) {
  EXPECT_EQ(message_of({"csv_monitor.enable=true"}),
            "csv_monitor.enable: unknown key; did you mean 'csv_monitor.enabled'?");
  EXPECT_EQ(message_of({"csv_monitor.enabled=\"yes\""}),
            "csv_monitor.enabled: must be true or false, got string \"yes\"");
  EXPECT_EQ(message_of({"csv_monitor.output_path=3"}),
            "csv_monitor.output_path: must be a string, got 3");
  EXPECT_EQ(message_of({"csv_monitor.job_name=\"a/b\""}),
            "csv_monitor.job_name: must name one folder (not empty, no '/', not . or ..), got "
            "\"a/b\"");
  EXPECT_EQ(message_of({"csv_monitor=true"}), "csv_monitor: must be an object, got boolean true");
}

TEST(MonitorConfig, OtherMonitorsAreRefusedSwitchedOnWithWhatToUseInstead) {
  for (const char* monitor : {"tensorboard", "wandb", "comet"}) {
    const std::string message = message_of({std::string(monitor) + ".enabled=true"});
    EXPECT_THAT(message, HasSubstr(std::string(monitor) + ".enabled: zest does not write"));
    EXPECT_THAT(message, HasSubstr("zest-report"));
    EXPECT_THAT(message, HasSubstr("csv_monitor"));
    EXPECT_EQ(message.find('\n'), std::string::npos);
  }
}

TEST(MonitorConfig, OtherMonitorsSwitchedOffLoadWithDeepSpeedsKeys) {
  const TrainConfig config = parse_train_config(
      mlp_config(),
      {"tensorboard={\"enabled\": false, \"output_path\": \"tb\", \"job_name\": \"x\"}",
       "wandb={\"enabled\": false, \"project\": \"p\", \"team\": \"t\", \"group\": \"g\"}",
       "comet={\"enabled\": false, \"project\": \"p\", \"samples_log_interval\": 100}"});
  EXPECT_FALSE(config.csv_monitor.enabled);
  EXPECT_EQ(message_of({"wandb={\"enabled\": false, \"projekt\": \"p\"}"}),
            "wandb.projekt: unknown key; did you mean 'wandb.project'?");
}

}  // namespace
}  // namespace zest
