// ctest-labels: mpi
// World with ranks as processes, run by ctest under mpirun with 2 and 4 processes: the launcher
// is detected, the rank and size come from it, `local` and a disagreeing world.ranks are config
// errors, and a config that differs between processes is reported at start on every rank.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <string>

#include "base/dtype.h"
#include "base/error.h"
#include "runtime/mpi_process.h"
#include "runtime/world.h"
#include "tests/support/capture_error.h"

namespace zest {
namespace {

using ::testing::HasSubstr;

constexpr std::chrono::milliseconds kTimeout(30000);

int world_rank() { return MpiProcess::get().rank(); }
int world_size() { return MpiProcess::get().size(); }

// Every test leaves MPI_COMM_WORLD in step, so that one rank's early failure cannot make the
// next test start out of step.
class MpiWorldTest : public ::testing::Test {
 protected:
  void TearDown() override { MPI_Barrier(MPI_COMM_WORLD); }
};

using testing::capture_error;

WorldOptions mpi_options() {
  WorldOptions options;
  options.backend = "mpi";
  options.timeout = kTimeout;
  return options;
}

TEST_F(MpiWorldTest, WorldRunsThisProcesssRankOverMpi) {
  const World world(mpi_options());
  EXPECT_TRUE(world.detected().processes);
  EXPECT_EQ(world.detected().launcher, "Open MPI");
  EXPECT_EQ(world.size(), world_size());
  EXPECT_EQ(world.options().ranks, world_size());
  EXPECT_EQ(world.is_leader_process(), world_rank() == 0);
  EXPECT_THAT(world.detected().describe(),
              HasSubstr(std::to_string(world_size()) + " processes (Open MPI), rank " +
                        std::to_string(world_rank())));
  int runs = 0;
  float total = 0;
  world.run([&](RankContext& context) {
    ++runs;
    EXPECT_EQ(context.rank, world_rank());
    EXPECT_EQ(context.world_size, world_size());
    float mine = static_cast<float>(context.rank + 1);
    context.communicator.all_reduce(context.comm, &mine, &total, 1, DType::kFloat32,
                                    Reduction::kSum);
    context.comm.synchronize();  // `mine` goes out of scope
  });
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(total, static_cast<float>(world_size() * (world_size() + 1) / 2));
}

TEST_F(MpiWorldTest, AutoBackendUnderMpirunIsProcesses) {
  WorldOptions options = mpi_options();
  options.backend = "auto";
  const World world(options);
  EXPECT_TRUE(world.detected().processes);
  EXPECT_EQ(world.size(), world_size());
}

TEST_F(MpiWorldTest, WorldRanksThatDisagreeWithTheLauncherAreAConfigError) {
  WorldOptions options = mpi_options();
  options.ranks = world_size() + 1;
  const Error error = capture_error([&] { World world(options); });
  EXPECT_EQ(error.kind(), ErrorKind::kConfig);
  EXPECT_THAT(error.what(), HasSubstr("world.ranks"));
  EXPECT_THAT(error.what(), HasSubstr("started " + std::to_string(world_size()) + " processes"));
}

TEST_F(MpiWorldTest, LocalBackendUnderMpirunIsAConfigError) {
  WorldOptions options;
  options.backend = "local";
  options.ranks = 2;
  const Error error = capture_error([&] { World world(options); });
  EXPECT_EQ(error.kind(), ErrorKind::kConfig);
  EXPECT_THAT(error.what(), HasSubstr("\"mpi\""));
}

TEST_F(MpiWorldTest, TheSameConfigOnEveryProcessPassesTheCheck) {
  const World world(mpi_options());
  EXPECT_NO_THROW(world.verify_same_config(R"({"model": {"type": "mlp"}, "steps": 10})"));
}

TEST_F(MpiWorldTest, AConfigThatDiffersOnSomeRanksIsReportedAtStartOnEveryRank) {
  // The last rank (and, with four, rank 2 too) resolved another config.
  const World world(mpi_options());
  const int last = world_size() - 1;
  const bool differs = world_rank() == last || (world_size() >= 4 && world_rank() == 2);
  const std::string config = differs ? R"({"steps": 11})" : R"({"steps": 10})";
  const Error error = capture_error([&] { world.verify_same_config(config); });
  EXPECT_EQ(error.kind(), ErrorKind::kConfig);
  EXPECT_THAT(error.what(), HasSubstr("different configs"));
  EXPECT_THAT(error.what(), HasSubstr("rank(s) " + std::string(world_size() >= 4 ? "2 (" : "") ));
  EXPECT_THAT(error.what(), HasSubstr(std::to_string(last) + " ("));
  if (world_size() >= 3) {
    EXPECT_THAT(error.what(), ::testing::Not(HasSubstr("rank(s) 1 (")));
  }
}

}  // namespace
}  // namespace zest
