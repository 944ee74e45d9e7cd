// Pipeline stages over a tensor-parallel GPT (3D parallelism: world.ranks = pipeline stages ×
// data-parallel ranks × tensor-parallel ranks, the tensor index fastest). Each tensor-parallel
// index runs its own pipeline over the ranks of that index (runtime/tensor_parallel_groups.h), and
// each pipeline stage's layers are split across its tensor-parallel group. Against one rank
// training the whole GPT (models/gpt.h, an independent implementation) on the same global batch,
// over 10 steps: every step's loss and gradient norm, and every parameter afterwards (the ranks'
// slices put back together), agree within fp32 reduction order — TP 2 × PP 2 with and without
// sequence parallelism, with the interleaved schedule, with clipping, and TP 2 × PP 2 × DP 2 at
// ZeRO 3 (8 ranks as threads). The replicated parameters stay identical across each group.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "models/gpt.h"
#include "models/tensor_parallel_gpt.h"
#include "pipeline/pipeline_trainer.h"
#include "runtime/device_mesh.h"
#include "runtime/tensor_parallel_groups.h"
#include "runtime/world.h"
#include "tests/models/gpt_parity_support.h"
#include "tests/support/capture_error.h"
#include "tests/support/tensor_slices.h"

namespace zest {
namespace {

using ::testing::HasSubstr;

// 4 heads, a vocabulary of 36 and 16 channels divide among 2 ranks; 2 blocks make 4 units, one
// per virtual stage of 2 pipeline stages × 2 chunks.
const GptConfig kConfig{/*n_layer=*/2, /*n_head=*/4, /*n_embd=*/16, /*vocab_size=*/36,
                        /*seq_len=*/8};
constexpr std::int64_t kGlobalBatch = 8;  // sequences per step
constexpr int kMicroBatches = 4;
constexpr int kSteps = 10;

struct Layout {
  int tensor = 1;  // 1: the reference, the whole GPT on one rank
  int stages = 1;
  int data = 1;
  int zero = 0;
  bool sequence = false;
  int chunks = 1;
  float clipping = 0.0f;
};

struct RunResult {
  std::vector<float> losses;
  std::vector<float> norms;
  std::vector<float> largest_loss_gap;  // per step, between the ranks' forward_backward losses
  std::map<std::string, std::vector<float>> params;
  float largest_replica_gap = 0.0f;
};

void make_global_batch(int step, std::vector<std::int32_t>& inputs,
                       std::vector<std::int32_t>& targets) {
  testing::make_gpt_batch(kConfig, 900 + step, kGlobalBatch, inputs, targets);
}

Batch rows_of(std::vector<std::int32_t>& inputs, std::vector<std::int32_t>& targets,
              std::int64_t first, std::int64_t count) {
  const std::int64_t t = kConfig.seq_len;
  return {Tensor{inputs.data() + first * t, {count, t}, DType::kInt32},
          Tensor{targets.data() + first * t, {count, t}, DType::kInt32}};
}

RunResult run_reference(float clipping) {
  RunResult result;
  WorldOptions world;
  world.ranks = 1;
  World(world).run([&](RankContext& context) {
    Gpt model(kConfig);
    EngineOptions options;
    options.gradient_clipping = clipping;
    Engine engine(context, options);
    auto trainer = engine.shard(model, make_optimizer(testing::parity_adamw()));
    std::vector<std::int32_t> inputs, targets;
    for (int step = 0; step < kSteps; ++step) {
      make_global_batch(step, inputs, targets);
      trainer->forward_backward(rows_of(inputs, targets, 0, kGlobalBatch));
      const StepStats stats = trainer->step();
      result.losses.push_back(stats.loss);
      result.norms.push_back(stats.grad_norm);
    }
    for (const std::string& name : trainer->parameter_names()) {
      result.params[name] = trainer->full_parameter(name);
    }
  });
  return result;
}

std::size_t whole_size(const std::string& name) {
  static const std::map<std::string, std::size_t> sizes = testing::whole_sizes(kConfig);
  return sizes.at(name);
}

RunResult run_pipeline(const Layout& layout) {
  RunResult result;
  result.largest_loss_gap.assign(kSteps, 0.0f);
  std::vector<std::vector<float>> losses(static_cast<std::size_t>(kSteps));
  std::map<std::string, testing::WholeParameter> whole;
  std::mutex mutex;
  WorldOptions world_options;
  world_options.ranks = layout.stages * layout.data * layout.tensor;
  world_options.timeout = std::chrono::seconds(60);
  World(world_options).run([&](RankContext& world) {
    const DeviceMesh mesh(world.world_size, layout.stages, layout.tensor);
    TensorParallelGroups groups = split_tensor_parallel_groups(world, mesh);
    const TensorSlice slice{groups.at.tensor_parallel_index, layout.tensor, groups.tensor.get(),
                            layout.sequence};
    EngineOptions options;
    options.stage = layout.zero;
    options.gradient_clipping = layout.clipping;
    PipelineOptions pipeline;
    pipeline.stages = layout.stages;
    pipeline.micro_batches = kMicroBatches;
    pipeline.virtual_chunks = layout.chunks;
    pipeline.schedule =
        layout.chunks > 1 ? ScheduleKind::kInterleavedOneFOneB : ScheduleKind::kOneFOneB;
    PipelineTrainer trainer(
        *groups.data_context, options, pipeline,
        [slice] { return std::make_unique<TensorParallelGpt>(kConfig, slice); },
        testing::parity_adamw());
    const std::int64_t rows = kGlobalBatch / layout.data;
    const std::int64_t first = groups.at.data_parallel_index * rows;
    std::vector<std::int32_t> inputs, targets;
    for (int step = 0; step < kSteps; ++step) {
      make_global_batch(step, inputs, targets);
      const float loss = trainer.forward_backward(rows_of(inputs, targets, first, rows));
      const StepStats stats = trainer.step();
      const std::lock_guard<std::mutex> lock(mutex);
      losses[static_cast<std::size_t>(step)].push_back(loss);
      if (world.rank == 0) {
        result.losses.push_back(stats.loss);
        result.norms.push_back(stats.grad_norm);
      }
    }
    // Each tensor index's slices, gathered by its pipeline (a collective over its ranks), placed
    // by its first rank; the specs say where (the pipeline's model is this rank's slices).
    const TensorParallelGpt probe(kConfig, slice);
    std::map<std::string, ParamSpec> specs;
    for (Unit* unit : const_cast<TensorParallelGpt&>(probe).units()) {
      for (const ParamSpec& spec : unit->parameters()) specs[unit->name() + "." + spec.name] = spec;
    }
    for (const std::string& name : trainer.parameter_names()) {
      const std::vector<float> value = trainer.full_parameter(name);
      if (groups.data_context->rank != 0) continue;
      const std::lock_guard<std::mutex> lock(mutex);
      whole.try_emplace(name, whole_size(name)).first->second.place(specs.at(name), value);
    }
  });
  for (const auto& [name, parameter] : whole) {
    EXPECT_TRUE(parameter.complete()) << name << ": a part of it was on no rank";
    result.params[name] = parameter.values;
    result.largest_replica_gap = std::max(result.largest_replica_gap, parameter.largest_gap);
  }
  for (std::size_t step = 0; step < losses.size(); ++step) {
    for (float loss : losses[step]) {
      result.largest_loss_gap[step] =
          std::max(result.largest_loss_gap[step], std::abs(loss - losses[step].front()));
    }
  }
  return result;
}

const RunResult& reference() {
  static const RunResult result = run_reference(0.0f);
  return result;
}

// The runs differ from the reference only in the order fp32 sums are taken (the row-parallel
// products and the LayerNorms' input gradients summed across the group, the vocabulary's exp-sum
// split, the micro-batches' gradients accumulated): gpt_parity_support.h's bound, 1e-5 relative,
// for the losses and norms, and for the parameters with a 2e-6 absolute floor. Measured over the
// 10 steps of every layout here: losses within 7.1e-8 relative, gradient norms within 1.2e-7,
// parameters within 1.2e-7 absolute. Leaving out the norm's sum across the tensor-parallel group
// fails every parity test here.
void expect_same_training(const RunResult& expected, const RunResult& run) {
  ASSERT_EQ(run.losses.size(), expected.losses.size());
  for (std::size_t step = 0; step < expected.losses.size(); ++step) {
    EXPECT_NEAR(run.losses[step], expected.losses[step],
                testing::kParityRelative * std::abs(expected.losses[step]))
        << "loss at step " << step + 1;
    EXPECT_NEAR(run.norms[step], expected.norms[step],
                testing::kParityRelative * expected.norms[step])
        << "gradient norm at step " << step + 1;
    EXPECT_EQ(run.largest_loss_gap[step], 0.0f) << "the ranks disagree on step " << step + 1;
  }
  EXPECT_EQ(run.largest_replica_gap, 0.0f) << "a replicated parameter differs across a group";
  testing::expect_same_parameters(kConfig, expected.params, run.params);
}

TEST(TensorParallelPipeline, Tp2TimesPp2MatchesOneRankOverTenSteps) {
  EXPECT_LT(reference().losses.back(), reference().losses.front());  // training did something
  for (bool sequence : {false, true}) {
    SCOPED_TRACE(sequence ? "sequence-parallel" : "without sequence parallelism");
    expect_same_training(reference(), run_pipeline({2, 2, 1, 1, sequence}));
  }
}

TEST(TensorParallelPipeline, Tp2TimesPp2TimesDp2AtZero3MatchesOneRank) {
  for (bool sequence : {false, true}) {
    SCOPED_TRACE(sequence ? "sequence-parallel" : "without sequence parallelism");
    expect_same_training(reference(), run_pipeline({2, 2, 2, 3, sequence}));
  }
}

TEST(TensorParallelPipeline, InterleavedScheduleMatchesOneRank) {
  expect_same_training(reference(), run_pipeline({2, 2, 1, 2, true, 2}));
}

// With clipping below the norm, the clip scale is the norm's: a pipeline that summed the norm over
// its own tensor index only (half the slices) would clip differently, and fail the parameters too.
TEST(TensorParallelPipeline, GradientNormCountsEverySliceOnceAndClipsTheSame) {
  const RunResult expected = run_reference(0.05f);
  EXPECT_GT(expected.norms.front(), 0.05f);  // so the clip applies
  expect_same_training(expected, run_pipeline({2, 2, 1, 1, false, 1, 0.05f}));
}

TEST(TensorParallelPipeline, HybridShardingIsRefusedWithTheReason) {
  WorldOptions world_options;
  world_options.ranks = 8;
  std::mutex mutex;
  std::vector<std::string> messages;
  World(world_options).run([&](RankContext& world) {
    TensorParallelGroups groups = split_tensor_parallel_groups(world, DeviceMesh(8, 2, 2));
    const TensorSlice slice{groups.at.tensor_parallel_index, 2, groups.tensor.get(), false};
    EngineOptions options;
    options.stage = 3;
    options.hybrid_shard_size = 1;
    PipelineOptions pipeline;
    pipeline.stages = 2;
    pipeline.micro_batches = 2;
    const Error error = testing::capture_error([&] {
      PipelineTrainer trainer(
          *groups.data_context, options, pipeline,
          [slice] { return std::make_unique<TensorParallelGpt>(kConfig, slice); },
          testing::parity_adamw());
    });
    const std::lock_guard<std::mutex> lock(mutex);
    messages.push_back(error.what());
  });
  ASSERT_EQ(messages.size(), 8u);
  for (const std::string& message : messages) {
    EXPECT_THAT(message, HasSubstr("zero_optimization.hybrid_shard_size: hybrid sharding is not "
                                   "supported with tensor parallelism"));
  }
}

}  // namespace
}  // namespace zest
