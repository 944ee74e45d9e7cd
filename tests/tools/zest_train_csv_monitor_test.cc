// zest-train's csv_monitor, judged by the files it leaves: DeepSpeed's layout (one file per
// quantity under output_path/job_name, a "step,<name>" header, rows of samples seen and value,
// \r\n line ends) holding the same values as the metrics file; a resumed run keeps the rows its
// checkpoint holds and continues them; a run that fails takes its rows back.
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/scratch_directory.h"
#include "tests/support/subprocess.h"
#include "tests/tools/zest_train_support.h"

namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using zest::testing::lines_of;
using zest::testing::ProcessResult;
using zest::testing::read_file;

const std::string& kTrain = zest::testing::kZestTrain;
const std::string kMlpConfig = ZEST_SOURCE_DIR "/configs/mlp.json";

// "a\r\nb\r\n" -> {"a", "b"}; a line without its \r is kept with a marker, to fail a comparison.
std::vector<std::string> csv_rows(const std::string& text) {
  std::vector<std::string> rows;
  for (std::string line : lines_of(text)) {
    if (!line.empty() && line.back() == '\r') {
      line.pop_back();
    } else {
      line += " (no \\r)";
    }
    rows.push_back(line);
  }
  return rows;
}

class ZestTrainCsvMonitor : public zest::testing::ScratchDirectoryTest {
 protected:
  ProcessResult train(std::vector<std::string> args) const {
    std::vector<std::string> all = {"--config", kMlpConfig, "--set", "csv_monitor.enabled=true",
                                    "--set", "csv_monitor.output_path=" + path("csv"), "--set",
                                    "csv_monitor.job_name=job"};
    all.insert(all.end(), args.begin(), args.end());
    return zest::testing::run_program(kTrain, all, {path("stdout.txt"), path("stderr.txt")});
  }
  std::string csv(const std::string& name) const { return path("csv/job/" + name + ".csv"); }
};

TEST_F(ZestTrainCsvMonitor, WritesDeepSpeedsFilesWithTheMetricsValues) {
  const ProcessResult result = train({"--set", "steps=4", "--set", "eval_every=2", "--set",
                                      "fp16.enabled=true", "--metrics", path("run.jsonl")});
  ASSERT_EQ(result.status, 0) << result.err;
  const std::vector<json> steps = zest::testing::step_records(path("run.jsonl"));
  ASSERT_EQ(steps.size(), 4u);
  const std::int64_t samples_per_step = 64;  // configs/mlp.json's train_batch_size
  for (const auto& [name, key] : std::vector<std::pair<std::string, std::string>>{
           {"train_loss", "loss"}, {"lr", "lr"}, {"grad_norm", "grad_norm"},
           {"loss_scale", "loss_scale"}}) {
    const std::vector<std::string> rows = csv_rows(read_file(csv("Train_Samples_" + name)));
    ASSERT_EQ(rows.size(), 5u) << name;
    EXPECT_EQ(rows[0], "step," + name);
    for (std::size_t i = 0; i < 4; ++i) {
      const std::size_t comma = rows[i + 1].find(',');
      ASSERT_NE(comma, std::string::npos) << rows[i + 1];
      EXPECT_EQ(std::stoll(rows[i + 1].substr(0, comma)),
                static_cast<std::int64_t>(i + 1) * samples_per_step);
      // The CSV has the float widened to a double, as DeepSpeed's tensor.item(); the metrics
      // file its shortest float text: the same float.
      EXPECT_EQ(static_cast<float>(std::stod(rows[i + 1].substr(comma + 1))),
                steps[i][key].get<float>())
          << name << " " << rows[i + 1];
    }
  }
  const std::vector<std::string> val = csv_rows(read_file(csv("Train_Samples_val_loss")));
  ASSERT_EQ(val.size(), 3u);
  EXPECT_EQ(val[0], "step,val_loss");
  EXPECT_THAT(val[1], ::testing::StartsWith("128,"));
  EXPECT_THAT(val[2], ::testing::StartsWith("256,"));
}

TEST_F(ZestTrainCsvMonitor, ResumedRunKeepsTheCheckpointsRowsAndContinues) {
  const std::vector<std::string> checkpoint = {"--set", "checkpoint.dir=" + path("ckpt"), "--set",
                                               "checkpoint.every_steps=2"};
  std::vector<std::string> args = checkpoint;
  args.insert(args.end(), {"--set", "steps=4"});
  ASSERT_EQ(train(args).status, 0);
  const std::vector<std::string> whole = csv_rows(read_file(csv("Train_Samples_train_loss")));
  ASSERT_EQ(whole.size(), 5u);

  // A later run from step 2's checkpoint trains steps 3 and 4 again: their rows are replaced.
  args.insert(args.end(), {"--resume", path("ckpt") + "/step-2"});
  const ProcessResult resumed = train(args);
  ASSERT_EQ(resumed.status, 0) << resumed.err;
  EXPECT_EQ(csv_rows(read_file(csv("Train_Samples_train_loss"))), whole);

  // A fresh run starts the files afresh.
  ASSERT_EQ(train({"--set", "steps=1"}).status, 0);
  EXPECT_EQ(csv_rows(read_file(csv("Train_Samples_train_loss"))).size(), 2u);
}

TEST_F(ZestTrainCsvMonitor, FailedRunTakesItsRowsBack) {
  const ProcessResult result =
      train({"--set", "steps=4", "--set", "debug.fault.kind=throw", "--set", "debug.fault.step=3"});
  EXPECT_EQ(result.status, 1) << result.err;
  EXPECT_FALSE(std::filesystem::exists(csv("Train_Samples_train_loss")));
  EXPECT_FALSE(std::filesystem::exists(csv("Train_Samples_lr")));
}

TEST_F(ZestTrainCsvMonitor, FolderThatCannotBeMadeIsRefusedBeforeTraining) {
  write("csv", "a file where the folder should be");
  const ProcessResult result = train({"--set", "steps=2"});
  EXPECT_EQ(result.status, 2) << result.err;
  EXPECT_THAT(result.err, HasSubstr("csv_monitor"));
  EXPECT_THAT(result.out, ::testing::Not(HasSubstr("step 1/2")));
}

}  // namespace
