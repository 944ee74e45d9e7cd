// ctest-labels: mpi
// ctest-mpirun-np: 2
// The engine with ranks as processes on GPUs: the `nccl` backend under mpirun, each process on
// the GPU of its local rank, NCCL's unique id sent over MPI (runtime/nccl_bootstrap_mpi_cuda.cc).
// The MLP at every stage against the same world of CPU ranks run as threads in this process.
// Where fewer GPUs are visible than processes, the parity test skips on every rank alike, saying
// why; where none is, every process's World refuses the cuda device with a config error and no
// process waits for another (that case runs in CI).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <string>

#include "base/error.h"
#include "runtime/cuda_device.h"
#include "runtime/mpi_process.h"
#include "runtime/world.h"
#include "tests/engine/engine_test_support.h"

namespace zest {
namespace {

using ::testing::HasSubstr;
using testing::RunResult;
using testing::RunSpec;

int visible_gpus() { return cuda::visible_devices().count; }

void on_gpu_processes(RunSpec& spec) {
  spec.configure_world = [](WorldOptions& options) {
    options.device = DeviceKind::kCuda;
    options.backend = "nccl";
    options.ranks = 1;  // the launcher decides
  };
}

class EngineOverNcclProcesses : public ::testing::Test {
 protected:
  // Every rank reaches this: a rank left waiting in a collective would hang the test here.
  void TearDown() override { MPI_Barrier(MPI_COMM_WORLD); }
};

TEST_F(EngineOverNcclProcesses, WithoutAGpuEveryProcessRefusesTheCudaWorld) {
  (void)MpiProcess::get();  // MPI started on every rank alike, whatever the test does next
  if (visible_gpus() > 0) GTEST_SKIP() << "a GPU is visible: this checks the refusal without one";
  RunSpec spec;
  spec.world = MpiProcess::get().size();
  on_gpu_processes(spec);
  try {
    (void)testing::run_mlp(spec);
    FAIL() << "a CUDA world of processes without a GPU was accepted";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kConfig);
    EXPECT_THAT(error.what(), HasSubstr("world.device: \"cuda\""));
  }
}

// As engine_cuda_test.cc's two-GPU threads test: cuBLASLt and OpenBLAS sum each product in
// another order and NCCL pre-divides its mean (ncclAvg), a relative 1e-6 per step that 10 steps
// keep far below 1e-4 of the loss; a missed reduction moves it by more than 1e-2.
TEST_F(EngineOverNcclProcesses, EveryStageMatchesTheSameCpuRanks) {
  const int processes = MpiProcess::get().size();
  if (visible_gpus() < processes) {
    GTEST_SKIP() << "needs " << processes << " GPUs, found " << visible_gpus();
  }
  for (int stage = 0; stage <= 3; ++stage) {
    RunSpec spec;
    spec.stage = stage;
    spec.world = processes;
    spec.steps = 10;
    const RunResult cpu = testing::run_mlp_as_threads(spec);
    on_gpu_processes(spec);
    const RunResult gpu = testing::run_mlp(spec);
    if (MpiProcess::get().rank() != 0) continue;  // rank 0's process holds the losses
    ASSERT_EQ(gpu.losses.size(), cpu.losses.size());
    for (std::size_t step = 0; step < cpu.losses.size(); ++step) {
      EXPECT_NEAR(gpu.losses[step], cpu.losses[step], 1e-4 * std::fabs(cpu.losses[step]))
          << "stage " << stage << ", step " << step;
    }
  }
}

}  // namespace
}  // namespace zest
