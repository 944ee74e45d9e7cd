// zest-train's --metrics log and its stop signals, judged by what a process leaves behind when it
// dies or is stopped: SIGKILL at a step drawn from a fixed seed leaves every step the run showed
// (and every step its checkpoint holds) as a whole JSON line, and resuming that checkpoint
// continues the same file with one record per step; a second SIGTERM mid-stop leaves whole
// lines, never an empty or cut file; a signal sent while the process is still starting up is
// caught by zest-train's handler (exit 128 + the signal, as after Ctrl-C), not fatal.
#include <signal.h>
#include <spawn.h>
#include <sys/types.h>
#include <sys/wait.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/scratch_directory.h"
#include "tests/support/subprocess.h"

namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using zest::testing::lines_of;
using zest::testing::read_file;

const std::string kBinary = ZEST_BINARY_DIR "/bin/zest-train";
const std::string kConfig = ZEST_SOURCE_DIR "/configs/mlp.json";
constexpr const char* kManySteps = "steps=1000000";

// How a child ended, as waitpid reports it: ProcessResult folds "exited 143" and "killed by
// SIGTERM" into one number, and these tests are about telling them apart.
struct Ending {
  bool exited = false;
  int code = -1;    // exit status when `exited`
  int signal = 0;   // the signal that killed it otherwise
};

Ending wait_raw(pid_t pid) {
  int status = 0;
  Ending ending;
  if (pid <= 0 || ::waitpid(pid, &status, 0) != pid) return ending;
  ending.exited = WIFEXITED(status);
  if (ending.exited) ending.code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) ending.signal = WTERMSIG(status);
  return ending;
}

std::string describe(const Ending& ending) {
  return ending.exited ? "exited " + std::to_string(ending.code)
                       : "killed by signal " + std::to_string(ending.signal);
}

// Note: no std::regex here: GCC 12 warns inside <regex> under ASan (maybe-uninitialized), and the
// sanitizer build treats warnings as errors.

// The whole number after `key` (and blanks) in `text`, or -1.
std::int64_t number_after(const std::string& text, const std::string& key) {
  const std::size_t at = text.find(key);
  if (at == std::string::npos) return -1;
  const std::size_t begin = text.find_first_not_of(" \t", at + key.size());
  if (begin == std::string::npos) return -1;
  const std::size_t end = text.find_first_not_of("0123456789", begin);
  if (end == begin) return -1;
  return std::stoll(text.substr(begin, end - begin));
}

// N from a progress line "step N/TOTAL  loss ...", or -1 for any other line.
std::int64_t step_shown_by(const std::string& line) {
  const std::int64_t step = number_after(line, "step ");
  if (step < 0) return -1;
  const std::size_t slash = line.find('/', line.find("step "));
  if (slash == std::string::npos) return -1;
  const std::size_t after = line.find_first_not_of("0123456789", slash + 1);
  if (after == std::string::npos || line.compare(after, 6, "  loss") != 0) return -1;
  return step;
}

class ZestTrainMetrics : public zest::testing::ScratchDirectoryTest {
 protected:
  zest::testing::OutputFiles output_files() const { return {path("stdout.txt"), {}}; }

  // The MLP on 2 ranks, a step every few milliseconds, each step shown.
  std::vector<std::string> args(const std::vector<std::string>& extra) const {
    std::vector<std::string> all = {"--config", kConfig, "--set", "world.ranks=2", "--set",
                                    "zero_optimization.stage=2", "--set", "steps_per_print=1"};
    all.insert(all.end(), extra.begin(), extra.end());
    return all;
  }

  pid_t spawn(const std::vector<std::string>& extra) const {
    return zest::testing::start_program(kBinary, args(extra), output_files());
  }

  // Starts zest-train with SIGINT and SIGTERM blocked from exec on, as a parent that blocked
  // them would leave them.
  pid_t spawn_blocked(const std::vector<std::string>& extra) const {
    std::vector<std::string> strings = {kBinary};
    for (const std::string& arg : args(extra)) strings.push_back(arg);
    std::vector<char*> argv;
    for (std::string& arg : strings) argv.push_back(arg.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, path("stdout.txt").c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
    posix_spawnattr_t attributes;
    posix_spawnattr_init(&attributes);
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGTERM);
    posix_spawnattr_setsigmask(&attributes, &mask);
    posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGMASK);
    pid_t pid = -1;
    const int error =
        posix_spawn(&pid, kBinary.c_str(), &actions, &attributes, argv.data(), environ);
    posix_spawnattr_destroy(&attributes);
    posix_spawn_file_actions_destroy(&actions);
    EXPECT_EQ(error, 0) << std::strerror(error);
    return error == 0 ? pid : -1;
  }

  // The last step the run has shown on stdout, or 0.
  std::int64_t shown_step() const {
    std::int64_t last = 0;
    for (const std::string& line : lines_of(read_file(path("stdout.txt")))) {
      const std::int64_t step = step_shown_by(line);
      if (step > 0) last = step;
    }
    return last;
  }

  // Waits (60 s at most) until the run has shown step `step`.
  void wait_for_step(std::int64_t step) const {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (shown_step() < step && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    ASSERT_GE(shown_step(), step) << read_file(path("stdout.txt"));
  }

  // The metrics file's lines, each checked to be a whole JSON object ending in a newline.
  std::vector<json> records(const std::string& file) const {
    const std::string text = read_file(file);
    EXPECT_FALSE(text.empty()) << file << " is empty";
    EXPECT_TRUE(text.empty() || text.back() == '\n') << "a cut last line in " << file;
    std::vector<json> values;
    for (const std::string& line : lines_of(text)) {
      json value = json::parse(line, nullptr, /*allow_exceptions=*/false);
      EXPECT_TRUE(value.is_object()) << "not a whole record: '" << line << "'";
      values.push_back(std::move(value));
    }
    return values;
  }

  // The steps of the step records, in file order.
  static std::vector<std::int64_t> steps_of(const std::vector<json>& values) {
    std::vector<std::int64_t> steps;
    for (const json& value : values) {
      if (value.contains("loss")) steps.push_back(value["step"].get<std::int64_t>());
    }
    return steps;
  }

  static std::vector<std::int64_t> one_to(std::int64_t last) {
    std::vector<std::int64_t> steps;
    for (std::int64_t step = 1; step <= last; ++step) steps.push_back(step);
    return steps;
  }
};

// SIGKILL, which nothing can catch, at a step drawn from a fixed seed: the log holds a whole
// record for every step the run showed and every step its checkpoint holds (at most the one step
// it had not shown yet besides). Resuming the checkpoint with the same --metrics file drops the
// dead run's records past the checkpoint (and a cut last line), keeps the earlier ones byte for
// byte, and appends the retrained steps, identical to the first time, then a summary.
TEST_F(ZestTrainMetrics, SigkillLeavesEveryCompletedStepOnDiskAndResumeContinuesTheLog) {
  std::mt19937 random(26);
  const std::int64_t kill_at = std::uniform_int_distribution<std::int64_t>(6, 20)(random);
  const std::string metrics = path("metrics.jsonl");
  std::ofstream(metrics) << "an older run's line, which a fresh run must not keep\n";
  const std::string ckpt = path("ckpt");
  const pid_t pid = spawn({"--set", kManySteps, "--set", "checkpoint.dir=" + ckpt, "--set",
                           "checkpoint.every_steps=4", "--metrics", metrics});
  ASSERT_GT(pid, 0);
  wait_for_step(kill_at);
  ::kill(pid, SIGKILL);
  const Ending ending = wait_raw(pid);
  ASSERT_EQ(ending.signal, SIGKILL) << describe(ending);

  const std::int64_t shown = shown_step();
  const std::string latest = read_file(ckpt + "/latest");
  ASSERT_THAT(latest, ::testing::StartsWith("step-"));
  const std::int64_t saved = std::stoll(latest.substr(5));
  ASSERT_TRUE(std::filesystem::exists(metrics)) << "no metrics file after SIGKILL";
  const std::vector<json> dead = records(metrics);
  const std::vector<std::int64_t> steps = steps_of(dead);
  ASSERT_FALSE(steps.empty());
  const std::int64_t last = steps.back();
  EXPECT_EQ(steps, one_to(last)) << "one record per step, in order";
  EXPECT_EQ(dead.size(), steps.size()) << "a killed run writes no summary";
  EXPECT_GE(last, shown) << "killed after showing step " << shown;
  EXPECT_GE(last, saved) << "the checkpoint holds step " << saved;
  EXPECT_LE(last, shown + 1);
  std::cout << "killed at shown step " << shown << ", checkpoint step " << saved << ", "
            << last << " step records on disk\n";

  // A process killed in the middle of a write() could have cut its last line short.
  std::ofstream(metrics, std::ios::app) << R"({"step":)" << last + 1 << R"(,"loss":2.3)";
  const std::int64_t steps_now = last + 2;
  const int status = zest::testing::wait_for_program(
      spawn({"--set", "steps=" + std::to_string(steps_now), "--resume", ckpt, "--set",
             "checkpoint.dir=" + ckpt, "--metrics", metrics}),
      output_files()).status;
  ASSERT_EQ(status, 0) << read_file(path("stdout.txt"));
  const std::vector<json> resumed = records(metrics);
  ASSERT_EQ(steps_of(resumed), one_to(steps_now));
  for (std::size_t i = 0; i < static_cast<std::size_t>(saved); ++i) {
    EXPECT_EQ(resumed[i].dump(), dead[i].dump()) << "step " << i + 1 << " was rewritten";
  }
  for (std::int64_t step = saved + 1; step <= last; ++step) {
    const auto i = static_cast<std::size_t>(step - 1);
    EXPECT_EQ(resumed[i]["loss"], dead[i]["loss"]) << "step " << step;
    EXPECT_EQ(resumed[i]["grad_norm"], dead[i]["grad_norm"]) << "step " << step;
  }
  ASSERT_TRUE(resumed.back().contains("summary")) << resumed.back().dump();
  EXPECT_EQ(resumed.back()["summary"]["steps"], steps_now - saved);

  // Once more from the end, with a cut line after the summary: the summary stays, the cut line
  // goes, the new step follows.
  std::ofstream(metrics, std::ios::app) << R"({"step":)" << steps_now + 1 << R"(,"lo)";
  ASSERT_EQ(zest::testing::wait_for_program(
                spawn({"--set", "steps=" + std::to_string(steps_now + 1), "--resume", ckpt,
                       "--metrics", metrics}),
                output_files()).status,
            0)
      << read_file(path("stdout.txt"));
  const std::vector<json> again = records(metrics);
  ASSERT_EQ(again.size(), resumed.size() + 2);
  EXPECT_EQ(again[resumed.size() - 1], resumed.back());
  EXPECT_EQ(again[resumed.size()]["step"], steps_now + 1);
  EXPECT_TRUE(again.back().contains("summary"));
}

// A second SIGTERM while the first one's stop is under way (the step, the save) ends the
// process by the default action; the log it leaves holds whole lines for every step it showed.
TEST_F(ZestTrainMetrics, ASecondSignalLeavesWholeRecordsNeverAnEmptyFile) {
  const std::string metrics = path("metrics.jsonl");
  const pid_t pid = spawn({"--set", kManySteps, "--set", "checkpoint.dir=" + path("ckpt"),
                           "--metrics", metrics});
  ASSERT_GT(pid, 0);
  wait_for_step(5);
  // SIGTERM every millisecond until the process is gone: the first is caught, the next one (once
  // the handler has put the default action back) kills, unless the stop finished in between.
  Ending ending;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (;;) {
    ::kill(pid, SIGTERM);
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      ending.exited = WIFEXITED(status);
      if (ending.exited) ending.code = WEXITSTATUS(status);
      if (WIFSIGNALED(status)) ending.signal = WTERMSIG(status);
      break;
    }
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "zest-train did not end";
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::cout << "zest-train " << describe(ending) << "\n";
  EXPECT_TRUE(ending.signal == SIGTERM || (ending.exited && ending.code == 128 + SIGTERM))
      << describe(ending);
  EXPECT_FALSE(std::filesystem::exists(metrics + ".tmp"));
  ASSERT_TRUE(std::filesystem::exists(metrics));
  const std::vector<json> values = records(metrics);
  const std::vector<std::int64_t> steps = steps_of(values);
  ASSERT_FALSE(steps.empty());
  EXPECT_EQ(steps, one_to(steps.back()));
  EXPECT_GE(steps.back(), shown_step());
}

// A signal held from exec on (the parent blocked it, or it came before the handler could
// exist) reaches zest-train's handler the moment the handler is in place: the run stops before
// its first step and exits 128 + the signal, writing nothing.
TEST_F(ZestTrainMetrics, ASignalFromExecOnStopsTheRunBeforeItsFirstStep) {
  for (const int signal : {SIGTERM, SIGINT}) {
    const std::string metrics = path("metrics.jsonl");
    // Few steps: a run that never sees the signal ends by itself (and fails the test).
    const pid_t pid = spawn_blocked({"--set", "steps=300", "--set",
                                     "checkpoint.dir=" + path("ckpt"), "--metrics", metrics});
    ASSERT_GT(pid, 0);
    ::kill(pid, signal);
    const Ending ending = wait_raw(pid);
    EXPECT_TRUE(ending.exited && ending.code == 128 + signal) << describe(ending);
    EXPECT_THAT(read_file(path("stdout.txt")),
                HasSubstr("stopped by signal " + std::to_string(signal) + " before step 1"));
    EXPECT_FALSE(std::filesystem::exists(metrics));
    EXPECT_FALSE(std::filesystem::exists(path("ckpt") + "/latest"));
  }
}

// A SIGTERM sent while the process starts up is caught: the process exits 143 the way a stop by
// Ctrl-C ends, instead of being killed by the signal. It is sent as soon as the process has a
// second thread (OpenBLAS's initializer starts threads before main), while it is still far from
// training: it has its text corpus (8 MB here, some 100 ms) to read first.
TEST_F(ZestTrainMetrics, ASignalWhileTheProcessStartsIsCaught) {
  const std::string stories = read_file(ZEST_SOURCE_DIR "/configs/corpus/stories.txt");
  {
    std::ofstream corpus(path("corpus.txt"));
    for (int copy = 0; copy < 20; ++copy) corpus << stories;
  }
  const pid_t pid = zest::testing::start_program(
      kBinary,
      {"--config", ZEST_SOURCE_DIR "/configs/default.json", "--set",
       "data.path=" + path("corpus.txt"), "--set", "model.n_layer=1", "--set", "model.n_head=2",
       "--set", "model.n_embd=32", "--set", "model.seq_len=32", "--set", "scheduler={}",
       "--set", "steps=20"},
      output_files());
  ASSERT_GT(pid, 0);
  const std::string status_file = "/proc/" + std::to_string(pid) + "/status";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (;;) {
    if (number_after(read_file(status_file), "\nThreads:") > 1) break;
    ASSERT_LT(std::chrono::steady_clock::now(), deadline);
  }
  ::kill(pid, SIGTERM);
  const Ending ending = wait_raw(pid);
  EXPECT_TRUE(ending.exited && ending.code == 128 + SIGTERM) << describe(ending);
  // Before step 1 as a rule, but the handler runs on whichever thread the kernel picks, which a
  // loaded machine may not schedule before training starts: then it stops after a step.
  EXPECT_THAT(read_file(path("stdout.txt")), HasSubstr("stopped by signal 15 "));
}

}  // namespace
