// zest-train bounds every wait, whatever the config asks: a SIGTERM ends a run within the grace
// period even where no rank would stop by itself — a rank asleep in an injected stall that no
// peer times out, an evaluation of 1e8 batches — and a world of ranks that this host cannot hold
// is refused with one line before any rank starts, instead of taking every byte of memory.
#include <signal.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/support/scratch_directory.h"
#include "tests/support/subprocess.h"

namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using zest::testing::lines_of;
using zest::testing::ProcessResult;
using Clock = std::chrono::steady_clock;

const std::string kBinary = ZEST_BINARY_DIR "/bin/zest-train";
const std::string kMlpConfig = ZEST_SOURCE_DIR "/configs/mlp.json";
const std::string kGptConfig = ZEST_SOURCE_DIR "/configs/default.json";

// A 2-layer, 4-head, 64-wide GPT (seq 32) on the text corpus, 4 ranks at stage 3.
std::vector<std::string> tiny_gpt(std::vector<std::string> more) {
  std::vector<std::string> args = {
      "--config", kGptConfig, "--set", "data.path=" ZEST_SOURCE_DIR "/configs/corpus/stories.txt",
      "--set", "model.n_layer=2", "--set", "model.n_head=4", "--set", "model.n_embd=64",
      "--set", "model.seq_len=32", "--set", "train_batch_size=8", "--set",
      "train_micro_batch_size_per_gpu=2", "--set", "scheduler.params.warmup_num_steps=1"};
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

class ZestTrainBounds : public zest::testing::ScratchDirectoryTest {
 protected:
  zest::testing::OutputFiles files() const { return {path("stdout.txt"), path("stderr.txt")}; }

  // Starts `args`, sends SIGTERM `after` its first step shows on stdout (or 30 s), and waits at
  // most `limit` for the end.
  ProcessResult terminated(const std::vector<std::string>& args, std::chrono::milliseconds after,
                           std::chrono::seconds limit, double* seconds_after_signal) {
    const pid_t pid = zest::testing::start_program(kBinary, args, files());
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    while (zest::testing::read_file(path("stdout.txt")).find("step 1/") == std::string::npos &&
           Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    std::this_thread::sleep_for(after);
    const auto signalled = Clock::now();
    ::kill(pid, SIGTERM);
    const ProcessResult result = zest::testing::wait_for_program_within(pid, files(), limit);
    *seconds_after_signal = std::chrono::duration<double>(Clock::now() - signalled).count();
    return result;
  }
};

TEST_F(ZestTrainBounds, ASigtermWhileTheOnlyRankSleepsEndsTheRunWithinTheGracePeriod) {
  // One rank, stalled for 1000 s at step 2: no peer waits for it, so no timeout ever fires.
  double seconds = 0.0;
  const ProcessResult result = terminated(
      {"--config", kMlpConfig, "--set", "world.ranks=1", "--set", "train_batch_size=16",
       "--set", "steps=3", "--set",
       "debug.fault={\"kind\": \"stall\", \"rank\": 0, \"step\": 2, \"stall_seconds\": 1000}"},
      std::chrono::milliseconds(1000), std::chrono::seconds(30), &seconds);
  EXPECT_FALSE(result.killed_at_limit) << "still running 30 s after the signal";
  EXPECT_EQ(result.status, 128 + SIGTERM) << result.err;
  const std::vector<std::string> lines = lines_of(result.err);
  ASSERT_EQ(lines.size(), 1u) << result.err;
  EXPECT_THAT(lines[0], StartsWith("zest-train: error: interrupted, and rank(s) 0 had not "
                                   "stopped 5 s later"));
  EXPECT_LT(seconds, 9.0);  // 5 s of grace, on a loaded machine
}

TEST_F(ZestTrainBounds, ASigtermDuringALongEvaluationStopsTheRunAtOnce) {
  double seconds = 0.0;
  const ProcessResult result = terminated(
      tiny_gpt(
          {"--set", "steps=6", "--set", "eval_every=1", "--set", "data.val_batches=100000000"}),
      std::chrono::milliseconds(1000), std::chrono::seconds(60), &seconds);
  EXPECT_FALSE(result.killed_at_limit) << "still evaluating 60 s after the signal";
  EXPECT_EQ(result.status, 128 + SIGTERM) << result.err;
  EXPECT_THAT(result.out, HasSubstr("zest-train: stopped by signal 15 after step "));
  EXPECT_LT(seconds, 3.0);  // the ranks agree on it before each batch
}

TEST_F(ZestTrainBounds, RanksTheHostCannotHoldAreRefusedBeforeTheyStart) {
  // 65536 ranks of a micro-batch of 256 sequences: more threads than a common system allows, and
  // at least 2 MiB of activations a rank (128 GiB in all).
  const auto start = Clock::now();
  const ProcessResult result = zest::testing::run_program(
      kBinary,
      tiny_gpt({"--set", "world.ranks=65536", "--set", "train_batch_size=16777216", "--set",
                "train_micro_batch_size_per_gpu=256", "--set", "steps=3"}),
      files());
  EXPECT_EQ(result.status, 2) << result.err;
  const std::vector<std::string> lines = lines_of(result.err);
  ASSERT_EQ(lines.size(), 1u) << result.err;
  EXPECT_THAT(lines[0], StartsWith("zest-train: error: world.ranks: 65536 ranks as threads of one "
                                   "process need at least "));
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(20));  // a loaded machine; no rank ran
}

}  // namespace
