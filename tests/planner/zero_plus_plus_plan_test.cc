// The planner with ZeRO++'s options together: qwZ + hpZ (+ qgZ) at stage 3, and qgZ with hybrid
// sharding (its replicas' mean: engine/quantized_replicas.h) at 8 and 4 bits, against the
// allocator, every category to the byte (gather, secondary and buckets among them), for a small
// GPT (its embedding in vocabulary pieces) on 2 nodes x 2 ranks and 1 x 4, fp32 and bf16, with
// accumulation and recomputation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/quantized_collectives.h"
#include "engine/quantized_replicas.h"
#include "kernels/quantize.h"
#include "memory/shard_layout.h"
#include "models/gpt.h"
#include "planner/peak_plan.h"
#include "runtime/world.h"
#include "tests/planner/gpt_plan_support.h"
#include "tests/planner/measured_peaks.h"
#include "tests/support/nodes_world.h"

namespace zest {
namespace {

struct Job {
  GptConfig model;
  int nodes = 2;
  int per_node = 2;
  int stage = 3;
  bool weights = false;    // qwZ
  bool gradients = false;  // qgZ
  int bits = 8;            // qgZ's, the replicas' mean's too
  int hpz = 1;
  bool hybrid = false;     // shard groups of a node
  DType dtype = DType::kFloat32;
  int accumulation = 1;
  RecomputePolicy recompute = RecomputePolicy::kNone;
  std::int64_t sequences = 2;

  int world() const { return nodes * per_node; }
  EngineOptions options() const {
    EngineOptions options = testing::engine_options(stage, dtype, accumulation, recompute);
    options.quantized_weights = weights;
    options.quantized_gradients = gradients;
    options.quantized_gradient_bits = bits;
    options.hpz_group_size = hpz;
    options.hybrid_shard_size = hybrid ? kHybridShardNode : 0;
    return options;
  }
  std::string name() const {
    return std::to_string(nodes) + " x " + std::to_string(per_node) + ", stage " +
           std::to_string(stage) + (weights ? ", qwZ" : "") +
           (gradients ? ", qgZ int" + std::to_string(bits) : "") + ", hpz " +
           std::to_string(hpz) + (hybrid ? ", hybrid" : "") + ", " + dtype_name(dtype) +
           ", accumulation " + std::to_string(accumulation) + ", recompute " +
           std::to_string(static_cast<int>(recompute));
  }
};

PeakPrediction plan(const Job& job) {
  // Hybrid sharding: each unit is sharded over a node's ranks, and the nodes are its replicas.
  const int shard = job.hybrid ? job.per_node : job.world();
  PeakPlanInput input = testing::gpt_plan_input(job.model, job.sequences, job.options(), shard);
  input.replicas = job.world() / shard;
  return predict_peak(input);
}

std::vector<MemoryUsage> train(const Job& job) {
  return testing::gpt_usage_after_two_steps(job.model, job.sequences, job.options(),
                                            testing::nodes_world(job.nodes, job.per_node));
}

// Every category's peak on every rank equals the plan. With frees held until a wait proves them
// (WorldOptions::hold_frees) the allocator frees in the plan's order; the largest peaks of up to
// twelve runs are still taken, as in tests/planner/vocab_pieces_support.h.
void expect_measured_equals_planned(const Job& job) {
  const PeakPrediction planned = plan(job);
  testing::expect_largest_peaks_equal_plan(planned, [&] { return train(job); });
}

const GptConfig kSmallGpt{2, 2, 16, 512, 8, kAutoVocabPieces};

Job job_of(int nodes, int per_node, int stage) {
  Job job{kSmallGpt};
  job.nodes = nodes;
  job.per_node = per_node;
  job.stage = stage;
  return job;
}

TEST(ZeroPlusPlusPlan, QwzWithHpzEveryCategoryEqualsTheMeasuredPeakToTheByte) {
  std::vector<Job> jobs;
  for (int variant = 0; variant < 5; ++variant) {
    Job job = variant == 4 ? job_of(1, 4, 3) : job_of(2, 2, 3);
    job.weights = true;
    job.hpz = variant == 4 ? 4 : 2;
    job.gradients = variant >= 1;  // ZeRO++'s whole stack
    if (variant == 2) job.dtype = DType::kBFloat16, job.accumulation = 2;
    if (variant == 3) job.recompute = RecomputePolicy::kFull, job.accumulation = 2;
    jobs.push_back(job);
  }
  for (const Job& job : jobs) {
    SCOPED_TRACE(job.name());
    expect_measured_equals_planned(job);
  }
}

TEST(ZeroPlusPlusPlan, QgzWithHybridShardingEveryCategoryEqualsTheMeasuredPeakToTheByte) {
  std::vector<Job> jobs;
  for (int stage : {1, 2, 3}) {
    Job job = job_of(2, 2, stage);
    job.hybrid = true;
    job.gradients = true;
    jobs.push_back(job);
  }
  Job both = job_of(2, 2, 3);  // hybrid + qwZ + qgZ, bf16, accumulation
  both.hybrid = both.weights = both.gradients = true;
  both.dtype = DType::kBFloat16;
  both.accumulation = 2;
  jobs.push_back(both);
  Job one = job_of(4, 1, 3);  // shard groups of one rank, four replicas
  one.hybrid = one.gradients = true;
  jobs.push_back(one);
  for (const Job& job : jobs) {
    SCOPED_TRACE(job.name());
    expect_measured_equals_planned(job);
  }
}

// The replicas' buffers are what the plan adds to qgZ's over hybrid sharding alone: two packed
// runs of R slices and an fp32 slice, sized from the largest shard.
TEST(ZeroPlusPlusPlan, TheReplicasBuffersAreTheBucketsQgzAddsWithHybridSharding) {
  Job job = job_of(2, 2, 3);
  job.hybrid = true;
  job.gradients = true;
  const PeakPrediction with = plan(job);
  job.gradients = false;
  const PeakPrediction without = plan(job);
  EXPECT_GT(with.of(Category::kBuckets), without.of(Category::kBuckets));
  std::size_t replica = 0;
  for (std::size_t bytes : quantized_replica_bytes(1000, 2, 256)) replica += bytes;
  EXPECT_EQ(replica, 2 * (2 * quantized_bytes(500, 256)) + 500 * sizeof(float));
}

TEST(ZeroPlusPlusPlan, QgzAtFourBitsWithHybridShardingEveryCategoryEqualsTheMeasuredPeakToTheByte) {
  std::vector<Job> jobs;
  for (int stage : {1, 2, 3}) {
    Job job = job_of(2, 2, stage);
    job.hybrid = job.gradients = true;
    job.bits = 4;
    jobs.push_back(job);
  }
  Job both = job_of(2, 2, 3);  // hybrid + qwZ + qgZ, bf16, accumulation
  both.hybrid = both.weights = both.gradients = true;
  both.bits = 4;
  both.dtype = DType::kBFloat16;
  both.accumulation = 2;
  jobs.push_back(both);
  Job one = job_of(4, 1, 3);  // shard groups of one rank, four replicas
  one.hybrid = one.gradients = true;
  one.bits = 4;
  jobs.push_back(one);
  for (const Job& job : jobs) {
    SCOPED_TRACE(job.name());
    expect_measured_equals_planned(job);
  }
}

std::size_t total(const std::vector<std::size_t>& bytes) {
  std::size_t sum = 0;
  for (std::size_t b : bytes) sum += b;
  return sum;
}

// At 4 bits the replicas' two packed runs shrink as the shard group's do (half the values' bytes,
// the same scales): with hybrid sharding the plan's buckets fall by both, and nothing else moves.
TEST(ZeroPlusPlusPlan, FourBitsWithHybridShardingPlanTheReplicasSmallerPackedBuffersToo) {
  for (int stage : {1, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    Job job = job_of(2, 2, stage);
    job.hybrid = job.gradients = true;
    const PeakPrediction with_eight = plan(job);
    job.bits = 4;
    const PeakPrediction with_four = plan(job);
    // The engine's largest shard: a unit over its shard group, a node's 2 ranks.
    const PeakPlanInput input =
        testing::gpt_plan_input(job.model, job.sequences, job.options(), job.per_node);
    std::size_t shard = 0;
    for (const UnitShapes& unit : input.model.units) {
      shard = std::max(shard, ShardLayout::build(unit.name, unit.params, job.per_node,
                                                 input.model.alignment)
                                  .shard_length());
    }
    ASSERT_GT(shard, 500u);
    const std::size_t block = job.options().quantization_block;
    const std::size_t group = total(quantized_reduction_bytes(shard, 2, block, 8)) -
                              total(quantized_reduction_bytes(shard, 2, block, 4));
    const std::size_t replicas = total(quantized_replica_bytes(shard, 2, block, 8)) -
                                 total(quantized_replica_bytes(shard, 2, block, 4));
    // Two runs of 2 slices of ceil(shard / 2) values: half their value bytes.
    const std::size_t slice = (shard + 1) / 2;
    EXPECT_EQ(replicas, 2 * 2 * (quantized_scales_offset(slice, 8) -
                                 quantized_scales_offset(slice, 4)));
    EXPECT_EQ(with_eight.of(Category::kBuckets) - with_four.of(Category::kBuckets),
              group + replicas);
    for (Category category : all_categories()) {
      if (category == Category::kBuckets) continue;
      EXPECT_EQ(with_eight.of(category), with_four.of(category)) << category_name(category);
    }
    EXPECT_EQ(with_eight.device_total - with_four.device_total, group + replicas);
  }
}

}  // namespace
}  // namespace zest
