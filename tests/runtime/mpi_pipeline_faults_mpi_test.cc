// ctest-labels: mpi
// ctest-mpirun-np: none
// Point-to-point under mpirun with a failing peer: a pipeline stage that throws, stalls or is
// killed while the next stage waits to receive its activations ends the job quickly, with the
// line naming the rank that failed (or, for a stall, who waited for whom and what), never a
// hang. Each test starts its own mpirun on this executable, running one of the DISABLED_
// scenarios below, as mpi_faults_mpi_test does for collectives.
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
  return testing::run_mpi_scenario("MpiPipelineFaultScenario", scenario, processes);
}
WorldOptions scenario_options() { return testing::scenario_world_options(); }

// ---- scenarios (run under mpirun by the tests below; disabled when ctest runs this suite) -----

// Rank 0 (pipeline stage 0) throws in its forward; rank 1 waits for its activations.
TEST(MpiPipelineFaultScenario, DISABLED_SenderThrows) {
  World(scenario_options()).run([](RankContext& context) {
    float activations = 0.0f;
    if (context.rank == 0) throw std::runtime_error("injected failure in block2's forward");
    if (context.rank == 1) {
      context.communicator.receive(context.compute, &activations, 1, DType::kFloat32, 0);
    }
    context.synchronize();
  });
}

// Rank 0 stalls; rank 1 waits for micro-batch 3's activations with a 2 s timeout.
TEST(MpiPipelineFaultScenario, DISABLED_SenderStalls) {
  WorldOptions options = scenario_options();
  options.timeout = std::chrono::seconds(2);
  World(options).run([](RankContext& context) {
    context.communicator.begin_step(1);
    if (context.rank == 0) std::this_thread::sleep_for(std::chrono::seconds(1000));
    float activations = 0.0f;
    if (context.rank == 1) {
      context.communicator.label_next("activations of micro-batch 3 from pipeline stage 0");
      context.communicator.receive(context.compute, &activations, 1, DType::kFloat32, 0);
    }
    context.synchronize();
  });
}

// Rank 0 is killed outright after one transfer; rank 1 waits for the second.
TEST(MpiPipelineFaultScenario, DISABLED_SenderIsKilled) {
  World(scenario_options()).run([](RankContext& context) {
    float activations = 1.0f;
    if (context.rank == 0) {
      context.communicator.send(context.comm, &activations, 1, DType::kFloat32, 1);
      context.comm.synchronize();
      std::raise(SIGKILL);
    }
    if (context.rank == 1) {
      context.communicator.receive(context.compute, &activations, 1, DType::kFloat32, 0);
      context.communicator.receive(context.compute, &activations, 1, DType::kFloat32, 0);
    }
    context.synchronize();
  });
}

// ---- tests -----------------------------------------------------------------------------------

TEST(MpiPipelineFaults, ASenderThatThrowsEndsTheJobNamingItsRank) {
  const JobResult job = run_job("SenderThrows", 2);
  EXPECT_LT(job.elapsed, kScenarioJobBound) << job.output;
  EXPECT_EQ(job.status, 1) << job.output;
  EXPECT_THAT(job.output,
              HasSubstr("fault-scenario: error: rank 0: injected failure in block2's forward"));
}

TEST(MpiPipelineFaults, AStalledSenderEndsTheJobNamingWhoWaitedForWhomAndWhat) {
  const JobResult job = run_job("SenderStalls", 2);
  EXPECT_LT(job.elapsed, std::chrono::seconds(15)) << job.output;
  EXPECT_EQ(job.status, 1) << job.output;
  EXPECT_THAT(job.output, HasSubstr("fault-scenario: error: rank 1: rank 1 waited 2 s for rank 0 "
                                    "to send 'activations of micro-batch 3 from pipeline stage "
                                    "0' (receive #0, 1 x fp32) at step 1; rank 0 is stalled or "
                                    "never sends it"));
}

TEST(MpiPipelineFaults, AKilledSenderEndsTheJobThroughTheLauncher) {
  const JobResult job = run_job("SenderIsKilled", 2);
  EXPECT_LT(job.elapsed, kScenarioJobBound) << job.output;
  EXPECT_NE(job.status, 0) << job.output;
  EXPECT_NE(job.status, 124) << "the job had to be ended by `timeout`:\n" << job.output;
  EXPECT_THAT(job.output, HasSubstr("signal 9")) << "Open MPI names the signal";
}

}  // namespace
}  // namespace zest
