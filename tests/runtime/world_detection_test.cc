// World detection from the config and the launcher's environment, without a launcher: each test
// sets the variables mpirun, srun or torchrun would set in this process, checks what is
// detected, and restores the environment it found.
#include "runtime/world_detection.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "runtime/world.h"
#include "tests/support/capture_error.h"

namespace zest {
namespace {

using ::testing::HasSubstr;

// Every variable detection reads.
const std::vector<std::string> kLauncherVariables = {
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
    "SLURM_PROCID",         "SLURM_NTASKS",         "SLURM_LOCALID",
    "RANK",                 "WORLD_SIZE",           "LOCAL_RANK",
    "MASTER_ADDR",          "MASTER_PORT"};

// Clears every launcher variable (the test may itself run under a launcher or in a Slurm job),
// sets the given ones, and puts back what was there on destruction.
class ScopedLauncherEnvironment {
 public:
  explicit ScopedLauncherEnvironment(const std::map<std::string, std::string>& variables) {
    for (const std::string& name : kLauncherVariables) {
      const char* value = std::getenv(name.c_str());
      saved_.emplace_back(name, value ? std::optional<std::string>(value) : std::nullopt);
      unsetenv(name.c_str());
    }
    for (const auto& [name, value] : variables) setenv(name.c_str(), value.c_str(), 1);
  }
  ~ScopedLauncherEnvironment() {
    for (const auto& [name, value] : saved_) {
      if (value) {
        setenv(name.c_str(), value->c_str(), 1);
      } else {
        unsetenv(name.c_str());
      }
    }
  }
  ScopedLauncherEnvironment(const ScopedLauncherEnvironment&) = delete;
  ScopedLauncherEnvironment& operator=(const ScopedLauncherEnvironment&) = delete;

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

const std::map<std::string, std::string> kOpenMpiRank2Of4 = {
    {"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "4"},
    {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}};
const std::map<std::string, std::string> kSlurmRank3Of8 = {
    {"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"}};
const std::map<std::string, std::string> kTorchrunRank1Of2 = {
    {"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"},
    {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29500"}};

using testing::capture_error;

TEST(WorldDetection, WithoutALauncherAutoIsThreadsOfOneProcess) {
  ScopedLauncherEnvironment environment({});
  const DetectedWorld world = detect_world("auto", 4);
  EXPECT_FALSE(world.processes);
  EXPECT_EQ(world.size, 4);
  EXPECT_EQ(world.rank, 0);
  EXPECT_EQ(world.backend, "local");
  EXPECT_EQ(world.describe(), "4 threads of one process");
  EXPECT_EQ(detect_world("local", 1).describe(), "1 thread of one process");
}

TEST(WorldDetection, OpenMpiEnvironmentIsProcesses) {
  ScopedLauncherEnvironment environment(kOpenMpiRank2Of4);
  for (const char* backend : {"auto", "mpi"}) {
    SCOPED_TRACE(backend);
    const DetectedWorld world = detect_world(backend, 1);
    EXPECT_TRUE(world.processes);
    EXPECT_EQ(world.size, 4);
    EXPECT_EQ(world.rank, 2);
    EXPECT_EQ(world.local_rank, 0);
    EXPECT_EQ(world.backend, "mpi");
    EXPECT_EQ(world.describe(), "4 processes (Open MPI), rank 2 local 0");
  }
  // world.ranks may repeat the launcher's count.
  EXPECT_EQ(detect_world("mpi", 4).size, 4);
}

TEST(WorldDetection, SlurmEnvironmentIsProcesses) {
  ScopedLauncherEnvironment environment(kSlurmRank3Of8);
  const DetectedWorld world = detect_world("auto", 1);
  EXPECT_TRUE(world.processes);
  EXPECT_EQ(world.describe(), "8 processes (Slurm), rank 3 local 1");
}

TEST(WorldDetection, ASlurmJobOfOneTaskStillRunsThreads) {
  // An sbatch script with one task, running the trainer directly: its threads are the ranks.
  ScopedLauncherEnvironment environment({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}});
  const DetectedWorld world = detect_world("auto", 2);
  EXPECT_FALSE(world.processes);
  EXPECT_EQ(world.size, 2);
}

TEST(WorldDetection, OpenMpiComesBeforeSlurmAndTorchrun) {
  std::map<std::string, std::string> variables = kOpenMpiRank2Of4;
  variables.insert(kSlurmRank3Of8.begin(), kSlurmRank3Of8.end());
  variables.insert(kTorchrunRank1Of2.begin(), kTorchrunRank1Of2.end());
  ScopedLauncherEnvironment environment(variables);
  EXPECT_EQ(detect_world("auto", 1).launcher, "Open MPI");
}

TEST(WorldDetection, SlurmComesBeforeTorchrun) {
  std::map<std::string, std::string> variables = kSlurmRank3Of8;
  variables.insert(kTorchrunRank1Of2.begin(), kTorchrunRank1Of2.end());
  ScopedLauncherEnvironment environment(variables);
  EXPECT_EQ(detect_world("auto", 1).launcher, "Slurm");
}

TEST(WorldDetection, TorchrunStyleEnvironmentWithoutMpiSaysToLaunchWithMpirun) {
  ScopedLauncherEnvironment environment(kTorchrunRank1Of2);
  for (const char* backend : {"auto", "mpi"}) {
    SCOPED_TRACE(backend);
    const Error error = capture_error([&] { detect_world(backend, 1); });
    EXPECT_EQ(error.kind(), ErrorKind::kConfig);
    EXPECT_THAT(error.what(), HasSubstr("RANK=1 and WORLD_SIZE=2"));
    EXPECT_THAT(error.what(), HasSubstr("mpirun -np 2"));
    EXPECT_THAT(error.what(), HasSubstr("srun -n 2"));
  }
}

TEST(WorldDetection, TorchrunStyleEnvironmentOfOneProcessRunsThreads) {
  ScopedLauncherEnvironment environment({{"RANK", "0"}, {"WORLD_SIZE", "1"}});
  EXPECT_FALSE(detect_world("auto", 3).processes);
}

TEST(WorldDetection, ExplicitLocalIsThreadsWhateverSlurmOrTorchrunSay) {
  std::map<std::string, std::string> variables = kSlurmRank3Of8;
  variables.insert(kTorchrunRank1Of2.begin(), kTorchrunRank1Of2.end());
  ScopedLauncherEnvironment environment(variables);
  const DetectedWorld world = detect_world("local", 2);
  EXPECT_FALSE(world.processes);
  EXPECT_EQ(world.size, 2);
}

TEST(WorldDetection, ExplicitLocalUnderMpirunWithSeveralProcessesIsAConfigError) {
  ScopedLauncherEnvironment environment(kOpenMpiRank2Of4);
  const Error error = capture_error([] { detect_world("local", 2); });
  EXPECT_EQ(error.kind(), ErrorKind::kConfig);
  EXPECT_THAT(error.what(), HasSubstr("world.backend"));
  EXPECT_THAT(error.what(), HasSubstr("rank 2 of 4"));
}

TEST(WorldDetection, ExplicitMpiWithoutALauncherIsOneProcess) {
  ScopedLauncherEnvironment environment({});
  const DetectedWorld world = detect_world("mpi", 1);
  EXPECT_TRUE(world.processes);
  EXPECT_EQ(world.size, 1);
  EXPECT_EQ(world.launcher, "MPI singleton");
}

TEST(WorldDetection, ExplicitMpiWithSeveralRanksButNoLauncherSaysHowToLaunch) {
  ScopedLauncherEnvironment environment({});
  const Error error = capture_error([] { detect_world("mpi", 4); });
  EXPECT_EQ(error.kind(), ErrorKind::kConfig);
  EXPECT_THAT(error.what(), HasSubstr("launch 4 processes with mpirun -np N"));
}

TEST(WorldDetection, WorldRanksThatDisagreeWithTheLauncherAreAConfigError) {
  ScopedLauncherEnvironment environment(kOpenMpiRank2Of4);
  const Error error = capture_error([] { detect_world("auto", 2); });
  EXPECT_EQ(error.kind(), ErrorKind::kConfig);
  EXPECT_THAT(error.what(), HasSubstr("world.ranks: is 2, but Open MPI started 4 processes"));
}

TEST(WorldDetection, MalformedOrInconsistentVariablesAreConfigErrors) {
  {
    ScopedLauncherEnvironment environment({{"SLURM_PROCID", "x1"}, {"SLURM_NTASKS", "4"}});
    const Error error = capture_error([] { detect_world("auto", 1); });
    EXPECT_EQ(error.kind(), ErrorKind::kConfig);
    EXPECT_THAT(error.what(), HasSubstr("SLURM_PROCID is \"x1\""));
  }
  {
    ScopedLauncherEnvironment environment({{"OMPI_COMM_WORLD_RANK", "4"},
                                           {"OMPI_COMM_WORLD_SIZE", "4"}});
    const Error error = capture_error([] { detect_world("auto", 1); });
    EXPECT_EQ(error.kind(), ErrorKind::kConfig);
    EXPECT_THAT(error.what(), HasSubstr("OMPI_COMM_WORLD_RANK=4"));
  }
}

TEST(WorldDetection, UnknownBackendIsAConfigError) {
  ScopedLauncherEnvironment environment({});
  const Error error = capture_error([] { detect_world("gloo", 1); });
  EXPECT_EQ(error.kind(), ErrorKind::kConfig);
  EXPECT_THAT(error.what(), HasSubstr("\"auto\""));
}

TEST(WorldDetection, AFakeEnvironmentCanBePassedInstead) {
  ScopedLauncherEnvironment environment({});
  const EnvReader fake = [](const char* name) -> const char* {
    const std::string key(name);
    if (key == "SLURM_PROCID") return "5";
    if (key == "SLURM_NTASKS") return "6";
    return nullptr;
  };
  EXPECT_EQ(detect_world("auto", 1, fake).describe(), "6 processes (Slurm), rank 5 local 0");
}

TEST(WorldDetection, WorldWithAutoAndNoLauncherRunsThreads) {
  ScopedLauncherEnvironment environment({});
  WorldOptions options;
  options.backend = "auto";
  options.ranks = 3;
  const World world(options);
  EXPECT_FALSE(world.detected().processes);
  EXPECT_EQ(world.size(), 3);
  EXPECT_TRUE(world.is_leader_process());
  EXPECT_NO_THROW(world.verify_same_config("anything"));  // threads share one config
  int ranks_run = 0;
  std::mutex mutex;
  world.run([&](RankContext&) {
    std::lock_guard lock(mutex);
    ++ranks_run;
  });
  EXPECT_EQ(ranks_run, 3);
}

#if !ZEST_HAVE_MPI
TEST(WorldDetection, ProcessesWithoutMpiInThisBuildAreAConfigError) {
  ScopedLauncherEnvironment environment(kOpenMpiRank2Of4);
  WorldOptions options;
  options.backend = "auto";
  const Error error = capture_error([&] { World world(options); });
  EXPECT_EQ(error.kind(), ErrorKind::kConfig);
  EXPECT_THAT(error.what(), HasSubstr("no MPI"));
}
#endif

}  // namespace
}  // namespace zest
