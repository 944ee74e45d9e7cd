// The run report and the plan as pages, judged by the built tools: zest-train --report and
// zest-report write one self-contained HTML page (Chart.js inlined, nothing loaded from
// elsewhere) with a chart for each quantity; a run stopped by a signal or killed still reports
// what it recorded; a metrics file that is empty, cut off mid-line or another tool's is one
// line and exit status 2, with no page written; zest-estimate --html draws the plan. That the
// pages draw in a browser is report_browser_test.cc's (label browser).
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/support/scratch_directory.h"
#include "tests/support/subprocess.h"

namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;
using zest::testing::lines_of;
using zest::testing::ProcessResult;
using zest::testing::read_file;

const std::string kTrain = ZEST_BINARY_DIR "/bin/zest-train";
const std::string kReport = ZEST_BINARY_DIR "/bin/zest-report";
const std::string kEstimate = ZEST_BINARY_DIR "/bin/zest-estimate";
const std::string kMlpConfig = ZEST_SOURCE_DIR "/configs/mlp.json";
const std::string kGptConfig = ZEST_SOURCE_DIR "/configs/default.json";

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t found = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) {
    ++found;
  }
  return found;
}

class ZestReport : public zest::testing::ScratchDirectoryTest {
 protected:
  ProcessResult run(const std::string& binary, const std::vector<std::string>& args) const {
    return zest::testing::run_program(binary, args, {path("stdout.txt"), path("stderr.txt")});
  }

  // A short MLP run with an evaluation: its metrics file.
  std::string train(const std::string& name, std::vector<std::string> extra = {}) const {
    std::vector<std::string> args = {"--config", kMlpConfig, "--set", "steps=6", "--set",
                                     "eval_every=3", "--metrics", path(name)};
    args.insert(args.end(), extra.begin(), extra.end());
    const ProcessResult result = run(kTrain, args);
    EXPECT_EQ(result.status, 0) << result.err;
    return path(name);
  }

  // Exit status 2, one line naming `expected`, and no page.
  void expect_refused(const std::string& metrics, const std::string& expected) const {
    const ProcessResult result = run(kReport, {"--metrics", metrics, "--out", path("page.html")});
    EXPECT_EQ(result.status, 2) << result.out << result.err;
    const std::vector<std::string> lines = lines_of(result.err);
    ASSERT_EQ(lines.size(), 1u) << result.err;
    EXPECT_THAT(lines[0], StartsWith("zest-report: error: "));
    EXPECT_THAT(lines[0], HasSubstr(expected));
    EXPECT_FALSE(std::filesystem::exists(path("page.html")));
    for (const auto& entry : std::filesystem::directory_iterator(dir_)) {
      EXPECT_THAT(entry.path().filename().string(), Not(StartsWith(".page.html")))
          << "a temporary was left behind";
    }
  }
};

// What every page must be: whole, self-contained, with its charts' data.
void expect_self_contained_page(const std::string& page, std::size_t charts) {
  EXPECT_THAT(page, StartsWith("<!DOCTYPE html>"));
  EXPECT_THAT(page, HasSubstr("</html>\n"));
  EXPECT_THAT(page, HasSubstr("Chart.js v3."));  // the library's own banner, inlined
  EXPECT_EQ(count(page, "<script src"), 0u);
  EXPECT_EQ(count(page, "<link "), 0u);
  EXPECT_EQ(count(page, "<canvas id=\"chart-"), charts);
  EXPECT_EQ(count(page, "{\"id\":\"chart-"), charts);
}

TEST_F(ZestReport, TrainWritesTheReportAndZestReportDrawsTheSameRecords) {
  const std::string metrics =
      train("run.jsonl", {"--set", "fp16.enabled=true", "--set", "log.trace=" + path("trace.json"),
                          "--report", path("train.html")});
  const std::string from_train = read_file(path("train.html"));
  // loss by step and by tokens, lr, gradient norm, loss scale, throughput, memory, overlap
  expect_self_contained_page(from_train, 8);
  EXPECT_THAT(from_train, HasSubstr("zest-train: 4 ranks"));
  EXPECT_THAT(from_train, HasSubstr("\"validation loss\""));
  EXPECT_THAT(from_train, HasSubstr("\"loss scale\""));
  EXPECT_THAT(from_train, HasSubstr("<td>zero_optimization.stage</td><td>3</td>"));

  const ProcessResult result =
      run(kReport, {"--metrics", metrics, "--config", kMlpConfig, "--set", "steps=6", "--set",
                    "eval_every=3", "--set", "fp16.enabled=true", "--trace", path("trace.json")});
  ASSERT_EQ(result.status, 0) << result.err;
  EXPECT_THAT(result.out, HasSubstr("zest-report: wrote " + path("run.html") + " (6 steps)"));
  const std::string from_report = read_file(path("run.html"));
  expect_self_contained_page(from_report, 8);
  // The same records drawn the same way: the loss curve's data are identical.
  const auto loss_data = [](const std::string& page) {
    const std::size_t at = page.find("{\"label\":\"loss\"");
    return at == std::string::npos ? std::string() : page.substr(at, page.find(']', page.find("]]", at)) - at);
  };
  EXPECT_FALSE(loss_data(from_report).empty());
  EXPECT_EQ(loss_data(from_report), loss_data(from_train));
}

TEST_F(ZestReport, KilledRunReportsWhatItRecorded) {
  const std::string metrics = train("run.jsonl");
  // A run killed before its end leaves step records and no summary.
  const std::vector<std::string> lines = lines_of(read_file(metrics));
  std::ofstream(path("killed.jsonl")) << lines[0] << "\n" << lines[1] << "\n" << lines[2] << "\n";
  const ProcessResult result = run(kReport, {"--metrics", path("killed.jsonl")});
  ASSERT_EQ(result.status, 0) << result.err;
  const std::string page = read_file(path("killed.html"));
  expect_self_contained_page(page, 5);  // no memory, no timeline
  EXPECT_THAT(page, HasSubstr("the run ended before its summary"));
  EXPECT_THAT(page, HasSubstr("3 (1 to 3)"));
}

TEST_F(ZestReport, RunStoppedBySignalWritesItsReport) {
  const std::string out = path("stdout.txt");
  const pid_t pid = zest::testing::start_program(
      kTrain,
      {"--config", kMlpConfig, "--set", "steps=1000000", "--metrics", path("run.jsonl"),
       "--report", path("run.html")},
      {out, path("stderr.txt")});
  ASSERT_GT(pid, 0);
  // Stop it once a few steps are on disk.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (lines_of(read_file(path("run.jsonl"))).size() < 3 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::kill(pid, SIGTERM);
  const ProcessResult result = zest::testing::wait_for_program_within(
      pid, {out, path("stderr.txt")}, std::chrono::seconds(60));
  EXPECT_EQ(result.status, 128 + SIGTERM) << result.err;
  EXPECT_THAT(result.out, HasSubstr("zest-train: report written to " + path("run.html")));
  const std::string page = read_file(path("run.html"));
  expect_self_contained_page(page, 6);  // no loss scale, no timeline
  EXPECT_THAT(page, HasSubstr("stopped by signal 15 after step"));
}

TEST_F(ZestReport, FailedRunWritesNoReport) {
  const ProcessResult result =
      run(kTrain, {"--config", kMlpConfig, "--set", "steps=4", "--set", "debug.fault.kind=throw",
                   "--set", "debug.fault.step=2", "--metrics", path("run.jsonl"), "--report",
                   path("run.html")});
  EXPECT_EQ(result.status, 1) << result.err;
  EXPECT_FALSE(std::filesystem::exists(path("run.html")));
  EXPECT_FALSE(std::filesystem::exists(path("run.jsonl")));
}

TEST_F(ZestReport, ReportPathIsCheckedBeforeTraining) {
  std::filesystem::create_directory(path("folder"));
  const ProcessResult result =
      run(kTrain, {"--config", kMlpConfig, "--set", "steps=2", "--report", path("folder")});
  EXPECT_EQ(result.status, 2) << result.err;
  EXPECT_THAT(result.err, HasSubstr("--report"));
  EXPECT_THAT(result.out, Not(HasSubstr("step 1/2")));
}

TEST_F(ZestReport, EmptyMetricsFileIsRefused) {
  expect_refused(write("empty.jsonl", ""), "is empty");
}

TEST_F(ZestReport, MetricsCutOffMidLineIsRefused) {
  const std::string text = read_file(train("run.jsonl"));
  // Cut in the middle of the summary, the last line.
  write("cut.jsonl", text.substr(0, text.size() - 40));
  expect_refused(path("cut.jsonl"), "cut.jsonl:9: the last line is cut short");
}

TEST_F(ZestReport, AnotherToolsFileIsRefused) {
  train("run.jsonl", {"--set", "log.trace=" + path("trace.json")});
  expect_refused(path("trace.json"), "is not a zest-train metrics file");
  const ProcessResult estimate = run(kEstimate, {"--config", kMlpConfig, "--json"});
  ASSERT_EQ(estimate.status, 0);
  expect_refused(write("estimate.json", estimate.out), "is not a zest-train metrics file");
  expect_refused(write("table.csv", "step,train_loss\r\n64,2.3\r\n"),
                 "is not a zest-train metrics file");
  expect_refused(write("other.jsonl", "{\"step\": 1, \"loss\": 2.0}\n{\"epoch\": 1}\n"),
                 "other.jsonl:2: not a record of zest-train's metrics");
  // A trace that is not one.
  const std::string metrics = path("run.jsonl");
  const ProcessResult result = run(kReport, {"--metrics", metrics, "--trace", metrics});
  EXPECT_EQ(result.status, 2) << result.err;
  EXPECT_THAT(result.err, HasSubstr("not valid JSON"));
  EXPECT_FALSE(std::filesystem::exists(path("run.html")));
}

TEST_F(ZestReport, EstimateDrawsThePlanAndEveryStage) {
  ProcessResult result = run(kEstimate, {"--config", kMlpConfig, "--html", path("plan.html")});
  ASSERT_EQ(result.status, 0) << result.err;
  EXPECT_THAT(result.out, HasSubstr("html: wrote " + path("plan.html")));
  expect_self_contained_page(read_file(path("plan.html")), 1);

  result = run(kEstimate, {"--config", kGptConfig, "--fit", "--html", path("fit.html")});
  ASSERT_EQ(result.status, 0) << result.err;
  const std::string page = read_file(path("fit.html"));
  expect_self_contained_page(page, 2);
  for (const char* stage : {"\"stage 0\"", "\"stage 1\"", "\"stage 2\"", "\"stage 3\""}) {
    EXPECT_THAT(page, HasSubstr(stage));
  }
  EXPECT_THAT(page, HasSubstr("\"device capacity\""));
  // The largest model that fits, also under each activation_checkpointing policy.
  for (const char* policy : {"none", "selective", "full"}) {
    EXPECT_THAT(page, HasSubstr(std::string("n_layer with recomputation &quot;") + policy));
  }

  result = run(kEstimate, {"--params", "1000000", "--world", "4", "--stage", "1",
                           "--device-memory", "64MiB", "--fit", "--html", path("params.html")});
  ASSERT_EQ(result.status, 0) << result.err;
  EXPECT_THAT(read_file(path("params.html")), HasSubstr("largest parameter count that fits"));

  std::filesystem::create_directory(path("folder"));
  result = run(kEstimate, {"--config", kMlpConfig, "--html", path("folder")});
  EXPECT_EQ(result.status, 2);
  EXPECT_THAT(result.err, HasSubstr("--html"));
}

}  // namespace
