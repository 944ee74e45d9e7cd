// zest-train with `checkpoint.async`: the background writer saves the same rank files as the
// synchronous save and training goes on with the same losses, at every ZeRO stage and with the
// optimizer's state offloaded to the host or to NVMe; the host snapshot buffers the run measures
// are the plan's, twice a rank file's bytes (each pipeline stage's too); an async
// checkpoint resumes at another world size; a kill -9 while the writer runs leaves a `latest` that
// resumes; a SIGTERM waits for the writer and publishes the last save; every step's metrics
// record says how long the loop waited for the save; a value that is not a boolean is one config
// error naming the key.
#include <signal.h>
#include <sys/types.h>

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

const std::string kBinary = ZEST_BINARY_DIR "/bin/zest-train";
const std::string kConfig = ZEST_SOURCE_DIR "/configs/mlp.json";
const std::string kEstimate = ZEST_BINARY_DIR "/bin/zest-estimate";

// A job of the on/off comparisons: its name (for the directories), ZeRO stage and settings.
struct Job {
  std::string name;
  int stage = 0;
  std::vector<std::string> settings;
};

class ZestTrainAsyncCheckpoint : public ::testing::Test {
 protected:
  // The jobs whose saves are compared: stages 0, 2 and 3, the optimizer offloaded to the host,
  // and its state on NVMe (read through the swap files at the snapshot).
  std::vector<Job> jobs() const {
    const std::string nvme = "{\"device\": \"nvme\", \"nvme_path\": \"" + path("nvme") + "\"}";
    return {{"stage0", 0, {}},
            {"stage2", 2, {}},
            {"stage3", 3, {}},
            {"offload", 2, {"--set", "zero_optimization.offload_optimizer.device=cpu"}},
            {"nvme", 3, {"--set", "zero_optimization.offload_optimizer=" + nvme}}};
  }

  std::string path(const std::string& name) const { return scratch_.path(name); }

  testing::OutputFiles output_files() const { return {path("stdout.txt"), path("stderr.txt")}; }

  pid_t spawn(int ranks, int stage, std::vector<std::string> args) const {
    args.insert(args.begin(), {"--config", kConfig, "--set", "world.ranks=" + std::to_string(ranks),
                               "--set", "zero_optimization.stage=" + std::to_string(stage),
                               "--set", "steps_per_print=1"});
    return testing::start_program(kBinary, args, output_files());
  }

  ProcessResult run(int ranks, int stage, const std::vector<std::string>& args) const {
    return testing::wait_for_program(spawn(ranks, stage, args), output_files());
  }

  // A run of `steps` that saves every step into `dir`, async or not.
  ProcessResult save_every_step(const Job& job, const std::string& dir, bool async,
                                int steps) const {
    std::vector<std::string> args = {
        "--set", "steps=" + std::to_string(steps), "--set", "checkpoint.dir=" + path(dir),
        "--set", "checkpoint.every_steps=1", "--set", "checkpoint.keep_last=100", "--set",
        std::string("checkpoint.async=") + (async ? "true" : "false"), "--metrics",
        path(dir + ".jsonl")};
    args.insert(args.end(), job.settings.begin(), job.settings.end());
    return run(2, job.stage, args);
  }
  ProcessResult save_every_step(int stage, const std::string& dir, bool async, int steps) const {
    return save_every_step(Job{"", stage, {}}, dir, async, steps);
  }

  // The run summary: the metrics file's last record.
  nlohmann::json summary_of(const std::string& metrics) const {
    std::istringstream stream(testing::read_whole_file(path(metrics)));
    nlohmann::json last;
    for (std::string line; std::getline(stream, line);) last = nlohmann::json::parse(line);
    return last;
  }

  // The metrics lines of the steps, without their timings.
  std::vector<std::string> step_lines(const std::string& metrics) const {
    std::vector<std::string> lines;
    std::istringstream stream(testing::read_whole_file(path(metrics)));
    for (std::string line; std::getline(stream, line);) {
      nlohmann::json value = nlohmann::json::parse(line);
      if (!value.contains("step") || !value.contains("loss")) continue;
      lines.push_back(value["loss"].dump() + " " + value["step"].dump());
    }
    return lines;
  }

  ScratchDirectory scratch_;
};

// The manifests hold the resolved config (checkpoint.dir and checkpoint.async differ), so the
// comparison is of what the ranks wrote: every rank file of every step (the parameters and the
// optimizer's state), and `latest`.
TEST_F(ZestTrainAsyncCheckpoint, WritesTheSameRankFilesAndLossesAsTheSynchronousSave) {
  constexpr int kSteps = 4;
  for (const Job& job : jobs()) {
    SCOPED_TRACE(job.name);
    const std::string sync = "sync_" + job.name;
    const std::string async = "async_" + job.name;
    const ProcessResult plain = save_every_step(job, sync, false, kSteps);
    ASSERT_EQ(plain.status, 0) << plain.err;
    const ProcessResult background = save_every_step(job, async, true, kSteps);
    ASSERT_EQ(background.status, 0) << background.err;
    EXPECT_EQ(step_lines(sync + ".jsonl"), step_lines(async + ".jsonl"));
    EXPECT_EQ(step_lines(async + ".jsonl").size(), static_cast<std::size_t>(kSteps));
    EXPECT_EQ(testing::read_whole_file(path(sync + "/latest")),
              testing::read_whole_file(path(async + "/latest")));
    for (int step = 1; step <= kSteps; ++step) {
      for (int rank = 0; rank < 2; ++rank) {
        const std::string file =
            "/step-" + std::to_string(step) + "/rank-" + std::to_string(rank) + ".bin";
        const std::string expected = testing::read_whole_file(path(sync + file));
        ASSERT_FALSE(expected.empty()) << sync + file;
        EXPECT_TRUE(expected == testing::read_whole_file(path(async + file))) << file;
      }
    }
  }
}

// The snapshot buffers are host memory of the device's host allocator (category `snapshot`):
// with a save every step the run holds two, each a rank file's bytes, and the plan (the
// planner on the shape-only device, shown by zest-estimate and in the run summary) says so.
// The rank file is the independent measure: the synchronous save's writer sizes nothing.
TEST_F(ZestTrainAsyncCheckpoint, TheHostSnapshotBytesAreThePlansTwiceARankFile) {
  for (const Job& job : jobs()) {
    if (job.name == "stage2") continue;  // stage 0, stage 3 and the offloaded optimizer suffice
    SCOPED_TRACE(job.name);
    const std::string dir = "plan_" + job.name;
    const ProcessResult result = save_every_step(job, dir, true, 3);
    ASSERT_EQ(result.status, 0) << result.err;
    const nlohmann::json summary = summary_of(dir + ".jsonl");
    ASSERT_TRUE(summary.contains("planned_peak_bytes")) << summary.dump();
    const std::size_t planned = summary["planned_peak_bytes"]["snapshot"].get<std::size_t>();
    ASSERT_EQ(summary["peak_bytes"].size(), 2u);
    for (std::size_t rank = 0; rank < 2; ++rank) {
      const std::size_t file = std::filesystem::file_size(
          path(dir + "/step-1/rank-" + std::to_string(rank) + ".bin"));
      ASSERT_GT(file, 0u);
      EXPECT_EQ(summary["peak_bytes"][rank]["snapshot"].get<std::size_t>(), 2 * file);
      EXPECT_EQ(planned, 2 * file);
    }
  }
  // zest-estimate prints the same plan: `host snapshot` in the text, host.snapshot in the JSON.
  const std::vector<std::string> job = {
      "--config", kConfig, "--set", "world.ranks=2", "--set", "zero_optimization.stage=0",
      "--set", "steps=3", "--set", "checkpoint.dir=" + path("plan_stage0"), "--set",
      "checkpoint.every_steps=1", "--set", "checkpoint.async=true"};
  const std::size_t file = std::filesystem::file_size(path("plan_stage0/step-1/rank-0.bin"));
  std::vector<std::string> json_args = job;
  json_args.push_back("--json");
  const ProcessResult estimated =
      testing::wait_for_program(testing::start_program(kEstimate, json_args, output_files()),
                                output_files());
  ASSERT_EQ(estimated.status, 0) << estimated.err;
  const nlohmann::json bytes = nlohmann::json::parse(estimated.out)["per_rank_bytes"];
  EXPECT_EQ(bytes["host"]["snapshot"].get<std::size_t>(), 2 * file) << bytes.dump();
  const ProcessResult text = testing::wait_for_program(
      testing::start_program(kEstimate, job, output_files()), output_files());
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_THAT(text.out, HasSubstr("host snapshot"));
  EXPECT_THAT(text.out, HasSubstr(std::to_string(2 * file)));

  // One save in the run (at its end), one buffer; none without checkpoint.async.
  for (bool async : {true, false}) {
    const std::string dir = async ? "once_async" : "once_sync";
    const ProcessResult once =
        run(2, 0, {"--set", "steps=2", "--set", "checkpoint.dir=" + path(dir), "--set",
                   std::string("checkpoint.async=") + (async ? "true" : "false"), "--metrics",
                   path(dir + ".jsonl")});
    ASSERT_EQ(once.status, 0) << once.err;
    const nlohmann::json summary = summary_of(dir + ".jsonl");
    const std::size_t file = std::filesystem::file_size(path(dir + "/step-2/rank-0.bin"));
    const std::size_t expected = async ? file : 0;
    EXPECT_EQ(summary["peak_bytes"][0]["snapshot"].get<std::size_t>(), expected);
    EXPECT_EQ(summary["planned_peak_bytes"]["snapshot"].get<std::size_t>(), expected);
  }
}

// With pipeline stages each stage's ranks hold their own snapshots, of the units that stage saves;
// zest-estimate plans each pipeline stage's (the real PipelineTrainer on the shape-only device).
TEST_F(ZestTrainAsyncCheckpoint, EachPipelineStagesSnapshotIsItsPlanTwiceItsRankFile) {
  const std::vector<std::string> pipeline = {"--set", R"(pipeline={"stages": 2})"};
  const ProcessResult result = save_every_step(Job{"pipeline", 1, pipeline}, "piped", true, 3);
  ASSERT_EQ(result.status, 0) << result.err;
  const nlohmann::json summary = summary_of("piped.jsonl");
  ASSERT_EQ(summary["peak_bytes"].size(), 2u);
  std::vector<std::string> args = {"--config", kConfig, "--set", "world.ranks=2", "--set",
                                   "zero_optimization.stage=1", "--set", "steps=3", "--set",
                                   "checkpoint.dir=" + path("piped_plan"), "--set",
                                   "checkpoint.every_steps=1", "--set", "checkpoint.async=true",
                                   "--json"};
  args.insert(args.end(), pipeline.begin(), pipeline.end());
  const ProcessResult estimated = testing::wait_for_program(
      testing::start_program(kEstimate, args, output_files()), output_files());
  ASSERT_EQ(estimated.status, 0) << estimated.err;
  const nlohmann::json stages = nlohmann::json::parse(estimated.out)["pipeline"]["per_stage"];
  ASSERT_EQ(stages.size(), 2u);
  for (std::size_t rank = 0; rank < 2; ++rank) {  // rank r is pipeline stage r
    SCOPED_TRACE("pipeline stage " + std::to_string(rank));
    const std::size_t file = std::filesystem::file_size(
        path("piped/step-1/rank-" + std::to_string(rank) + ".bin"));
    EXPECT_EQ(summary["peak_bytes"][rank]["snapshot"].get<std::size_t>(), 2 * file);
    EXPECT_EQ(stages[rank]["per_rank_bytes"]["host"]["snapshot"].get<std::size_t>(), 2 * file);
  }
}

// checkpoint_wait_s: in every step's record, the time the loop spent in the save after the
// previous step — > 0 after every step that was saved (a snapshot copies the state; a
// synchronous save writes it), 0 at the first step (nothing saved before it) — and the run's
// total in the summary, at least the sum of the steps' (the last save is after the last record).
TEST_F(ZestTrainAsyncCheckpoint, EveryStepRecordSaysHowLongTheLoopWaitedForTheSave) {
  constexpr int kSteps = 3;
  for (bool async : {true, false}) {
    SCOPED_TRACE(async ? "async" : "sync");
    const std::string dir = async ? "wait_async" : "wait_sync";
    const ProcessResult result = save_every_step(2, dir, async, kSteps);
    ASSERT_EQ(result.status, 0) << result.err;
    std::istringstream stream(testing::read_whole_file(path(dir + ".jsonl")));
    double sum = 0.0;
    int steps = 0;
    double total = -1.0;
    for (std::string line; std::getline(stream, line);) {
      const nlohmann::json value = nlohmann::json::parse(line);
      if (value.contains("summary")) {
        ASSERT_TRUE(value["summary"].contains("checkpoint_wait_s")) << line;
        total = value["summary"]["checkpoint_wait_s"].get<double>();
        continue;
      }
      if (!value.contains("loss")) continue;
      ASSERT_TRUE(value.contains("checkpoint_wait_s")) << line;
      const double wait = value["checkpoint_wait_s"].get<double>();
      if (value["step"] == 1) {
        EXPECT_EQ(wait, 0.0) << line;
      } else {
        EXPECT_GT(wait, 0.0) << line;
      }
      sum += wait;
      ++steps;
    }
    EXPECT_EQ(steps, kSteps);
    EXPECT_GE(total + 1e-5, sum);  // each rounded to microseconds
  }
  // Without checkpoint.dir the field is left out.
  const ProcessResult plain = run(2, 2, {"--set", "steps=1", "--metrics", path("plain.jsonl")});
  ASSERT_EQ(plain.status, 0) << plain.err;
  EXPECT_THAT(testing::read_whole_file(path("plain.jsonl")),
              ::testing::Not(HasSubstr("checkpoint_wait_s")));
}

TEST_F(ZestTrainAsyncCheckpoint, ResumesAtAnotherWorldSizeAndStage) {
  const ProcessResult saved = save_every_step(3, "ckpt", true, 3);
  ASSERT_EQ(saved.status, 0) << saved.err;
  const ProcessResult resumed =
      run(1, 1, {"--set", "steps=5", "--resume", path("ckpt/step-3"), "--metrics",
                 path("resumed.jsonl")});
  ASSERT_EQ(resumed.status, 0) << resumed.err;
  const std::vector<std::string> lines = step_lines("resumed.jsonl");
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_THAT(lines.back(), HasSubstr(" 5"));
}

// Each kill lands at another point of the writer's work: after the first published save, a few
// milliseconds apart. The run saves every step, so the writer is nearly always busy.
TEST_F(ZestTrainAsyncCheckpoint, AKillDuringBackgroundWritesLeavesALatestThatResumes) {
  for (int kill = 0; kill < 3; ++kill) {
    SCOPED_TRACE("kill " + std::to_string(kill));
    const std::string dir = path("kill" + std::to_string(kill));
    const pid_t child = spawn(2, 3, {"--set", "steps=100000", "--set", "checkpoint.dir=" + dir,
                                     "--set", "checkpoint.every_steps=1", "--set",
                                     "checkpoint.async=true"});
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!std::filesystem::exists(dir + "/latest") &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(7 * kill));
    ::kill(child, SIGKILL);
    testing::wait_for_program(child, output_files());
    ASSERT_TRUE(std::filesystem::exists(dir + "/latest")) << "no save published within 60 s";
    const std::string latest = testing::read_whole_file(dir + "/latest");
    const int step = std::stoi(latest.substr(latest.find('-') + 1));
    const ProcessResult resumed =
        run(2, 3, {"--set", "steps=" + std::to_string(step + 1), "--resume",
                   dir + "/" + latest.substr(0, latest.find_last_not_of("\n ") + 1)});
    EXPECT_EQ(resumed.status, 0) << latest << ": " << resumed.err;
  }
}

// A SIGTERM while the writer is busy (it saves every step): the run saves after the step in
// progress, waits for every save still being written, and exits 143, its last save published
// as `latest`, whole and verified, with no temporary left beside it.
TEST_F(ZestTrainAsyncCheckpoint, ASigtermWaitsForTheWriterAndPublishesTheLastSave) {
  const std::string dir = path("sigterm");
  const pid_t child = spawn(2, 3, {"--set", "steps=1000000", "--set", "checkpoint.dir=" + dir,
                                   "--set", "checkpoint.every_steps=1", "--set",
                                   "checkpoint.async=true"});
  ASSERT_GT(child, 0);  // not kill(-1, ...) below
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (testing::read_whole_file(path("stdout.txt")).find("3/1000000") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(child, SIGTERM);
  const ProcessResult result = testing::wait_for_program(child, output_files());
  EXPECT_EQ(result.status, 128 + SIGTERM) << result.err;
  EXPECT_THAT(result.out, HasSubstr("stopped by signal 15 after step"));
  const std::string latest = testing::read_whole_file(dir + "/latest");
  ASSERT_THAT(latest, ::testing::StartsWith("step-"));
  const std::string last = latest.substr(0, latest.find_last_not_of("\n ") + 1);
  EXPECT_THAT(result.out, HasSubstr("saved checkpoint " + dir + "/" + last));
  int newer = 0;  // a save after `latest` would be one the exit abandoned
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    EXPECT_EQ(name.find("tmp"), std::string::npos) << name;
    if (name.rfind("step-", 0) == 0 && std::stoi(name.substr(5)) > std::stoi(last.substr(5))) {
      ++newer;
    }
  }
  EXPECT_EQ(newer, 0);
  verify_checkpoint(dir);
}

TEST_F(ZestTrainAsyncCheckpoint, AValueThatIsNotABooleanIsOneConfigError) {
  const ProcessResult result = run(1, 1, {"--set", "checkpoint.dir=" + path("ckpt"), "--set",
                                          "checkpoint.async=\"yes\""});
  EXPECT_EQ(result.status, 2);
  EXPECT_THAT(result.err, HasSubstr("checkpoint.async"));
}

}  // namespace
}  // namespace zest
