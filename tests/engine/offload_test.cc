// zero_optimization.offload_optimizer: the optimizer's master weights and moments live in the
// device's host arena (category offload) and the optimizer runs on the host. Training is the
// same with and without it; the device holds no optimizer state; the host arena's capacity is
// real; checkpoints move between runs with and without it; and a model too large for a device
// trains with a higher stage or with offload.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "base/error.h"
#include "models/gpt.h"
#include "tests/checkpoint/checkpoint_test_support.h"
#include "tests/engine/engine_test_support.h"

namespace zest {
namespace {

using ::testing::HasSubstr;
using testing::RunResult;
using testing::RunSpec;
using testing::run_mlp;

void offload_to_cpu(EngineOptions& options) {
  options.offload_optimizer.device = OffloadDevice::kCpu;
}

// The largest relative difference between two runs' losses and final parameters, and whether
// they are the same bits.
struct Difference {
  double largest = 0.0;
  bool identical = true;
};

void compare(const std::vector<float>& expected, const std::vector<float>& actual,
             Difference& difference) {
  ASSERT_EQ(expected.size(), actual.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const double scale = std::max(std::abs(static_cast<double>(expected[i])), 1e-30);
    difference.largest = std::max(difference.largest, std::abs(expected[i] - actual[i]) / scale);
    if (std::memcmp(&expected[i], &actual[i], sizeof(float)) != 0) difference.identical = false;
  }
}

Difference compare_runs(const RunResult& off, const RunResult& on) {
  Difference difference;
  compare(off.losses, on.losses, difference);
  for (const auto& [name, values] : off.params) compare(values, on.params.at(name), difference);
  return difference;
}

// ---------------------------------------------------------------------------------------------
// Parity: the same arithmetic on host buffers as on the device's.

using ParityCase = std::tuple<int, int, DType>;  // stage, world, compute dtype

class OffloadParity : public ::testing::TestWithParam<ParityCase> {};

TEST_P(OffloadParity, LossesAndParametersEqualTheRunWithoutOffload) {
  const auto [stage, world, dtype] = GetParam();
  RunSpec spec;
  spec.stage = stage;
  spec.world = world;
  spec.compute_dtype = dtype;
  spec.clipping = 1.0f;
  const RunResult off = run_mlp(spec);
  spec.configure_engine = offload_to_cpu;
  const RunResult on = run_mlp(spec);
  // The bound: 1e-6 relative (fp32 arithmetic). The engine performs the same operations
  // in the same order on the host, so the runs are in fact the same bits, which is checked too.
  const Difference difference = compare_runs(off, on);
  for (std::size_t step = 0; step < off.losses.size(); ++step) {
    EXPECT_NEAR(on.losses[step], off.losses[step], 1e-6 * std::abs(off.losses[step])) << step;
  }
  EXPECT_LE(difference.largest, 1e-6);
  EXPECT_TRUE(difference.identical) << "largest relative difference " << difference.largest;
  EXPECT_LT(off.losses.back(), off.losses.front());  // it trained
}

INSTANTIATE_TEST_SUITE_P(
    StagesWorldsDtypes, OffloadParity,
    ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Values(1, 2, 4),
                       ::testing::Values(DType::kFloat32, DType::kBFloat16)),
    [](const auto& info) {
      return "stage" + std::to_string(std::get<0>(info.param)) + "_world" +
             std::to_string(std::get<1>(info.param)) + "_" +
             dtype_name(std::get<2>(info.param));
    });

TEST(OffloadParityMore, AccumulationAndFp16LossScalingMatch) {
  for (int stage : {1, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    RunSpec spec;
    spec.stage = stage;
    spec.world = 2;
    spec.steps = 6;
    spec.accumulation = 2;
    spec.compute_dtype = DType::kFloat16;
    spec.loss_scale.enabled = true;
    spec.loss_scale.initial_scale_power = 20;  // overflows twice: skipped steps, backed off
    spec.loss_scale.hysteresis = 1;
    const RunResult off = run_mlp(spec);
    spec.configure_engine = offload_to_cpu;
    const RunResult on = run_mlp(spec);
    EXPECT_TRUE(off.stats.front().skipped);
    EXPECT_FALSE(off.stats.back().skipped);  // and then trains
    for (std::size_t step = 0; step < off.stats.size(); ++step) {
      EXPECT_EQ(on.stats[step].skipped, off.stats[step].skipped) << step;
      EXPECT_EQ(on.stats[step].loss_scale, off.stats[step].loss_scale) << step;
    }
    const Difference difference = compare_runs(off, on);
    EXPECT_TRUE(difference.identical) << "largest relative difference " << difference.largest;
  }
}

TEST(OffloadParityMore, SerializedScheduleAndSgdMatch) {
  RunSpec spec;
  spec.stage = 2;
  spec.world = 4;
  spec.steps = 4;
  spec.optimizer = "SGD";
  spec.compute_dtype = DType::kBFloat16;
  spec.configure_engine = [](EngineOptions& options) { options.overlap_comm = false; };
  const RunResult off = run_mlp(spec);
  spec.configure_engine = [](EngineOptions& options) {
    options.overlap_comm = false;
    offload_to_cpu(options);
  };
  const RunResult on = run_mlp(spec);
  const Difference difference = compare_runs(off, on);
  EXPECT_TRUE(difference.identical) << "largest relative difference " << difference.largest;
}

// ---------------------------------------------------------------------------------------------
// Accounting: the device keeps no optimizer state; the host arena keeps master + moments + the
// transfer shard, exactly as predicted.

class OffloadMemory : public ::testing::TestWithParam<std::tuple<int, DType>> {};

TEST_P(OffloadMemory, DeviceHoldsNoOptimizerStateAndTheHostArenaHoldsItAll) {
  const auto [stage, dtype] = GetParam();
  RunSpec spec;
  spec.stage = stage;
  spec.world = 2;
  spec.steps = 2;
  spec.sizes = {64, 128, 96, 10};
  spec.compute_dtype = dtype;
  spec.configure_engine = offload_to_cpu;
  std::vector<ShardLayout> layouts;  // the same shard lengths on every rank
  spec.after_step = [&](int rank, int, const StepStats&, Trainer& trainer) {
    if (rank == 0) layouts = trainer.layouts();
  };
  const RunResult on = run_mlp(spec);
  spec.configure_engine = nullptr;
  spec.after_step = nullptr;
  const RunResult off = run_mlp(spec);
  for (int rank = 0; rank < spec.world; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const MemoryUsage& device = on.usage[rank];
    const MemoryUsage& host = on.host_usage[rank];
    const MemoryPrediction& predicted = on.predicted[rank];
    EXPECT_EQ(device.peak_of(Category::kOptimizer), 0u);
    EXPECT_EQ(device.peak_of(Category::kOffload), 0u);
    EXPECT_EQ(predicted.optimizer, 0u);
    // Params and grads stay where they were.
    EXPECT_EQ(device.peak_of(Category::kParams), off.usage[rank].peak_of(Category::kParams));
    EXPECT_EQ(device.peak_of(Category::kGrads), off.usage[rank].peak_of(Category::kGrads));
    // What the device no longer holds, the host does: the optimizer state of the run without
    // offload (fp32 moments, and the master in 2-byte compute), plus in fp32 the host's own
    // master copy, plus the transfer shard in the compute dtype, plus in 2-byte compute one fp32
    // widening of the largest shard (the host updates the units one at a time).
    std::size_t shard_elements = 0;
    std::size_t largest_shard = 0;
    for (const ShardLayout& layout : layouts) {
      shard_elements += layout.shard_length();
      largest_shard = std::max(largest_shard, layout.shard_length());
    }
    const std::size_t widening = dtype == DType::kFloat32 ? 0 : largest_shard * sizeof(float);
    const std::size_t element = dtype_size(dtype);
    const std::size_t master_and_moments = shard_elements * sizeof(float) * 3;
    EXPECT_EQ(off.usage[rank].peak_of(Category::kOptimizer),
              dtype == DType::kFloat32 ? shard_elements * sizeof(float) * 2 : master_and_moments);
    EXPECT_EQ(host.current_of(Category::kOffload),
              master_and_moments + shard_elements * element + widening);
    EXPECT_EQ(host.peak_of(Category::kOffload), host.current_of(Category::kOffload));
    EXPECT_EQ(predicted.offload, host.current_of(Category::kOffload));
    // Nothing else lives in the host arena, between steps or during them.
    EXPECT_EQ(host.total_current, host.current_of(Category::kOffload));
  }
}

INSTANTIATE_TEST_SUITE_P(StagesAndDtypes, OffloadMemory,
                         ::testing::Combine(::testing::Values(1, 2, 3),
                                            ::testing::Values(DType::kFloat32, DType::kBFloat16)),
                         [](const auto& info) {
                           return "stage" + std::to_string(std::get<0>(info.param)) + "_" +
                                  dtype_name(std::get<1>(info.param));
                         });

TEST(OffloadMemoryLimits, AFullHostArenaIsAnOutOfMemoryNamingIt) {
  RunSpec spec;
  spec.stage = 2;
  spec.world = 2;
  spec.steps = 1;
  spec.configure_engine = offload_to_cpu;
  spec.configure_world = [](WorldOptions& options) { options.host_memory = 1024; };
  try {
    run_mlp(spec);
    FAIL() << "expected OutOfMemory";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kOutOfMemory);
    const std::string message = error.what();
    EXPECT_THAT(message, HasSubstr(" host: asked "));
    EXPECT_THAT(message, HasSubstr("for 'offload'"));
    EXPECT_THAT(message, HasSubstr("1.00 KiB capacity"));
    EXPECT_THAT(message, HasSubstr("world.host_memory"));
  }
}

TEST(OffloadMemoryLimits, StageZeroIsAConfigError) {
  RunSpec spec;
  spec.stage = 0;
  spec.steps = 1;
  spec.configure_engine = offload_to_cpu;
  try {
    run_mlp(spec);
    FAIL() << "expected a config error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kConfig);
    EXPECT_THAT(error.what(), HasSubstr("zero_optimization.offload_optimizer.device"));
    EXPECT_THAT(error.what(), HasSubstr("stage 1, 2 or 3"));
  }
}

// ---------------------------------------------------------------------------------------------
// Checkpoints: the files do not depend on offload, so a run saved with it resumes without it
// (and the other way round), also at another world size and stage.

using testing::ScratchDirectory;
using testing::train_mlp;
using testing::TrainResult;
using testing::TrainSpec;

struct CheckpointCase {
  bool save_offloaded;
  int from_world, from_stage, to_world, to_stage;
  DType dtype;
};

class OffloadCheckpoint : public ::testing::TestWithParam<CheckpointCase> {};

TEST_P(OffloadCheckpoint, ResumesWithOrWithoutOffloadAsTheUninterruptedRun) {
  const CheckpointCase c = GetParam();
  ScratchDirectory scratch;
  auto with = [](bool offloaded) -> std::function<void(EngineOptions&)> {
    if (!offloaded) return nullptr;
    return offload_to_cpu;
  };
  TrainSpec reference_spec;
  reference_spec.world = c.to_world;
  reference_spec.stage = c.to_stage;
  reference_spec.compute_dtype = c.dtype;
  reference_spec.configure_engine = with(!c.save_offloaded);
  const TrainResult reference = train_mlp(reference_spec);

  TrainSpec first;
  first.world = c.from_world;
  first.stage = c.from_stage;
  first.compute_dtype = c.dtype;
  first.configure_engine = with(c.save_offloaded);
  first.steps = 3;
  first.save_dir = scratch.path("ckpt");
  first.save_at = 3;
  train_mlp(first);

  TrainSpec second = reference_spec;
  second.resume = scratch.path("ckpt");
  const TrainResult resumed = train_mlp(second);
  EXPECT_EQ(resumed.losses.size(), 3u);
  // Same world size: bit-identical to the uninterrupted run, as without offload. Another world
  // size (fp32 only): the order of fp32 sums across ranks differs, so 1e-6 relative as in
  // checkpoint_reshard_test; in bf16 such a difference can flip a rounding, one bf16 ulp.
  const bool same_world = c.from_world == c.to_world;
  for (const auto& [step, loss] : resumed.losses) {
    const float expected = reference.losses.at(step);
    if (same_world) {
      EXPECT_EQ(loss, expected) << "loss at step " << step;
    } else {
      EXPECT_NEAR(loss, expected, 1e-6 * std::abs(expected) + 1e-7) << "loss at step " << step;
    }
  }
  for (const auto& [name, values] : reference.params) {
    const std::vector<float>& other = resumed.params.at(name);
    ASSERT_EQ(values.size(), other.size()) << name;
    for (std::size_t i = 0; i < values.size(); ++i) {
      if (same_world) {
        ASSERT_EQ(values[i], other[i]) << name << "[" << i << "]";
      } else {
        ASSERT_NEAR(values[i], other[i], 1e-6 * std::abs(values[i]) + 1e-7)
            << name << "[" << i << "]";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    SavesAndLoads, OffloadCheckpoint,
    ::testing::Values(CheckpointCase{true, 2, 2, 2, 2, DType::kFloat32},
                      CheckpointCase{false, 2, 2, 2, 2, DType::kFloat32},
                      CheckpointCase{true, 2, 1, 2, 1, DType::kBFloat16},
                      CheckpointCase{false, 2, 3, 2, 3, DType::kBFloat16},
                      CheckpointCase{true, 4, 1, 2, 3, DType::kFloat32},
                      CheckpointCase{false, 2, 3, 4, 1, DType::kFloat32}),
    [](const auto& info) {
      const CheckpointCase& c = info.param;
      return std::string(c.save_offloaded ? "offloaded_to_plain" : "plain_to_offloaded") +
             "_w" + std::to_string(c.from_world) + "s" + std::to_string(c.from_stage) + "_w" +
             std::to_string(c.to_world) + "s" + std::to_string(c.to_stage) + "_" +
             dtype_name(c.dtype);
    });

// ---------------------------------------------------------------------------------------------
// Capacity: at a device capacity C, a GPT whose model state does not fit at stage 0 trains at
// stage 3 on 4 ranks, and one that does not fit on 1 rank trains there with the optimizer
// offloaded.

struct GptJob {
  GptConfig model;
  int stage = 0;
  int world = 1;
  DType dtype = DType::kFloat32;
  bool offload = false;
  std::size_t device_memory = kUnlimitedCapacity;
  int steps = 2;
  int rows = 4;  // global batch rows; divides by the world size
};

struct GptOutcome {
  std::vector<float> losses;
  std::size_t device_peak = 0;  // the largest rank's
  std::size_t host_peak = 0;
};

GptOutcome train_gpt(const GptJob& job) {
  GptOutcome outcome;
  std::vector<std::size_t> device_peaks(job.world), host_peaks(job.world);
  WorldOptions world_options;
  world_options.ranks = job.world;
  world_options.device_memory = job.device_memory;
  world_options.timeout = std::chrono::seconds(60);
  World(world_options).run([&](RankContext& context) {
    Gpt model(job.model);
    EngineOptions options;
    options.stage = job.stage;
    options.compute_dtype = job.dtype;
    if (job.offload) offload_to_cpu(options);
    Engine engine(context, options);
    OptimizerOptions optimizer;
    optimizer.lr = 1e-2f;
    auto trainer = engine.shard(model, make_optimizer(optimizer));
    const std::int64_t rows = job.rows / context.world_size;
    const std::int64_t seq = job.model.seq_len;
    for (int step = 0; step < job.steps; ++step) {
      std::mt19937 rng(100 + step);
      std::vector<std::int32_t> tokens(static_cast<std::size_t>(job.rows * (seq + 1)));
      for (std::int32_t& token : tokens) {
        token = static_cast<std::int32_t>(rng() % job.model.vocab_size);
      }
      std::vector<std::int32_t> inputs, targets;
      for (std::int64_t row = context.rank * rows; row < (context.rank + 1) * rows; ++row) {
        const auto first = tokens.begin() + row * (seq + 1);
        inputs.insert(inputs.end(), first, first + seq);
        targets.insert(targets.end(), first + 1, first + seq + 1);
      }
      Batch batch{Tensor{inputs.data(), {rows, seq}, DType::kInt32},
                  Tensor{targets.data(), {rows, seq}, DType::kInt32}};
      trainer->forward_backward(batch);
      const StepStats stats = trainer->step();
      if (context.rank == 0) outcome.losses.push_back(stats.loss);
    }
    context.synchronize();
    device_peaks[context.rank] = context.allocator().usage().total_peak;
    host_peaks[context.rank] = context.device.host_allocator().usage().total_peak;
  });
  outcome.device_peak = *std::max_element(device_peaks.begin(), device_peaks.end());
  outcome.host_peak = *std::max_element(host_peaks.begin(), host_peaks.end());
  return outcome;
}

// 8 blocks of width 64: 409,216 parameters, so 6.55 MB of fp32 model state (16 bytes each:
// params, grads, two moments) at stage 0, against a device of 5.5 MiB (5.77 MB). Measured peaks
// with an unlimited device: stage 3 on 4 ranks 3.5 MB; one rank at stage 2 with the optimizer
// offloaded 4.3 MB (the host arena holds the other 6.5 MB).
const GptConfig kLargeForTheDevice{/*n_layer=*/8, /*n_head=*/2, /*n_embd=*/64, /*vocab_size=*/128,
                                   /*seq_len=*/16};
constexpr std::size_t kDeviceMemory = 5632 * 1024;

void expect_out_of_device_memory(const GptJob& job) {
  try {
    train_gpt(job);
    ADD_FAILURE() << "expected OutOfMemory at stage " << job.stage << " on " << job.world
                  << " rank(s)";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kOutOfMemory) << error.what();
    EXPECT_THAT(error.what(), HasSubstr("out of memory on cpu:"));
    EXPECT_THAT(error.what(), HasSubstr("5.50 MiB capacity"));
  }
}

TEST(OffloadCapacity, AModelThatFailsAtStageZeroTrainsAtStageThreeOnFourRanks) {
  ASSERT_EQ(Gpt(kLargeForTheDevice).parameter_count(), 409216);
  GptJob job;
  job.model = kLargeForTheDevice;
  job.world = 4;
  job.device_memory = kDeviceMemory;
  job.stage = 0;
  expect_out_of_device_memory(job);
  job.stage = 3;
  const GptOutcome trained = train_gpt(job);
  ASSERT_EQ(trained.losses.size(), 2u);
  EXPECT_LE(trained.device_peak, kDeviceMemory);
  job.device_memory = kUnlimitedCapacity;
  job.stage = 0;
  const GptOutcome unlimited = train_gpt(job);
  EXPECT_GT(unlimited.device_peak, kDeviceMemory);
  // The same training: only the order of fp32 sums across ranks differs between the stages.
  for (std::size_t step = 0; step < trained.losses.size(); ++step) {
    EXPECT_NEAR(trained.losses[step], unlimited.losses[step], 1e-6 * unlimited.losses[step]);
  }
}

TEST(OffloadCapacity, AModelThatFailsOnOneRankTrainsThereWithOffload) {
  GptJob job;
  job.model = kLargeForTheDevice;
  job.world = 1;
  job.rows = 1;
  job.stage = 2;
  job.device_memory = kDeviceMemory;
  expect_out_of_device_memory(job);
  job.offload = true;
  const GptOutcome trained = train_gpt(job);
  ASSERT_EQ(trained.losses.size(), 2u);
  EXPECT_LE(trained.device_peak, kDeviceMemory);
  EXPECT_GT(trained.host_peak, 0u);
  job.offload = false;
  job.device_memory = kUnlimitedCapacity;
  const GptOutcome unlimited = train_gpt(job);
  EXPECT_GT(unlimited.device_peak, kDeviceMemory);
  EXPECT_EQ(trained.losses, unlimited.losses);  // offload changes where, not what
}

// The GPT's head borrows the embedding (tied weights): at stage 3 the head's gather of the
// embedding must wait for the embedding's updated shard as well.
TEST(OffloadParityGpt, TiedWeightsTrainTheSameAtEveryStage) {
  for (int stage : {1, 2, 3}) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      SCOPED_TRACE("stage " + std::to_string(stage) + " " + dtype_name(dtype));
      GptJob job;
      job.model = GptConfig{2, 2, 16, 37, 8};
      job.world = 2;
      job.stage = stage;
      job.dtype = dtype;
      job.steps = 4;
      const GptOutcome off = train_gpt(job);
      job.offload = true;
      const GptOutcome on = train_gpt(job);
      EXPECT_EQ(on.losses, off.losses);
    }
  }
}

}  // namespace
}  // namespace zest
