// zest-train with a `checkpoint` block, run as a user would: periodic saves with keep_last, a
// resumed run (--resume PATH or checkpoint.resume "auto") whose metrics continue the
// uninterrupted run's exactly, SIGTERM saving after the step in progress and exiting 143, and
// the block's bad values as one-line config errors.
#include <signal.h>
#include <sys/types.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/checkpoint/checkpoint_test_support.h"
#include "tests/support/subprocess.h"

namespace zest {
namespace {

using ::testing::HasSubstr;
using testing::ProcessResult;
using testing::ScratchDirectory;
using ::testing::StartsWith;

const std::string kBinary = ZEST_BINARY_DIR "/bin/zest-train";
const std::string kConfig = ZEST_SOURCE_DIR "/configs/mlp.json";

class ZestTrainCheckpoint : public ::testing::Test {
 protected:
  std::string path(const std::string& name) const { return scratch_.path(name); }

  testing::OutputFiles output_files() const { return {path("stdout.txt"), path("stderr.txt")}; }

  pid_t spawn(std::vector<std::string> args) const {
    args.insert(args.begin(), {"--config", kConfig, "--set", "world.ranks=2", "--set",
                               "zero_optimization.stage=2", "--set", "steps_per_print=1"});
    return testing::start_program(kBinary, args, output_files());
  }

  ProcessResult wait_for(pid_t pid) const { return testing::wait_for_program(pid, output_files()); }

  ProcessResult run(const std::vector<std::string>& args) const { return wait_for(spawn(args)); }

  // The metrics lines of the steps, without their timings.
  std::vector<std::string> step_lines(const std::string& metrics) const {
    std::vector<std::string> lines;
    std::istringstream stream(testing::read_whole_file(metrics));
    for (std::string line; std::getline(stream, line);) {
      nlohmann::json value = nlohmann::json::parse(line);
      if (!value.contains("step")) continue;
      value.erase("step_ms");
      value.erase("tokens_per_s");
      value.erase("checkpoint_wait_s");  // a timing too
      lines.push_back(value.dump());
    }
    return lines;
  }

  ScratchDirectory scratch_;
};

TEST_F(ZestTrainCheckpoint, SavesPeriodicallyAndResumesExactly) {
  const ProcessResult whole =
      run({"--set", "steps=6", "--set", "checkpoint.dir=" + path("ckpt"), "--set",
           "checkpoint.every_steps=2", "--set", "checkpoint.keep_last=2", "--metrics",
           path("whole.jsonl")});
  ASSERT_EQ(whole.status, 0) << whole.err;
  EXPECT_THAT(whole.out, HasSubstr("saved checkpoint " + path("ckpt") + "/step-2"));
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(path("ckpt"))) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"latest", "step-4", "step-6"}));

  // Resume the step-4 checkpoint at the same world size: steps 5 and 6 as before, bit for bit.
  const ProcessResult resumed = run({"--set", "steps=6", "--resume", path("ckpt") + "/step-4",
                                     "--metrics", path("resumed.jsonl")});
  ASSERT_EQ(resumed.status, 0) << resumed.err;
  EXPECT_THAT(resumed.out, HasSubstr("resumed from " + path("ckpt") + "/step-4 at step 4"));
  const std::vector<std::string> all = step_lines(path("whole.jsonl"));
  ASSERT_EQ(all.size(), 6u);
  EXPECT_EQ(step_lines(path("resumed.jsonl")), (std::vector<std::string>{all[4], all[5]}));

  // Resumed at or past `steps`: said so, not "0 steps, loss 0.0000 -> 0.0000".
  for (const std::string steps : {"6", "4"}) {
    const ProcessResult idle = run({"--set", "steps=" + steps, "--resume", path("ckpt") + "/step-6"});
    ASSERT_EQ(idle.status, 0) << idle.err;
    EXPECT_THAT(idle.out, HasSubstr("zest-train: nothing trained: the checkpoint resumed is at "
                                    "step 6 and steps is " + steps + "; set steps above 6"));
    EXPECT_THAT(idle.out, ::testing::Not(HasSubstr("0 steps, loss")));
  }
}

TEST_F(ZestTrainCheckpoint, AutoResumeStartsFreshThenContinues) {
  const std::vector<std::string> common = {"--set", "checkpoint.dir=" + path("ckpt"), "--set",
                                           "checkpoint.resume=auto"};
  std::vector<std::string> first = common;
  first.insert(first.end(), {"--set", "steps=3"});
  const ProcessResult fresh = run(first);
  ASSERT_EQ(fresh.status, 0) << fresh.err;
  EXPECT_THAT(fresh.out, HasSubstr("no checkpoint in " + path("ckpt") + " yet"));
  EXPECT_THAT(fresh.out, HasSubstr("step-3"));  // save_on_exit

  std::vector<std::string> second = common;
  second.insert(second.end(), {"--set", "steps=5"});
  const ProcessResult continued = run(second);
  ASSERT_EQ(continued.status, 0) << continued.err;
  EXPECT_THAT(continued.out, HasSubstr("at step 3"));
  EXPECT_THAT(continued.out, HasSubstr("step 4/5"));
  EXPECT_THAT(continued.out, ::testing::Not(HasSubstr("step 3/5")));
  EXPECT_EQ(testing::read_whole_file(path("ckpt") + "/latest"), "step-5\n");
}

TEST_F(ZestTrainCheckpoint, SigtermSavesAfterTheStepInProgressAndExits143) {
  const pid_t pid = spawn({"--set", "steps=1000000", "--set", "checkpoint.dir=" + path("ckpt")});
  ASSERT_GT(pid, 0);  // not kill(-1, ...) below
  // Wait for training to be under way.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (testing::read_whole_file(path("stdout.txt")).find("3/1000000") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(pid, SIGTERM);
  const ProcessResult result = wait_for(pid);
  EXPECT_EQ(result.status, 128 + SIGTERM) << result.err;
  EXPECT_THAT(result.out, HasSubstr("stopped by signal 15 after step"));
  const std::string latest = testing::read_whole_file(path("ckpt") + "/latest");
  ASSERT_THAT(latest, StartsWith("step-"));
  EXPECT_THAT(result.out, HasSubstr("saved checkpoint " + path("ckpt") + "/" +
                                    latest.substr(0, latest.size() - 1)));
  verify_checkpoint(path("ckpt"));
}

TEST_F(ZestTrainCheckpoint, BadCheckpointConfigIsOneLine) {
  auto expect_config_error = [&](const std::vector<std::string>& args, const std::string& text) {
    const ProcessResult result = run(args);
    EXPECT_EQ(result.status, 2) << result.err;
    EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1) << result.err;
    EXPECT_THAT(result.err, StartsWith("zest-train: error: "));
    EXPECT_THAT(result.err, HasSubstr(text));
  };
  expect_config_error({"--set", "checkpoint.every_steps=5"}, "checkpoint.dir: missing");
  expect_config_error({"--set", "checkpoint.resume=auto"}, "checkpoint.resume");
  expect_config_error({"--set", "checkpoint.keep_last=-1"}, "checkpoint.keep_last");
  expect_config_error({"--set", "checkpoint.evry_steps=5"},
                      "did you mean 'checkpoint.every_steps'");
  expect_config_error({"--set", "steps=2", "--resume", path("nowhere")},
                      "no checkpoint at " + path("nowhere"));
}

}  // namespace
}  // namespace zest
