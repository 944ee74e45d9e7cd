// zest-train never hangs on a rank that cannot go on, and never aborts for lack of threads. A
// rank stalled for 1000 s (debug.fault "stall") with world.timeout_s 5 ends the run within the
// timeout and the World's grace period, with exit status 1 and one line naming the rank, the
// collective its peers issued (with the collective-order check on), the step and the timeout,
// and no metrics file left behind; a SIGINT while the ranks wait for it ends the run at once; a
// rank thread the system refuses is that one line naming the limit, not std::terminate.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/support/scratch_directory.h"
#include "tests/support/subprocess.h"

namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::Not;
using ::testing::StartsWith;
using zest::testing::lines_of;
using zest::testing::ProcessResult;
using Clock = std::chrono::steady_clock;

const std::string kBinary = ZEST_BINARY_DIR "/bin/zest-train";
const std::string kMlpConfig = ZEST_SOURCE_DIR "/configs/mlp.json";

// Rank 1 of the MLP's 4 ranks sleeps 1000 s before step 2, with the collective-order check on.
std::vector<std::string> stalled_run(const std::string& timeout_s, const std::string& metrics) {
  return {"--config", kMlpConfig, "--set", "steps=3", "--set", "world.timeout_s=" + timeout_s,
          "--set",
          "debug={\"check_collectives\": true, \"fault\": {\"kind\": \"stall\", \"rank\": 1, "
          "\"step\": 2, \"stall_seconds\": 1000}}",
          "--metrics", metrics};
}

// The line a stalled run ends with: a healthy rank's timeout at step 2, in the stage-3 gather
// the peers issued (not the order check's int32 gather of its records).
void expect_the_stall_line(const ProcessResult& result, const std::string& timeout_s) {
  EXPECT_FALSE(result.killed_at_limit) << "still running when the test ended it";
  EXPECT_EQ(result.status, 1) << result.err;
  const std::vector<std::string> lines = lines_of(result.err);
  ASSERT_EQ(lines.size(), 1u) << result.err;
  EXPECT_THAT(lines[0],
              MatchesRegex("zest-train: error: rank [023]: all_gather #[0-9]+ \\([0-9]+ x fp32\\) "
                           "'gather layer[0-9]' at step 2 on rank [023]: timed out after " +
                           timeout_s + " s waiting for rank\\(s\\) 1; .*"));
  EXPECT_THAT(lines[0], Not(HasSubstr("int32")));
  EXPECT_LT(lines[0].size(), 250u) << "one short line";
}

class ZestTrainStall : public zest::testing::ScratchDirectoryTest {
 protected:
  zest::testing::OutputFiles files() const { return {path("stdout.txt"), path("stderr.txt")}; }
};

TEST_F(ZestTrainStall, ARankStalledFor1000sEndsTheRunWithinTheTimeoutAndGrace) {
  const std::string metrics = path("metrics.jsonl");
  const auto start = Clock::now();
  const pid_t pid = zest::testing::start_program(kBinary, stalled_run("5", metrics), files());
  const ProcessResult result =
      zest::testing::wait_for_program_within(pid, files(), std::chrono::seconds(40));
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  expect_the_stall_line(result, "5");
  // 5 s timeout + 5 s grace + start-up and step 1, with room for a loaded machine.
  EXPECT_LT(seconds, 15.0);
  EXPECT_FALSE(std::filesystem::exists(metrics));  // a failed run takes its records back
}

TEST_F(ZestTrainStall, ASigintWhileTheRanksWaitForAStalledOneEndsTheRunAtOnce) {
  const std::string metrics = path("metrics.jsonl");
  const pid_t pid = zest::testing::start_program(kBinary, stalled_run("2", metrics), files());
  // The healthy ranks time out at about 2.3 s; the grace period would end the run 5 s later.
  std::this_thread::sleep_for(std::chrono::milliseconds(3500));
  const auto signalled = Clock::now();
  ::kill(pid, SIGINT);
  const ProcessResult result =
      zest::testing::wait_for_program_within(pid, files(), std::chrono::seconds(20));
  const double seconds = std::chrono::duration<double>(Clock::now() - signalled).count();
  expect_the_stall_line(result, "2");
  EXPECT_LT(seconds, 2.0);
  EXPECT_FALSE(std::filesystem::exists(metrics));
}

// Runs `program` (a path) with `variable` set in its environment, bounded by 60 s.
ProcessResult run_with(const std::string& variable, const std::string& value,
                       const std::string& program, const std::vector<std::string>& args,
                       const zest::testing::OutputFiles& files) {
  ::setenv(variable.c_str(), value.c_str(), 1);
  const pid_t pid = zest::testing::start_program(program, args, files);
  ::unsetenv(variable.c_str());
  return zest::testing::wait_for_program_within(pid, files, std::chrono::seconds(60));
}

void expect_the_thread_limit_line(const ProcessResult& result) {
  EXPECT_EQ(result.status, 1) << result.err;
  const std::vector<std::string> lines = lines_of(result.err);
  ASSERT_EQ(lines.size(), 1u) << result.err;
  EXPECT_THAT(lines[0], StartsWith("zest-train: error: rank "));
  EXPECT_THAT(lines[0], HasSubstr(": cannot start the "));
  EXPECT_THAT(lines[0], HasSubstr("Resource temporarily unavailable"));
  EXPECT_THAT(lines[0], HasSubstr("ulimit -u"));
  EXPECT_THAT(lines[0], HasSubstr("lower world.ranks"));
  EXPECT_THAT(result.err, Not(HasSubstr("terminate")));
}

TEST_F(ZestTrainStall, AThreadTheSystemRefusesIsAnErrorNamingTheLimit) {
  // The 3rd thread is a rank's (the main thread starts them) or a stream's (each rank starts
  // three); the 9th, most likely a stream's: either must end the run as one line.
  for (const char* n : {"3", "9"}) {
    SCOPED_TRACE(std::string("thread start ") + n + " fails");
    const ProcessResult result = run_with("ZEST_DEBUG_FAIL_THREAD_START", n, kBinary,
                                          {"--config", kMlpConfig, "--set", "steps=2"}, files());
    expect_the_thread_limit_line(result);
  }
}

TEST_F(ZestTrainStall, ARealLimitOnThreadsIsAnErrorNamingItNotTerminate) {
  // RLIMIT_NPROC (ulimit -u) at 20 for 64 ranks of 4 threads each: the system would refuse a
  // thread while others run, which used to leave joinable threads to std::terminate (exit 134).
  // Now the limit is read before any rank starts (tools/common/host_limits.h), and a thread
  // refused later still fails as AThreadTheSystemRefusesIsAnErrorNamingTheLimit shows.
  // Note: root is exempt from RLIMIT_NPROC, so as root the run is made as user nobody.
  // Through env(1), which finds setpriv and prlimit on the PATH.
  std::vector<std::string> args = {"prlimit", "--nproc=20", kBinary};
  if (::geteuid() == 0) {
    struct stat info {};
    const bool others_may_run = ::stat(kBinary.c_str(), &info) == 0 && (info.st_mode & S_IXOTH);
    if (!others_may_run || std::system("command -v setpriv prlimit > /dev/null 2>&1") != 0) {
      GTEST_SKIP() << "as root, RLIMIT_NPROC is not enforced, and the run cannot be made as user "
                      "nobody here (no setpriv or prlimit, or the binary is not executable by "
                      "others)";
    }
    args.insert(args.begin(), {"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"});
  } else if (std::system("command -v prlimit > /dev/null 2>&1") != 0) {
    GTEST_SKIP() << "prlimit is not installed";
  }
  args.insert(args.end(), {"--config", kMlpConfig, "--set", "steps=2", "--set", "world.ranks=64",
                           "--set", "train_micro_batch_size_per_gpu=1"});
  // One OpenBLAS thread: the first threads the limit refuses must be the World's.
  const ProcessResult result = run_with("OPENBLAS_NUM_THREADS", "1", "/usr/bin/env", args, files());
  if (result.err.rfind("prlimit:", 0) == 0 || result.err.rfind("setpriv:", 0) == 0) {
    GTEST_SKIP() << "the limit could not be set here: " << result.err;
  }
  EXPECT_EQ(result.status, 2) << result.err;
  const std::vector<std::string> lines = lines_of(result.err);
  ASSERT_EQ(lines.size(), 1u) << result.err;
  EXPECT_THAT(lines[0], StartsWith("zest-train: error: world.ranks: 64 ranks as threads of one "
                                   "process need at least 256 threads"));
  EXPECT_THAT(lines[0], HasSubstr("RLIMIT_NPROC (ulimit -u): 20"));
  EXPECT_THAT(result.err, Not(HasSubstr("terminate")));
}

}  // namespace
