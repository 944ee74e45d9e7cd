// ctest-labels: mpi
// ctest-mpirun-np: none
// A multi-process job with a failing rank ends, quickly, with the documented message and exit
// status (docs/multi_process.md): a rank that throws prints "<program>: error: rank R: ..." and
// ends the job with MPI_Abort (exit status 1, or 2 for input errors); a rank killed outright is
// reported by Open MPI's launcher, which ends the job with a non-zero status. Each test starts
// its own mpirun on this executable, running one of the DISABLED_ scenarios below, and bounds
// its time with `timeout`.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <array>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <thread>

#include "base/error.h"
#include "runtime/world.h"

namespace zest {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

// The scenarios' collective timeout: far longer than a test may take, so that a job that ends in
// time was ended by the failure, not by peers timing out.
constexpr std::chrono::seconds kCollectiveTimeout(120);
// What a test allows the whole job, start-up included, on a loaded two-core machine.
constexpr std::chrono::seconds kJobBound(40);

struct JobResult {
  int status = -1;  // the launcher's exit status; 124 where `timeout` had to end it
  std::string output;
  Clock::duration elapsed{};
};

// Runs `scenario` (a DISABLED_ test of this suite) under mpirun with `processes` processes.
JobResult run_job(const std::string& scenario, int processes) {
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::string command =
      "timeout -k 5 " + std::to_string(kJobBound.count() + 20) + " " ZEST_MPIEXEC " " +
      ZEST_MPIEXEC_FLAGS + " -np " + std::to_string(processes) + " '" + self +
      "' --gtest_also_run_disabled_tests --gtest_filter='MpiFaultScenario.DISABLED_" + scenario +
      "' 2>&1";
  JobResult result;
  const auto start = Clock::now();
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) throw std::runtime_error("popen failed: " + command);
  std::array<char, 4096> chunk;
  while (std::fgets(chunk.data(), chunk.size(), pipe) != nullptr) result.output += chunk.data();
  const int wait_status = pclose(pipe);
  result.elapsed = Clock::now() - start;
  result.status = WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : 128 + WTERMSIG(wait_status);
  return result;
}

WorldOptions scenario_options() {
  WorldOptions options;
  options.backend = "mpi";
  options.timeout = kCollectiveTimeout;
  options.program = "fault-scenario";
  return options;
}

// ---- scenarios (run under mpirun by the tests below; disabled when ctest runs this suite) -----

// Rank 1 throws after a first collective; the others wait in a barrier it never joins.
TEST(MpiFaultScenario, DISABLED_RankThrows) {
  World(scenario_options()).run([](RankContext& context) {
    float value = 1.0f;
    context.communicator.all_reduce(context.comm, &value, &value, 1, DType::kFloat32,
                                    Reduction::kSum);
    context.comm.synchronize();
    if (context.rank == 1) throw std::runtime_error("injected failure in the step");
    context.communicator.barrier(context.comm);
  });
}

// Rank 1 fails on bad input: the exit status says so (2, as the tools use).
TEST(MpiFaultScenario, DISABLED_RankFailsOnInput) {
  World(scenario_options()).run([](RankContext& context) {
    if (context.rank == 1) throw Error(ErrorKind::kData, "tokens.bin: truncated at byte 4096");
    context.communicator.barrier(context.comm);
  });
}

// Rank 1 is killed outright (as by the OOM killer) while the others wait in a barrier.
TEST(MpiFaultScenario, DISABLED_RankIsKilled) {
  World(scenario_options()).run([](RankContext& context) {
    context.communicator.barrier(context.comm);
    context.comm.synchronize();
    if (context.rank == 1) std::raise(SIGKILL);
    context.communicator.barrier(context.comm);
  });
}

// Rank 1 stalls (asleep for 1000 s) at step 3; the others wait in an all-reduce it never joins,
// with a 2 s timeout and the collective-order check on.
TEST(MpiFaultScenario, DISABLED_RankStalls) {
  WorldOptions options = scenario_options();
  options.timeout = std::chrono::seconds(2);
  options.check_collectives = true;
  World(options).run([](RankContext& context) {
    context.communicator.begin_step(3);
    if (context.rank == 1) std::this_thread::sleep_for(std::chrono::seconds(1000));
    float value = 1.0f;
    context.communicator.label_next("step loss");
    context.communicator.all_reduce(context.comm, &value, &value, 1, DType::kFloat32,
                                    Reduction::kSum);
    context.comm.synchronize();
  });
}

// ---- tests -----------------------------------------------------------------------------------

TEST(MpiFaults, ARankThatThrowsEndsTheJobNamingItsRank) {
  for (int processes : {2, 4}) {
    SCOPED_TRACE(std::to_string(processes) + " processes");
    const JobResult job = run_job("RankThrows", processes);
    EXPECT_LT(job.elapsed, kJobBound) << job.output;
    EXPECT_EQ(job.status, 1) << job.output;
    EXPECT_THAT(job.output,
                HasSubstr("fault-scenario: error: rank 1: injected failure in the step"));
  }
}

TEST(MpiFaults, ARankThatFailsOnInputEndsTheJobWithStatus2) {
  const JobResult job = run_job("RankFailsOnInput", 2);
  EXPECT_LT(job.elapsed, kJobBound) << job.output;
  EXPECT_EQ(job.status, 2) << job.output;
  EXPECT_THAT(job.output,
              HasSubstr("fault-scenario: error: rank 1: tokens.bin: truncated at byte 4096"));
}

TEST(MpiFaults, AStalledRankEndsTheJobWithinItsTimeoutNamingTheCollectiveAndStep) {
  const JobResult job = run_job("RankStalls", 2);
  EXPECT_LT(job.elapsed, std::chrono::seconds(15)) << job.output;
  EXPECT_EQ(job.status, 1) << job.output;
  // One line, naming the all-reduce as issued (not the order check's gather of its records).
  EXPECT_THAT(job.output, HasSubstr("fault-scenario: error: rank 0: all_reduce #0 (1 x fp32, sum) "
                                    "'step loss' at step 3 on rank 0 of 2: timed out after 2 s "
                                    "waiting for the other ranks"));
  EXPECT_THAT(job.output, ::testing::Not(HasSubstr("waited on an event")));
}

TEST(MpiFaults, AKilledRankEndsTheJobThroughTheLauncher) {
  const JobResult job = run_job("RankIsKilled", 2);
  EXPECT_LT(job.elapsed, kJobBound) << job.output;
  EXPECT_NE(job.status, 0) << job.output;
  EXPECT_NE(job.status, 124) << "the job had to be ended by `timeout`:\n" << job.output;
  EXPECT_THAT(job.output, HasSubstr("signal 9")) << "Open MPI names the signal";
}

}  // namespace
}  // namespace zest
