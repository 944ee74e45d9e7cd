// ctest-labels: slow
// A process saving checkpoints in a loop is SIGKILLed at random moments, again and again in the
// same directory; after every kill `latest` names a checkpoint that verifies and loads (at
// several world sizes). The child is this test binary itself, running the one test that only
// works when the environment names its directory.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/checkpoint/checkpoint_test_support.h"

extern char** environ;

namespace zest {
namespace {

using testing::ScratchDirectory;
using testing::train_mlp;
using testing::TrainSpec;

namespace fs = std::filesystem;

constexpr const char* kChildVariable = "ZEST_CHECKPOINT_CRASH_CHILD";

// A tiny model, so that a save takes a millisecond or so and most kills land inside one.
TrainSpec tiny_spec(int world) {
  TrainSpec spec;
  spec.world = world;
  spec.stage = 1;
  spec.sizes = {4, 8, 3};
  spec.global_batch = 6;
  return spec;
}

TEST(CheckpointCrashChild, SavesInALoopUntilKilled) {
  const char* dir = std::getenv(kChildVariable);
  if (dir == nullptr) GTEST_SKIP() << "the child of CheckpointCrash.LatestAlwaysLoadsAfterSigkill";
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the parent test
  TrainSpec spec = tiny_spec(2);
  if (fs::exists(fs::path(dir) / "latest")) spec.resume = dir;
  spec.steps = 1'000'000;
  spec.save_dir = dir;
  spec.save_every = 1;
  spec.save_options.keep_last = 2;
  train_mlp(spec);
}

pid_t spawn_child(const std::string& root, const std::string& log) {
  std::vector<std::string> args = {"/proc/self/exe",
                                   "--gtest_filter=CheckpointCrashChild.SavesInALoopUntilKilled"};
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_strings = {std::string(kChildVariable) + "=" + root};
  for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
  std::vector<char*> envp;
  for (std::string& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  pid_t pid = -1;
  const int error = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  EXPECT_EQ(error, 0) << "posix_spawn failed";
  return pid;
}

// What `latest` names now; empty when there is none (or it is being replaced).
std::string read_latest(const std::string& root) {
  std::ifstream in(root + "/latest");
  std::string name;
  std::getline(in, name);
  return name;
}

TEST(CheckpointCrash, LatestAlwaysLoadsAfterSigkill) {
  ScratchDirectory scratch;
  const std::string root = scratch.path("ckpt");
  const std::string log = scratch.path("child.log");
  std::mt19937 random(20240611);
  constexpr int kTrials = 60;
  int with_latest = 0;
  int killed_mid_save = 0;  // a temporary directory was left: the kill landed inside a save
  std::int64_t last_step = 0;
  const auto started = std::chrono::steady_clock::now();
  for (int trial = 0; trial < kTrials; ++trial) {
    const pid_t pid = spawn_child(root, log);
    ASSERT_GT(pid, 0);
    // Kill at a random moment: the first trials wait for the first checkpoint to appear; then
    // odd trials anywhere in the first 300 ms of the child's life (start-up, load), even ones
    // within 20 ms after the child's first save of its own (steps and saves, a few ms each).
    // Note: starting a process that links cuBLAS takes about 0.4 s here, so kills timed from
    // the start alone landed before any save.
    const std::string before = read_latest(root);
    if (trial < 2 || trial % 2 == 0) {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while (read_latest(root) == before && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::microseconds(500));
      }
    }
    const int window_us = trial % 2 == 0 ? 20'000 : 300'000;
    std::this_thread::sleep_for(
        std::chrono::microseconds(std::uniform_int_distribution<int>(0, window_us)(random)));
    ::kill(pid, SIGKILL);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
        << "the child ended by itself (status " << status << "):\n"
        << testing::read_whole_file(log);

    std::error_code listing;
    for (const auto& entry : fs::directory_iterator(root, listing)) {
      if (entry.path().filename().string().rfind(".tmp-", 0) == 0) {
        ++killed_mid_save;
        break;
      }
    }
    if (!fs::exists(root + "/latest")) {
      ASSERT_EQ(with_latest, 0) << "latest disappeared after trial " << trial;
      continue;
    }
    ++with_latest;
    ASSERT_NO_THROW(verify_checkpoint(root)) << "trial " << trial;
    TrainSpec load = tiny_spec(1 + trial % 3);
    load.steps = 0;
    load.resume = root;
    testing::TrainResult loaded;
    ASSERT_NO_THROW(loaded = train_mlp(load)) << "trial " << trial;
    EXPECT_GE(loaded.loaded.step, last_step) << "trial " << trial;
    last_step = loaded.loaded.step;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::printf("%d kills in %.1f s: %d with a checkpoint, %d inside a save, last step %lld\n",
              kTrials, seconds, with_latest, killed_mid_save, static_cast<long long>(last_step));
  EXPECT_GE(with_latest, kTrials - 2);
  EXPECT_GT(killed_mid_save, 0) << "no kill landed inside a save: the test proves little";
}

}  // namespace
}  // namespace zest
