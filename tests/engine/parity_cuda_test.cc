// ctest-labels: gpu
// The engine on the CUDA device: the same MLP runs as tests/engine/parity_test.cc, on one
// GPU (and on two where two are visible), against the same runs on the CPU device, and a
// checkpoint written from GPU memory. Skips, printing why, where no GPU is visible; the
// refusal without a GPU runs everywhere.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "base/error.h"
#include "models/mlp.h"
#include "planner/peak_plan.h"
#include "runtime/world.h"
#include "tests/checkpoint/checkpoint_test_support.h"
#include "tests/engine/engine_test_support.h"
#include "tests/support/cuda_test_support.h"

namespace zest {
namespace {

using ::testing::HasSubstr;
using testing::RunResult;
using testing::RunSpec;

// `device_memory`: each rank's GPU capped at that many bytes (an emulated smaller GPU).
void on_cuda(RunSpec& spec, std::size_t device_memory = kUnlimitedCapacity) {
  spec.configure_world = [device_memory](WorldOptions& world) {
    world.device = DeviceKind::kCuda;
    world.backend = "nccl";
    world.device_memory = device_memory;
  };
}

RunResult run_on(DeviceKind device, RunSpec spec) {
  if (device == DeviceKind::kCuda) on_cuda(spec);
  return testing::run_mlp(spec);
}

void offload(RunSpec& spec) {
  spec.configure_engine = [](EngineOptions& options) {
    options.offload_optimizer.device = OffloadDevice::kCpu;
  };
}

int visible_gpus() { return cuda::visible_devices().count; }

// Losses: cuBLASLt (fp32, no TF32) and OpenBLAS sum each product in another order, a relative
// 1e-6 difference per GEMM that the steps carry forward; over 10 steps of the MLP it stays far
// below 1e-4 of the loss, while a wrong kernel or a missed reduction moves the loss by more than
// 1e-2 in the first steps.
void expect_losses_close(const RunResult& got, const RunResult& want, const std::string& what) {
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (std::size_t step = 0; step < got.losses.size(); ++step) {
    EXPECT_NEAR(got.losses[step], want.losses[step], 1e-4 * std::fabs(want.losses[step]))
        << what << ", step " << step;
  }
}

// Parameters after SGD, which moves them linearly in the gradients: the GEMMs' rounding
// differences stay within 1e-4 of the largest parameter.
void expect_params_close(const RunResult& got, const RunResult& want, const std::string& what) {
  ASSERT_EQ(got.params.size(), want.params.size());
  for (const auto& [name, values] : want.params) {
    testing::expect_close_normwise(got.params.at(name), values, 1e-4, what + " " + name);
  }
}

TEST(EngineCuda, WithoutAGpuTheCudaWorldIsAConfigErrorThatSaysWhy) {
  if (visible_gpus() > 0) GTEST_SKIP() << "a GPU is visible: this checks the refusal without one";
  WorldOptions options;
  options.device = DeviceKind::kCuda;
  options.backend = "nccl";
  try {
    World world(options);
    FAIL() << "a CUDA world without a GPU was accepted";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kConfig);
    EXPECT_THAT(error.what(), HasSubstr("world.device: \"cuda\""));
    EXPECT_THAT(error.what(), HasSubstr("sees none"));
  }
}

TEST(EngineCuda, MoreRanksThanGpusIsAConfigErrorBeforeAnythingRuns) {
  ZEST_SKIP_WITHOUT_CUDA();
  WorldOptions options;
  options.device = DeviceKind::kCuda;
  options.backend = "nccl";
  options.ranks = visible_gpus() + 1;
  try {
    World world(options);
    FAIL() << options.ranks << " ranks on " << visible_gpus() << " GPUs were accepted";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kConfig);
    EXPECT_THAT(error.what(), HasSubstr("one rank per GPU"));
  }
}

TEST(EngineCuda, EveryStageMatchesTheCpuDeviceOnOneGpu) {
  ZEST_SKIP_WITHOUT_CUDA();
  for (int stage = 0; stage <= 3; ++stage) {
    RunSpec spec;
    spec.stage = stage;
    spec.steps = 10;
    const RunResult cpu = run_on(DeviceKind::kCpu, spec);
    const RunResult gpu = run_on(DeviceKind::kCuda, spec);
    expect_losses_close(gpu, cpu, "AdamW, stage " + std::to_string(stage));
    EXPECT_LT(gpu.losses.back(), gpu.losses.front()) << "stage " << stage << " did not learn";
  }
}

TEST(EngineCuda, SgdParametersMatchTheCpuDevice) {
  ZEST_SKIP_WITHOUT_CUDA();
  for (int stage : {0, 3}) {
    RunSpec spec;
    spec.stage = stage;
    spec.steps = 10;
    spec.optimizer = "SGD";
    spec.clipping = 1.0f;
    expect_params_close(run_on(DeviceKind::kCuda, spec), run_on(DeviceKind::kCpu, spec),
                        "SGD, stage " + std::to_string(stage));
  }
}

TEST(EngineCuda, OneGpuGivesTheSameNumbersAtEveryStage) {
  ZEST_SKIP_WITHOUT_CUDA();
  // With one rank every collective is a copy, and the kernels are deterministic: the stages
  // differ only in where the same bytes live, so the runs agree bit for bit.
  RunSpec spec;
  spec.steps = 6;
  const RunResult reference = run_on(DeviceKind::kCuda, spec);
  for (int stage = 1; stage <= 3; ++stage) {
    spec.stage = stage;
    const RunResult run = run_on(DeviceKind::kCuda, spec);
    testing::expect_bit_identical(run.losses, reference.losses,
                                  "stage " + std::to_string(stage) + " losses");
  }
}

TEST(EngineCuda, Bf16TrainingTracksTheCpuDevice) {
  ZEST_SKIP_WITHOUT_CUDA();
  // The casts are bit-identical to the CPU's; the products are not: on the GPU they take their
  // inputs rounded to bf16 (2^-9 relative each, as autocast), on the CPU exactly, and a bf16
  // rounding of a result that such a difference tips moves it by a bf16 ulp. Both are noise of
  // bf16's own size; over 10 steps it stays within 1e-2 of the loss, while a wrong cast or a
  // lost gradient moves the loss by more than 1e-1.
  for (int stage : {0, 3}) {
    RunSpec spec;
    spec.stage = stage;
    spec.steps = 10;
    spec.compute_dtype = DType::kBFloat16;
    spec.communication_dtype = DType::kBFloat16;
    const RunResult cpu = run_on(DeviceKind::kCpu, spec);
    const RunResult gpu = run_on(DeviceKind::kCuda, spec);
    for (std::size_t step = 0; step < cpu.losses.size(); ++step) {
      EXPECT_NEAR(gpu.losses[step], cpu.losses[step], 1e-2 * std::fabs(cpu.losses[step]))
          << "bf16, stage " << stage << ", step " << step;
    }
  }
}

TEST(EngineCuda, TwoGpusMatchTwoCpuRanks) {
  ZEST_SKIP_WITHOUT_CUDA();
  if (visible_gpus() < 2) GTEST_SKIP() << "needs 2 GPUs, found " << visible_gpus();
  // NCCL's mean pre-divides each input (ncclAvg), the host backends divide the sum: a rounding
  // apart, inside the GEMM tolerance above.
  for (int stage = 0; stage <= 3; ++stage) {
    RunSpec spec;
    spec.stage = stage;
    spec.world = 2;
    spec.steps = 10;
    expect_losses_close(run_on(DeviceKind::kCuda, spec), run_on(DeviceKind::kCpu, spec),
                        "2 ranks, stage " + std::to_string(stage));
  }
}

TEST(EngineCuda, TheOffloadedOptimizerGivesTheGpusNumbersBitForBit) {
  ZEST_SKIP_WITHOUT_CUDA();
  // The host runs the CPU bodies of AdamW and the casts, which the GPU's equal to 0 ulps
  // (tests/kernels/adamw_cuda_test.cc, cast_cuda_test.cc), in the same order over the same
  // shards: moving the optimizer to the host changes where the numbers are made, not them.
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    for (int stage = 1; stage <= 3; ++stage) {
      RunSpec spec;
      spec.stage = stage;
      spec.steps = 6;
      spec.compute_dtype = dtype;
      const RunResult on_gpu = run_on(DeviceKind::kCuda, spec);
      offload(spec);
      const RunResult offloaded = run_on(DeviceKind::kCuda, spec);
      const std::string what =
          std::string(dtype_name(dtype)) + ", stage " + std::to_string(stage);
      testing::expect_bit_identical(offloaded.losses, on_gpu.losses, what + " losses");
      for (const auto& [name, values] : on_gpu.params) {
        testing::expect_bit_identical(offloaded.params.at(name), values, what + " " + name);
      }
      EXPECT_GT(offloaded.host_usage[0].total_peak, 0u) << what << ": nothing in host memory";
    }
  }
}

TEST(EngineCuda, OffloadTrainsWhereTheOptimizerStateDoesNotFitTheGpu) {
  ZEST_SKIP_WITHOUT_CUDA();
  // A GPU capped at what the offloaded run needs: without offload the AdamW moments (8 bytes a
  // parameter of the shard, more than the 1 KiB margin) come back to the GPU and do not fit.
  RunSpec spec;
  spec.stage = 2;
  spec.steps = 3;
  spec.sizes = {64, 256, 256, 16};
  offload(spec);
  const RunResult measured = run_on(DeviceKind::kCuda, spec);
  const std::size_t capacity = measured.usage[0].total_peak + 1024;
  on_cuda(spec, capacity);
  const RunResult capped = testing::run_mlp(spec);
  EXPECT_LT(capped.losses.back(), capped.losses.front());
  spec.configure_engine = nullptr;
  try {
    testing::run_mlp(spec);
    FAIL() << "the optimizer state fit a GPU capped at " << capacity << " bytes without offload";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kOutOfMemory) << error.what();
    EXPECT_THAT(error.what(), HasSubstr("optimizer"));
  }
}

TEST(EngineCuda, ThePlannerPredictsTheGpusPeaks) {
  ZEST_SKIP_WITHOUT_CUDA();
  // The planner's CUDA terms (planner/peak_plan.h): the compute stream's 32 MiB product scratch,
  // the batch copied in, frees accounted when enqueued. Within 5% per category, as on the CPU
  // (tests/planner/peak_plan_test.cc); the comm stream's few KiB of reduction scratch, which the
  // planner does not count, are far inside that.
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    for (int stage : {0, 3}) {
      RunSpec spec;
      spec.stage = stage;
      spec.steps = 3;
      spec.compute_dtype = dtype;
      spec.communication_dtype = dtype;
      const RunResult run = run_on(DeviceKind::kCuda, spec);
      Mlp model(MlpConfig{spec.sizes});
      EngineOptions options;
      options.stage = stage;
      options.compute_dtype = dtype;
      options.communication_dtype = dtype;
      const std::int64_t rows = spec.global_batch;
      const std::int64_t features = spec.sizes.front();
      PeakPlanInput input = plan_input(model, {rows, features}, options, 2, 1);
      input.device = DeviceKind::kCuda;
      input.batch_bytes = static_cast<std::size_t>(rows * features) * sizeof(float) +
                          static_cast<std::size_t>(rows) * sizeof(std::int32_t);
      const PeakPrediction plan = predict_peak(input);
      for (Category category : all_categories()) {
        if (category == Category::kOffload) continue;
        const double measured = static_cast<double>(run.usage[0].peak_of(category));
        EXPECT_NEAR(static_cast<double>(plan.of(category)), measured, 0.05 * measured + 64)
            << dtype_name(dtype) << ", stage " << stage << ", " << category_name(category);
      }
    }
  }
}

TEST(EngineCuda, ACheckpointFromGpuMemoryResumesExactlyAndLoadsOnTheCpu) {
  ZEST_SKIP_WITHOUT_CUDA();
  testing::ScratchDirectory scratch;
  testing::TrainSpec spec;
  spec.stage = 3;
  spec.device = DeviceKind::kCuda;
  spec.steps = 6;
  const testing::TrainResult straight = testing::train_mlp(spec);

  spec.steps = 3;
  spec.save_dir = scratch.path("checkpoints");
  spec.save_at = 3;
  testing::train_mlp(spec);
  spec.save_dir.clear();
  spec.save_at = -1;
  spec.steps = 6;
  spec.resume = scratch.path("checkpoints");
  const testing::TrainResult resumed = testing::train_mlp(spec);
  for (std::int64_t step = 3; step < 6; ++step) {
    EXPECT_EQ(resumed.losses.at(step), straight.losses.at(step)) << "step " << step;
  }
  for (const auto& [name, values] : straight.params) {
    testing::expect_bit_identical(resumed.params.at(name), values, "resumed " + name);
  }

  // The same bytes on the CPU device: a checkpoint does not depend on where it was written.
  testing::TrainSpec on_cpu = spec;
  on_cpu.device = DeviceKind::kCpu;
  on_cpu.steps = 3;
  on_cpu.resume = scratch.path("checkpoints");
  const testing::TrainResult loaded = testing::train_mlp(on_cpu);
  spec.resume = scratch.path("checkpoints");
  spec.steps = 3;
  const testing::TrainResult gpu_loaded = testing::train_mlp(spec);
  for (const auto& [name, values] : gpu_loaded.params) {
    testing::expect_bit_identical(loaded.params.at(name), values, "loaded on the CPU " + name);
  }
}

}  // namespace
}  // namespace zest
