// ctest-labels: mpi
// ctest-mpirun-np: none
// A multi-process job with a failing rank ends, quickly, with the documented message and exit
// status (docs/operating.md, "Many processes and machines"): a rank that throws prints
// "<program>: error: rank R: ..." and ends the job with MPI_Abort (exit status 1, or 2 for
// input errors); a rank killed outright is reported by Open MPI's launcher, which ends the job
// with a non-zero status. Each test starts
// its own mpirun on this executable, running one of the DISABLED_ scenarios below, and bounds
// its time with `timeout`.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <stdexcept>
#include <string>
#include <thread>

#include "base/error.h"
#include "runtime/world.h"
#include "tests/support/mpi_scenario.h"

namespace zest {
namespace {

using ::testing::HasSubstr;
using testing::kScenarioJobBound;
using JobResult = testing::ScenarioResult;

JobResult run_job(const std::string& scenario, int processes) {
  return testing::run_mpi_scenario("MpiFaultScenario", scenario, processes);
}
WorldOptions scenario_options() { return testing::scenario_world_options(); }

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
    EXPECT_LT(job.elapsed, kScenarioJobBound) << job.output;
    EXPECT_EQ(job.status, 1) << job.output;
    EXPECT_THAT(job.output,
                HasSubstr("fault-scenario: error: rank 1: injected failure in the step"));
  }
}

TEST(MpiFaults, ARankThatFailsOnInputEndsTheJobWithStatus2) {
  const JobResult job = run_job("RankFailsOnInput", 2);
  EXPECT_LT(job.elapsed, kScenarioJobBound) << job.output;
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
  EXPECT_LT(job.elapsed, kScenarioJobBound) << job.output;
  EXPECT_NE(job.status, 0) << job.output;
  EXPECT_NE(job.status, 124) << "the job had to be ended by `timeout`:\n" << job.output;
  EXPECT_THAT(job.output, HasSubstr("signal 9")) << "Open MPI names the signal";
}

}  // namespace
}  // namespace zest
