// The planner on a tensor-parallel rank (models/tensor_parallel_gpt.h): the rank's slices declared
// (TensorParallelGpt::unit_memory) and trained on the shape-only device over a shape-only
// tensor-parallel group, held against the allocator of every rank of the same job trained for
// two steps — every category and the total to the byte — at TP 2 and TP 4, with and without
// sequence parallelism, alone and beside 2 data-parallel ranks at ZeRO 1, 2 and 3, in fp32 and
// bf16, with every unit recomputed (activation_checkpointing "full"), with the optimizer's state
// (and at stage 3 the parameters) offloaded to host memory, and under 2 pipeline stages
// (each pipeline stage's plan per tensor rank). The group's last rank, the one zest-estimate plans,
// is the largest; the slices shrink the model state and sequence parallelism the activations.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "models/gpt.h"
#include "models/tensor_parallel_gpt.h"
#include "pipeline/pipeline_trainer.h"
#include "pipeline/schedule_generators.h"
#include "planner/peak_plan.h"
#include "planner/pipeline_plan.h"
#include "runtime/device_mesh.h"
#include "runtime/shape_communicator.h"
#include "runtime/tensor_parallel_groups.h"
#include "runtime/world.h"
#include "tests/planner/gpt_plan_support.h"
#include "tests/planner/measured_peaks.h"

namespace zest {
namespace {

// 4 heads, a vocabulary of 36, 16 channels and 8 tokens: each divides by 1, 2 and 4, and every
// row of the residual stream is 64 bytes, the allocator's alignment, so that buffers a unit
// allocates in turn (the embedding's) cost what their declared sum does.
const GptConfig kConfig{/*n_layer=*/2, /*n_head=*/4, /*n_embd=*/16, /*vocab_size=*/36,
                        /*seq_len=*/8};

struct Job {
  int tensor = 2;
  bool sequence = false;
  int data = 1;
  int stage = 0;
  DType dtype = DType::kFloat32;
  int accumulation = 1;
  std::int64_t sequences = 2;  // per data-parallel rank
  bool recompute = false;      // activation_checkpointing "full" on every unit
  bool offload = false;        // the optimizer's state in host memory, and at stage 3 the params
  int hybrid = 0;              // zero_optimization.hybrid_shard_size; 0: off
  int hpz = 1;                 // zero_optimization.zero_hpz_partition_size
  bool quantized_weights = false;    // qwZ
  bool quantized_gradients = false;  // qgZ

  EngineOptions options() const {
    EngineOptions options = testing::engine_options(stage, dtype, accumulation);
    if (recompute) options.activation_checkpointing.policy = RecomputePolicy::kFull;
    if (offload) {
      options.offload_optimizer.device = OffloadDevice::kCpu;
      if (stage == 3) options.offload_param.device = OffloadDevice::kCpu;
    }
    options.hybrid_shard_size = hybrid;
    options.hpz_group_size = hpz;
    options.quantized_weights = quantized_weights;
    options.quantized_gradients = quantized_gradients;
    return options;
  }
  std::string name() const {
    return "TP " + std::to_string(tensor) + (sequence ? " + SP" : "") + " x DP " +
           std::to_string(data) + ", stage " + std::to_string(stage) + ", " + dtype_name(dtype) +
           ", accumulation " + std::to_string(accumulation) + (recompute ? ", recomputed" : "") +
           (offload ? ", offloaded" : "") +
           (hybrid > 0 ? ", hybrid " + std::to_string(hybrid) : "") +
           (hpz > 1 ? ", hpZ " + std::to_string(hpz) : "") + (quantized_weights ? ", qwZ" : "") +
           (quantized_gradients ? ", qgZ" : "");
  }
};

// The plan of tensor rank `rank`: its model over a shape-only group, as zest-estimate builds it
// (tools/common/memory_estimate.h) for the group's last rank.
PeakPrediction plan(const Job& job, int rank) {
  shape::ShapeCommunicator group(rank, job.tensor);
  TensorParallelGpt model(kConfig, TensorSlice{rank, job.tensor, &group, job.sequence});
  // Hybrid sharding divides the state over a shard group of the data-parallel ranks.
  PeakPlanInput input = plan_input(model, {job.sequences, kConfig.seq_len}, job.options(),
                                   make_optimizer(OptimizerOptions{})->state_count(),
                                   job.hybrid > 0 ? job.hybrid : job.data);
  input.tensor_parallel_size = job.tensor;
  return predict_peak(input);
}

// Every rank's allocator after two steps, frees held until a wait proves them as the plan
// replays them; the ranks of a tensor-parallel group get the same tokens (their data-parallel
// index's).
std::vector<MemoryUsage> train(const Job& job) {
  std::vector<MemoryUsage> usage(static_cast<std::size_t>(job.tensor * job.data));
  WorldOptions world_options;
  world_options.ranks = job.tensor * job.data;
  world_options.hold_frees = true;
  World(world_options).run([&](RankContext& world) {
    TensorParallelGroups groups =
        split_tensor_parallel_groups(world, DeviceMesh(world.world_size, 1, job.tensor));
    TensorParallelGpt model(kConfig, TensorSlice{groups.at.tensor_parallel_index, job.tensor,
                                                 groups.tensor.get(), job.sequence});
    Engine engine(*groups.data_context, job.options());
    auto trainer = engine.shard(model, make_optimizer(OptimizerOptions{}));
    std::mt19937 rng(11 + static_cast<std::uint32_t>(groups.data_context->rank));
    std::uniform_int_distribution<std::int32_t> token(0, kConfig.vocab_size - 1);
    std::vector<std::int32_t> inputs(static_cast<std::size_t>(job.sequences * kConfig.seq_len));
    std::vector<std::int32_t> targets(inputs.size());
    for (auto& id : inputs) id = token(rng);
    for (auto& id : targets) id = token(rng);
    const Batch batch{Tensor{inputs.data(), {job.sequences, kConfig.seq_len}, DType::kInt32},
                      Tensor{targets.data(), {job.sequences, kConfig.seq_len}, DType::kInt32}};
    for (int step = 0; step < 2; ++step) {
      for (int micro = 0; micro < job.accumulation; ++micro) trainer->forward_backward(batch);
      trainer->step();
    }
    world.synchronize();
    MemoryUsage& mine = usage[static_cast<std::size_t>(world.rank)];
    mine = world.allocator().usage();
    // The offloaded state is in the host arena, which the plan's `offload` is (outside the device
    // total).
    const auto offload = static_cast<std::size_t>(Category::kOffload);
    mine.peak[offload] = world.device.host_allocator().usage().peak[offload];
  });
  return usage;
}

void expect_measured_equals_planned(const Job& job) {
  SCOPED_TRACE(job.name());
  std::vector<PeakPrediction> plans;
  for (int rank = 0; rank < job.tensor; ++rank) plans.push_back(plan(job, rank));
  // World rank w is tensor rank w % t of data-parallel rank w / t (runtime/device_mesh.h).
  testing::expect_largest_peaks_equal_plans(
      [&](std::size_t rank) -> const PeakPrediction& {
        return plans[rank % static_cast<std::size_t>(job.tensor)];
      },
      [&] { return train(job); });
}

TEST(TensorParallelPlan, EveryCategoryEqualsTheMeasuredPeakToTheByte) {
  for (const Job& job :
       {Job{2, false}, Job{2, true}, Job{4, false}, Job{4, true}, Job{2, false, 2, 1},
        Job{2, true, 2, 3}, Job{2, false, 2, 3}, Job{2, true, 2, 2}, Job{4, true, 1, 3},
        Job{2, true, 1, 0, DType::kFloat32, 2}, Job{2, true, 2, 3, DType::kBFloat16, 2},
        Job{2, false, 1, 1, DType::kFloat32, 1, 2, true},
        Job{4, true, 2, 3, DType::kFloat32, 2, 2, true},
        Job{2, false, 2, 2, DType::kFloat32, 1, 2, false, true},
        Job{2, true, 2, 3, DType::kBFloat16, 1, 2, false, true}}) {
    expect_measured_equals_planned(job);
  }
}

// Hybrid sharding, hpZ's secondary shard, qwZ's quantized gathers and qgZ's quantized reductions
// over a tensor index's data-parallel group: planned = measured as without tensor parallelism.
TEST(TensorParallelPlan, HybridShardsAndZeroPlusPlusEqualTheMeasuredPeak) {
  Job hybrid{2, false, 4, 3};
  hybrid.hybrid = 2;
  Job secondary{2, true, 4, 3};
  secondary.hpz = 2;
  Job weights{2, true, 2, 3};
  weights.quantized_weights = true;
  Job gradients{2, false, 2, 2};
  gradients.quantized_gradients = true;
  for (const Job& job : {hybrid, secondary, weights, gradients}) {
    expect_measured_equals_planned(job);
  }
}

TEST(TensorParallelPlan, TheGroupsLastRankIsTheLargest) {
  for (bool sequence : {false, true}) {
    const Job job{4, sequence};
    const PeakPrediction last = plan(job, job.tensor - 1);
    for (int rank = 0; rank < job.tensor; ++rank) {
      const PeakPrediction other = plan(job, rank);
      for (Category category : all_categories()) {
        EXPECT_LE(other.of(category), last.of(category)) << category_name(category);
      }
      EXPECT_LE(other.device_total, last.device_total) << "rank " << rank;
    }
  }
}

// Each rank holds a t-th of the blocks' matrices and of wte, and whole copies of the rest; with
// sequence parallelism its activations are about a t-th of one rank's (Korthikanti et al.).
TEST(TensorParallelPlan, SlicesShrinkTheModelStateAndSequenceParallelismTheActivations) {
  const PeakPrediction whole = predict_peak(
      testing::gpt_plan_input(kConfig, 2, testing::engine_options(0, DType::kFloat32, 1), 1));
  const PeakPrediction sliced = plan(Job{4, false}, 3);
  const PeakPrediction sequence = plan(Job{4, true}, 3);
  EXPECT_LT(sliced.of(Category::kParams), whole.of(Category::kParams) / 2);
  EXPECT_GT(sliced.of(Category::kParams), whole.of(Category::kParams) / 4);
  EXPECT_EQ(sequence.of(Category::kParams), sliced.of(Category::kParams));
  EXPECT_LT(sliced.of(Category::kActivations), whole.of(Category::kActivations));
  EXPECT_LT(sequence.of(Category::kActivations), sliced.of(Category::kActivations));
}

// Recomputing every unit keeps only the blocks' inputs from forward to backward: fewer
// activation bytes on the rank than keeping what each block saves (planned = measured above).
TEST(TensorParallelPlan, FullRecomputationKeepsFewerActivations) {
  for (bool sequence : {false, true}) {
    Job kept{4, sequence, 2, 3, DType::kFloat32, 2};
    Job recomputed = kept;
    recomputed.recompute = true;
    EXPECT_LT(plan(recomputed, 3).of(Category::kActivations),
              plan(kept, 3).of(Category::kActivations))
        << (sequence ? "sequence parallel" : "tensor parallel");
  }
}

// With pipeline stages over the groups (3D): each (pipeline stage, tensor rank) planned by the
// real PipelineTrainer on the shape-only device over that rank's slices (planner/pipeline_plan.h),
// against every rank of the job trained as 2 pipeline stages x `data` x `tensor` ranks, 1F1B over
// 2 micro-batches of `sequences` rows.
constexpr int kPipelineStages = 2;
constexpr int kMicroBatches = 2;

PipelineOptions two_stage_pipeline() {
  PipelineOptions pipeline;
  pipeline.stages = kPipelineStages;
  pipeline.micro_batches = kMicroBatches;
  pipeline.schedule = ScheduleKind::kOneFOneB;
  return pipeline;
}

std::vector<PipelineStagePeak> pipeline_plan(const Job& job, int rank) {
  shape::ShapeCommunicator group(rank, job.tensor);
  TensorParallelGpt model(kConfig, TensorSlice{rank, job.tensor, &group, job.sequence});
  EngineOptions options = job.options();
  options.gradient_accumulation_steps = kMicroBatches;
  PipelinePlanInput input;
  input.model = plan_input(model, {job.sequences, kConfig.seq_len}, options,
                           make_optimizer(OptimizerOptions{})->state_count(), job.data);
  input.model.tensor_parallel_size = job.tensor;
  input.units_per_virtual_stage = two_stage_pipeline().partition(model.units().size());
  input.schedule = make_schedule(ScheduleKind::kOneFOneB, kPipelineStages, kMicroBatches, 1);
  return predict_pipeline_peaks(input);
}

std::vector<MemoryUsage> train_pipeline(const Job& job) {
  const int ranks = kPipelineStages * job.data * job.tensor;
  std::vector<MemoryUsage> usage(static_cast<std::size_t>(ranks));
  WorldOptions world_options;
  world_options.ranks = ranks;
  world_options.hold_frees = true;
  World(world_options).run([&](RankContext& world) {
    TensorParallelGroups groups =
        split_tensor_parallel_groups(world, DeviceMesh(ranks, kPipelineStages, job.tensor));
    const TensorSlice slice{groups.at.tensor_parallel_index, job.tensor, groups.tensor.get(),
                            job.sequence};
    PipelineTrainer trainer(
        *groups.data_context, job.options(), two_stage_pipeline(),
        [slice] { return std::make_unique<TensorParallelGpt>(kConfig, slice); },
        OptimizerOptions{});
    std::mt19937 rng(11 + static_cast<std::uint32_t>(groups.at.data_parallel_index));
    std::uniform_int_distribution<std::int32_t> token(0, kConfig.vocab_size - 1);
    const std::int64_t rows = job.sequences * kMicroBatches;
    std::vector<std::int32_t> inputs(static_cast<std::size_t>(rows * kConfig.seq_len));
    std::vector<std::int32_t> targets(inputs.size());
    for (auto& id : inputs) id = token(rng);
    for (auto& id : targets) id = token(rng);
    const Batch batch{Tensor{inputs.data(), {rows, kConfig.seq_len}, DType::kInt32},
                      Tensor{targets.data(), {rows, kConfig.seq_len}, DType::kInt32}};
    for (int step = 0; step < 2; ++step) {
      trainer.forward_backward(batch);
      trainer.step();
    }
    world.synchronize();
    usage[static_cast<std::size_t>(world.rank)] = world.allocator().usage();
  });
  return usage;
}

TEST(TensorParallelPlan, WithPipelineStagesEveryCategoryEqualsTheMeasuredPeak) {
  for (const Job& job : {Job{2, false, 1, 1}, Job{2, true, 2, 3}, Job{2, false, 2, 0}}) {
    SCOPED_TRACE(job.name() + ", 2 pipeline stages");
    std::vector<std::vector<PipelineStagePeak>> plans;  // per tensor rank, per pipeline stage
    for (int rank = 0; rank < job.tensor; ++rank) plans.push_back(pipeline_plan(job, rank));
    // World rank w is tensor rank w % t at pipeline stage w / (d x t) (runtime/device_mesh.h).
    const auto per_stage = static_cast<std::size_t>(job.data * job.tensor);
    testing::expect_largest_peaks_equal_plans(
        [&](std::size_t rank) -> const PeakPrediction& {
          return plans[rank % static_cast<std::size_t>(job.tensor)][rank / per_stage].peak;
        },
        [&] { return train_pipeline(job); });
  }
}

}  // namespace
}  // namespace zest
