// Activation recomputation (engine/recompute.h) changes no bit: with full and selective
// recomputation and with the kept inputs offloaded, every loss and every final parameter equals
// the same run without them, for the GPT and the MLP, at stages 0-3, on 1-4 ranks, in fp32 and
// bf16, with gradient accumulation. And the options that name nothing are refused by key.
#include <gtest/gtest.h>
#include <gmock/gmock.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "models/gpt.h"
#include "tests/engine/engine_test_support.h"
#include "tests/engine/recompute_test_support.h"

namespace zest {
namespace {

using ::testing::HasSubstr;
using testing::RunResult;
using testing::RunSpec;
using testing::run_mlp;
using testing::Job;
using testing::Training;
using testing::describe;
using testing::expect_bit_identical;
using testing::policy;
using testing::run_gpt;
using testing::kGpt;
using testing::kSteps;

Training run_mlp_job(const Job& job) {
  RunSpec spec;
  spec.stage = job.stage;
  spec.world = job.world;
  spec.steps = kSteps;
  spec.global_batch = 48;
  spec.accumulation = job.accumulation;
  spec.sizes = {13, 31, 17, 19, 7};
  spec.compute_dtype = job.dtype;
  spec.communication_dtype = job.dtype;
  spec.configure_engine = [job](EngineOptions& options) {
    options.activation_checkpointing = job.checkpointing;
    if (job.offload_optimizer) options.offload_optimizer.device = OffloadDevice::kCpu;
  };
  RunResult run = run_mlp(spec);
  return {run.losses, run.params};
}

// The jobs each policy is checked on: every stage, the worlds 1-4 among them, both dtypes,
// accumulation at two of them.
std::vector<Job> jobs() {
  return {{0, 1, DType::kFloat32, 1, {}, false}, {1, 2, DType::kBFloat16, 2, {}, false},
          {2, 4, DType::kFloat32, 2, {}, false}, {3, 3, DType::kBFloat16, 1, {}, false},
          {3, 4, DType::kFloat32, 2, {}, false}, {2, 2, DType::kBFloat16, 1, {}, true},
          {3, 2, DType::kBFloat16, 2, {}, false, 1024}, {3, 1, DType::kFloat32, 1, {}, true, 1024}};
}

class Recompute : public ::testing::TestWithParam<RecomputePolicy> {};
}  // namespace
void PrintTo(RecomputePolicy policy, std::ostream* out) { *out << recompute_policy_name(policy); }
namespace {

TEST_P(Recompute, GptTrainsBitIdenticallyWithoutIt) {
  for (Job job : jobs()) {
    const Training plain = run_gpt(job);
    job.checkpointing = policy(GetParam());
    SCOPED_TRACE(describe(job));
    expect_bit_identical(plain, run_gpt(job));
  }
}

TEST_P(Recompute, GptWithItsCheckpointsOffloadedTrainsBitIdenticallyWithoutIt) {
  for (Job job : jobs()) {
    const Training plain = run_gpt(job);
    job.checkpointing = policy(GetParam(), /*cpu=*/true);
    SCOPED_TRACE(describe(job));
    expect_bit_identical(plain, run_gpt(job));
  }
}

TEST_P(Recompute, GptEveryOtherUnitTrainsBitIdentically) {
  Job job{3, 2, DType::kFloat32, 2, {}, false};
  const Training plain = run_gpt(job);
  job.checkpointing = policy(GetParam());
  job.checkpointing.every = 2;
  SCOPED_TRACE(describe(job));
  expect_bit_identical(plain, run_gpt(job));
  job.checkpointing.every = 1;
  job.checkpointing.first = 2;
  expect_bit_identical(plain, run_gpt(job));
}

INSTANTIATE_TEST_SUITE_P(Policies, Recompute,
                         ::testing::Values(RecomputePolicy::kFull, RecomputePolicy::kSelective),
                         [](const auto& info) { return recompute_policy_name(info.param); });

TEST(RecomputeFull, MlpTrainsBitIdenticallyWithoutIt) {
  for (Job job : jobs()) {
    const Training plain = run_mlp_job(job);
    for (bool cpu : {false, true}) {
      job.checkpointing = policy(RecomputePolicy::kFull, cpu);
      SCOPED_TRACE(describe(job));
      expect_bit_identical(plain, run_mlp_job(job));
    }
  }
}

// The forward of a recomputed unit in its first pass keeps nothing: with every block recomputed
// the activations' peak falls well below the plain run's, and selective sits between.
TEST(RecomputeMemory, ActivationsShrinkWithEachPolicy) {
  auto activations = [](RecomputePolicy kind) {
    std::size_t peak = 0;
    WorldOptions world_options;
    world_options.ranks = 2;
    World(world_options).run([&](RankContext& context) {
      Gpt model(GptConfig{6, 2, 32, 37, 16});
      EngineOptions options;
      options.stage = 3;
      options.activation_checkpointing = policy(kind);
      Engine engine(context, options);
      auto trainer = engine.shard(model, make_optimizer(OptimizerOptions{}));
      std::vector<std::int32_t> tokens(4 * 16, 5);
      Batch batch{Tensor{tokens.data(), {4, 16}, DType::kInt32},
                  Tensor{tokens.data(), {4, 16}, DType::kInt32}};
      trainer->forward_backward(batch);
      trainer->step();
      context.synchronize();
      if (context.rank == 0) peak = context.allocator().usage().peak_of(Category::kActivations);
    });
    return peak;
  };
  const std::size_t none = activations(RecomputePolicy::kNone);
  const std::size_t selective = activations(RecomputePolicy::kSelective);
  const std::size_t full = activations(RecomputePolicy::kFull);
  EXPECT_LT(selective, none);
  EXPECT_LT(full, selective);
  EXPECT_LT(full * 2, none) << "full " << full << " of " << none;
}

// ---- options that name nothing -------------------------------------------------------------

std::string shard_error(Module& model, const ActivationCheckpointing& checkpointing,
                        std::size_t host_memory = kUnlimitedCapacity) {
  std::string message;
  WorldOptions world_options;
  world_options.host_memory = host_memory;
  World(world_options).run([&](RankContext& context) {
    EngineOptions options;
    options.activation_checkpointing = checkpointing;
    Engine engine(context, options);
    try {
      engine.shard(model, make_optimizer(OptimizerOptions{}));
    } catch (const Error& error) {
      EXPECT_EQ(error.kind(), ErrorKind::kConfig);
      message = error.what();
    }
  });
  return message;
}

TEST(RecomputeOptions, SelectiveForAModelWhoseUnitsCannotIsRefusedByKey) {
  Mlp mlp(MlpConfig{{13, 31, 7}});
  const std::string message = shard_error(mlp, policy(RecomputePolicy::kSelective));
  EXPECT_THAT(message, HasSubstr("activation_checkpointing.policy"));
  EXPECT_THAT(message, HasSubstr("\"full\""));
  EXPECT_EQ(message.find('\n'), std::string::npos);
}

TEST(RecomputeOptions, AUnitListThatNamesNoUnitIsRefusedByKey) {
  Gpt gpt(kGpt);  // 5 units: embedding, 3 blocks, head
  ActivationCheckpointing every = policy(RecomputePolicy::kFull);
  every.every = 5;  // unit 4 only: the head, never recomputed
  EXPECT_THAT(shard_error(gpt, every),
              HasSubstr("activation_checkpointing.units: every 5th unit names no unit"));
  ActivationCheckpointing first = policy(RecomputePolicy::kFull);
  first.first = 1;  // the embedding only: its gradient may replace its parameters
  EXPECT_THAT(shard_error(gpt, first),
              HasSubstr("activation_checkpointing.units: the first 1 names no unit"));
  EXPECT_THAT(shard_error(gpt, first), HasSubstr("; raise first"));  // naming more, not fewer
  EXPECT_THAT(shard_error(gpt, every), HasSubstr("; lower every"));
  // Nothing named narrowed: the policy, not the list, is what to change.
  Mlp one_layer(MlpConfig{{13, 7}});
  EXPECT_EQ(shard_error(one_layer, policy(RecomputePolicy::kFull)),
            "activation_checkpointing.policy: \"full\" finds no unit to recompute among the "
            "model's 1 unit (the last and an embedding never are); set \"none\"");
}

TEST(RecomputeOptions, CheckpointOffloadWithoutAHostArenaIsRefusedByKey) {
  Gpt gpt(kGpt);
  const std::string message = shard_error(gpt, policy(RecomputePolicy::kFull, true), 0);
  EXPECT_THAT(message, HasSubstr("activation_checkpointing.cpu_checkpointing: true needs a host "
                                 "arena"));
  EXPECT_THAT(message, HasSubstr("world.host_memory is 0"));
  EXPECT_THAT(shard_error(gpt, policy(RecomputePolicy::kNone, true)),
              HasSubstr("activation_checkpointing.cpu_checkpointing: true needs "
                        "activation_checkpointing.policy"));
}

// With the checkpoints offloaded, the host arena holds each recomputed unit's input, and the
// device's activations fall below those of recomputation alone.
TEST(RecomputeMemory, OffloadedCheckpointsLeaveTheDevice) {
  auto peaks = [](bool cpu) {
    std::pair<std::size_t, std::size_t> result;
    WorldOptions world_options;
    World(world_options).run([&](RankContext& context) {
      Gpt model(GptConfig{6, 2, 32, 37, 16});
      EngineOptions options;
      options.stage = 3;
      options.activation_checkpointing = policy(RecomputePolicy::kFull, cpu);
      Engine engine(context, options);
      auto trainer = engine.shard(model, make_optimizer(OptimizerOptions{}));
      std::vector<std::int32_t> tokens(4 * 16, 5);
      Batch batch{Tensor{tokens.data(), {4, 16}, DType::kInt32},
                  Tensor{tokens.data(), {4, 16}, DType::kInt32}};
      trainer->forward_backward(batch);
      trainer->step();
      context.synchronize();
      result = {context.allocator().usage().peak_of(Category::kActivations),
                context.device.host_allocator().usage().peak_of(Category::kOffload)};
    });
    return result;
  };
  const auto [device_kept, host_none] = peaks(false);
  const auto [device_offloaded, host_kept] = peaks(true);
  EXPECT_EQ(host_none, 0u);
  // Blocks 0-5 recomputed: the inputs of units 1-6, [4, 16, 32] floats each.
  EXPECT_EQ(host_kept, 6u * 4 * 16 * 32 * sizeof(float));
  EXPECT_LT(device_offloaded, device_kept);
}

}  // namespace
}  // namespace zest
