// zero_optimization.offload_param "cpu" (stage 3): each rank's parameter shards live in the
// device's host arena (category params there), are copied into their place in a gather ring
// slot before each gather, and the optimizer's update is written back to the host. Training is
// the same bits as with the shards on the device (the run without the feature is the
// reference), at worlds 1-4, fp32 and bf16, with and without offload_optimizer, with gradient
// accumulation and recomputation; the device holds no parameter shard; checkpoints move
// between runs with and without it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "base/error.h"
#include "tests/checkpoint/checkpoint_test_support.h"
#include "tests/engine/engine_test_support.h"
#include "tests/engine/recompute_test_support.h"

namespace zest {
namespace {

using ::testing::HasSubstr;
using testing::RunResult;
using testing::RunSpec;
using testing::run_mlp;

void offload_parameters(EngineOptions& options) {
  options.offload_param.device = OffloadDevice::kCpu;
}

void offload_both(EngineOptions& options) {
  offload_parameters(options);
  options.offload_optimizer.device = OffloadDevice::kCpu;
}

void offload_optimizer(EngineOptions& options) {
  options.offload_optimizer.device = OffloadDevice::kCpu;
}

using testing::same_bits;

// `learns`: the reference's loss fell (a run long enough to learn); otherwise only moved.
void expect_same_training(const RunResult& reference, const RunResult& run, bool learns = true) {
  EXPECT_TRUE(same_bits(reference.losses, run.losses))
      << "first loss " << reference.losses.front() << " vs " << run.losses.front();
  ASSERT_EQ(reference.params.size(), run.params.size());
  for (const auto& [name, values] : reference.params) {
    EXPECT_TRUE(same_bits(values, run.params.at(name))) << name;
  }
  if (learns) {
    EXPECT_LT(reference.losses.back(), reference.losses.front());
  } else {
    EXPECT_NE(reference.losses.back(), reference.losses.front());
  }
}

// ---------------------------------------------------------------------------------------------
// Parity with the shards on the device.

using ParityCase = std::tuple<int, DType, bool>;  // world, compute dtype, offload_optimizer

class ParameterOffloadParity : public ::testing::TestWithParam<ParityCase> {};

TEST_P(ParameterOffloadParity, LossesAndParametersAreTheBitsOfTheRunWithoutIt) {
  const auto [world, dtype, with_optimizer] = GetParam();
  RunSpec spec;
  spec.stage = 3;
  spec.world = world;
  spec.steps = 8;
  spec.compute_dtype = dtype;
  spec.clipping = 1.0f;
  // The reference keeps the parameters on the device and the optimizer where the run has it.
  spec.configure_engine = with_optimizer ? offload_optimizer : nullptr;
  const RunResult reference = run_mlp(spec);
  spec.configure_engine = with_optimizer ? offload_both : offload_parameters;
  const RunResult offloaded = run_mlp(spec);
  expect_same_training(reference, offloaded);
}

INSTANTIATE_TEST_SUITE_P(
    WorldsDtypesOptimizer, ParameterOffloadParity,
    ::testing::Combine(::testing::Values(1, 2, 3, 4),
                       ::testing::Values(DType::kFloat32, DType::kBFloat16),
                       ::testing::Bool()),
    [](const auto& info) {
      return "world" + std::to_string(std::get<0>(info.param)) + "_" +
             dtype_name(std::get<1>(info.param)) +
             (std::get<2>(info.param) ? "_optimizer_offloaded" : "");
    });

TEST(ParameterOffloadParityMore, AccumulationAndFp16LossScalingMatch) {
  RunSpec spec;
  spec.stage = 3;
  spec.world = 2;
  spec.steps = 6;
  spec.accumulation = 2;
  spec.compute_dtype = DType::kFloat16;
  spec.loss_scale.enabled = true;
  spec.loss_scale.initial_scale_power = 20;  // overflows first: skipped steps, then trains
  spec.loss_scale.hysteresis = 1;
  const RunResult reference = run_mlp(spec);
  spec.configure_engine = offload_parameters;
  const RunResult offloaded = run_mlp(spec);
  EXPECT_TRUE(reference.stats.front().skipped);
  for (std::size_t step = 0; step < reference.stats.size(); ++step) {
    EXPECT_EQ(offloaded.stats[step].skipped, reference.stats[step].skipped) << step;
  }
  expect_same_training(reference, offloaded, /*learns=*/false);  // 6 steps, the first skipped
}

TEST(ParameterOffloadParityMore, SerializedScheduleAndSgdMatch) {
  RunSpec spec;
  spec.stage = 3;
  spec.world = 4;
  spec.steps = 4;
  spec.optimizer = "SGD";
  spec.compute_dtype = DType::kBFloat16;
  spec.configure_engine = [](EngineOptions& options) { options.overlap_comm = false; };
  const RunResult reference = run_mlp(spec);
  spec.configure_engine = [](EngineOptions& options) {
    options.overlap_comm = false;
    offload_parameters(options);
  };
  expect_same_training(reference, run_mlp(spec), /*learns=*/false);  // 4 steps of SGD
}

// The GPT: a tied head that borrows the embedding, its gradient in its gather slot at a large
// vocabulary, and recomputation (full, selective, inputs waiting in the host arena).
struct GptCase {
  int world;
  DType dtype;
  int accumulation;
  ActivationCheckpointing checkpointing;
  bool offload_optimizer;
  int vocab_size;
};

class ParameterOffloadGpt : public ::testing::TestWithParam<GptCase> {};

TEST_P(ParameterOffloadGpt, RecomputedAccumulatedTrainingIsTheSameBits) {
  const GptCase c = GetParam();
  testing::Job job;
  job.stage = 3;
  job.world = c.world;
  job.dtype = c.dtype;
  job.accumulation = c.accumulation;
  job.checkpointing = c.checkpointing;
  job.offload_optimizer = c.offload_optimizer;
  job.vocab_size = c.vocab_size;
  SCOPED_TRACE(testing::describe(job));
  const testing::Training reference = testing::run_gpt(job);
  job.offload_param = true;
  testing::expect_bit_identical(reference, testing::run_gpt(job));
}

INSTANTIATE_TEST_SUITE_P(
    Jobs, ParameterOffloadGpt,
    ::testing::Values(
        GptCase{1, DType::kFloat32, 2, testing::policy(RecomputePolicy::kFull), false, 37},
        GptCase{2, DType::kBFloat16, 2, testing::policy(RecomputePolicy::kSelective), false, 37},
        GptCase{2, DType::kFloat32, 1, testing::policy(RecomputePolicy::kFull, true), true, 37},
        GptCase{4, DType::kBFloat16, 2, testing::policy(RecomputePolicy::kNone), true, 37},
        GptCase{2, DType::kFloat32, 2, testing::policy(RecomputePolicy::kNone), false, 257},
        GptCase{1, DType::kBFloat16, 1, testing::policy(RecomputePolicy::kSelective), true, 257}),
    [](const auto& info) {
      const GptCase& c = info.param;
      return "world" + std::to_string(c.world) + "_" + dtype_name(c.dtype) + "_accumulation" +
             std::to_string(c.accumulation) + "_" +
             recompute_policy_name(c.checkpointing.policy) +
             (c.checkpointing.cpu_checkpointing ? "_cpu" : "") +
             (c.offload_optimizer ? "_optimizer_offloaded" : "") + "_vocabulary" +
             std::to_string(c.vocab_size);
    });

// ---------------------------------------------------------------------------------------------
// Accounting: the shards are in the host arena, none on the device, as predicted.

class ParameterOffloadMemory : public ::testing::TestWithParam<std::tuple<int, DType>> {};

TEST_P(ParameterOffloadMemory, TheHostArenaHoldsTheShardsAndTheDeviceNone) {
  const auto [world, dtype] = GetParam();
  RunSpec spec;
  spec.stage = 3;
  spec.world = world;
  spec.steps = 2;
  spec.sizes = {64, 128, 96, 10};
  spec.compute_dtype = dtype;
  const RunResult on_device = run_mlp(spec);
  spec.configure_engine = offload_parameters;
  const RunResult offloaded = run_mlp(spec);
  for (int rank = 0; rank < world; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const std::size_t shards = on_device.usage[rank].peak_of(Category::kParams);
    EXPECT_GT(shards, 0u);
    EXPECT_EQ(offloaded.usage[rank].peak_of(Category::kParams), 0u);
    EXPECT_EQ(offloaded.host_usage[rank].current_of(Category::kParams), shards);
    EXPECT_EQ(offloaded.host_usage[rank].total_current, shards);  // and nothing else there
    EXPECT_EQ(offloaded.predicted[rank].params, 0u);
    EXPECT_EQ(offloaded.predicted[rank].host_params, shards);
    EXPECT_EQ(offloaded.usage[rank].peak_of(Category::kGrads),
              on_device.usage[rank].peak_of(Category::kGrads));
  }
}

INSTANTIATE_TEST_SUITE_P(WorldsAndDtypes, ParameterOffloadMemory,
                         ::testing::Combine(::testing::Values(1, 2),
                                            ::testing::Values(DType::kFloat32,
                                                              DType::kBFloat16)),
                         [](const auto& info) {
                           return "world" + std::to_string(std::get<0>(info.param)) + "_" +
                                  dtype_name(std::get<1>(info.param));
                         });

TEST(ParameterOffloadLimits, AFullHostArenaIsAnOutOfMemoryNamingIt) {
  RunSpec spec;
  spec.stage = 3;
  spec.world = 2;
  spec.steps = 1;
  spec.configure_engine = offload_parameters;
  spec.configure_world = [](WorldOptions& options) { options.host_memory = 256; };
  try {
    run_mlp(spec);
    FAIL() << "expected OutOfMemory";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kOutOfMemory);
    EXPECT_THAT(error.what(), HasSubstr(" host: asked "));
    EXPECT_THAT(error.what(), HasSubstr("for 'params'"));
  }
}

TEST(ParameterOffloadLimits, StagesBelowThreeAreAConfigErrorSayingWhy) {
  for (int stage : {0, 1, 2}) {
    RunSpec spec;
    spec.stage = stage;
    spec.steps = 1;
    spec.configure_engine = offload_parameters;
    try {
      run_mlp(spec);
      ADD_FAILURE() << "expected a config error at stage " << stage;
    } catch (const Error& error) {
      EXPECT_EQ(error.kind(), ErrorKind::kConfig);
      EXPECT_THAT(error.what(), HasSubstr("zero_optimization.offload_param.device"));
      EXPECT_THAT(error.what(), HasSubstr("only stage 3 shards the parameters"));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Checkpoints: the files do not depend on where the shards lived, so a run saved with them
// offloaded resumes with them on the device (and the other way round) as the uninterrupted run.

using testing::ScratchDirectory;
using testing::train_mlp;
using testing::TrainResult;
using testing::TrainSpec;

struct CheckpointCase {
  bool save_offloaded;
  bool resume_offloaded;
  DType dtype;
  bool offload_optimizer;
};

class ParameterOffloadCheckpoint : public ::testing::TestWithParam<CheckpointCase> {};

TEST_P(ParameterOffloadCheckpoint, ResumesAcrossNoneAndCpuAsTheUninterruptedRun) {
  const CheckpointCase c = GetParam();
  ScratchDirectory scratch;
  auto with = [&](bool offloaded) -> std::function<void(EngineOptions&)> {
    return [offloaded, c](EngineOptions& options) {
      if (offloaded) offload_parameters(options);
      if (c.offload_optimizer) offload_optimizer(options);
    };
  };
  TrainSpec reference_spec;
  reference_spec.world = 2;
  reference_spec.stage = 3;
  reference_spec.compute_dtype = c.dtype;
  reference_spec.configure_engine = with(c.resume_offloaded);
  const TrainResult reference = train_mlp(reference_spec);

  TrainSpec first = reference_spec;
  first.configure_engine = with(c.save_offloaded);
  first.steps = 3;
  first.save_dir = scratch.path("ckpt");
  first.save_at = 3;
  train_mlp(first);

  TrainSpec second = reference_spec;
  second.resume = scratch.path("ckpt");
  const TrainResult resumed = train_mlp(second);
  ASSERT_EQ(resumed.losses.size(), 3u);
  for (const auto& [step, loss] : resumed.losses) {
    EXPECT_EQ(loss, reference.losses.at(step)) << "loss at step " << step;
  }
  for (const auto& [name, values] : reference.params) {
    EXPECT_TRUE(same_bits(values, resumed.params.at(name))) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(
    SavesAndLoads, ParameterOffloadCheckpoint,
    ::testing::Values(CheckpointCase{true, false, DType::kFloat32, false},
                      CheckpointCase{false, true, DType::kFloat32, false},
                      CheckpointCase{true, true, DType::kBFloat16, false},
                      CheckpointCase{true, false, DType::kBFloat16, true},
                      CheckpointCase{false, true, DType::kFloat32, true}),
    [](const auto& info) {
      const CheckpointCase& c = info.param;
      return std::string(c.save_offloaded ? "cpu" : "none") + "_to_" +
             (c.resume_offloaded ? "cpu" : "none") + "_" + dtype_name(c.dtype) +
             (c.offload_optimizer ? "_optimizer_offloaded" : "");
    });

}  // namespace
}  // namespace zest
