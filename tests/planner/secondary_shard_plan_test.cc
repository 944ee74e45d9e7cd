// The planner with hpZ's secondary shard (zero_optimization.zero_hpz_partition_size): its own
// category, `secondary`, 1/h of every unit for the whole run, and the allocator against the plan,
// every category to the byte, for a small GPT (its embedding in vocabulary pieces) at stage 3 on
// 2 nodes x 2 ranks and 1 x 4: fp32 and bf16, accumulation, with and without recomputation.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "engine/engine.h"
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
  int hpz = 2;
  DType dtype = DType::kFloat32;
  int accumulation = 1;
  RecomputePolicy recompute = RecomputePolicy::kNone;
  std::int64_t sequences = 2;

  int world() const { return nodes * per_node; }
  EngineOptions options() const {
    EngineOptions options = testing::engine_options(3, dtype, accumulation, recompute);
    options.hpz_group_size = hpz;
    return options;
  }
};

PeakPrediction plan(const Job& job) {
  return predict_peak(
      testing::gpt_plan_input(job.model, job.sequences, job.options(), job.world()));
}

std::vector<MemoryUsage> train(const Job& job) {
  return testing::gpt_usage_after_two_steps(job.model, job.sequences, job.options(),
                                            testing::nodes_world(job.nodes, job.per_node));
}

// Every category's peak on every rank equals the plan. With frees held until a wait proves them
// (WorldOptions::hold_frees) the allocator frees in the plan's order; the largest peaks of up to
// twelve runs are still taken (tests/planner/measured_peaks.h).
void expect_measured_equals_planned(const Job& job) {
  testing::expect_largest_peaks_equal_plan(plan(job), [&] { return train(job); });
}

const GptConfig kSmallGpt{2, 2, 16, 512, 8, kAutoVocabPieces};

TEST(SecondaryShardPlan, IsOneHthOfEveryUnitInItsOwnCategory) {
  for (int hpz : {2, 4}) {
    Job job{kSmallGpt};
    job.nodes = 1;
    job.per_node = 4;
    job.hpz = hpz;
    const PeakPrediction with = plan(job);
    job.hpz = 1;
    const PeakPrediction without = plan(job);
    Gpt model(kSmallGpt);
    const PeakPlanInput input = plan_input(model, {2, kSmallGpt.seq_len}, job.options(), 2, 4);
    std::size_t expected = 0;
    for (const UnitShapes& unit : input.model.units) {
      const ShardLayout layout = ShardLayout::build(unit.name, unit.params, 4, input.model.alignment);
      expected += layout.flat_length() / static_cast<std::size_t>(hpz) * sizeof(float);
    }
    EXPECT_GT(expected, 0u);
    EXPECT_EQ(with.of(Category::kSecondary), expected) << hpz;
    EXPECT_EQ(without.of(Category::kSecondary), 0u);
    // Nothing else moves: the secondary shard lives for the whole run beside the rest.
    for (Category category : all_categories()) {
      if (category == Category::kSecondary) continue;
      EXPECT_EQ(with.of(category), without.of(category)) << category_name(category);
    }
    EXPECT_EQ(with.device_total, without.device_total + expected);
  }
}

TEST(SecondaryShardPlan, EveryCategoryEqualsTheMeasuredPeakToTheByte) {
  struct Case {
    int nodes, per_node, hpz;
    DType dtype;
    int accumulation;
    RecomputePolicy recompute;
    int pieces;
  };
  constexpr int kAuto = kAutoVocabPieces;
  for (const Case& c : {Case{2, 2, 2, DType::kFloat32, 1, RecomputePolicy::kNone, kAuto},
                        Case{2, 2, 2, DType::kBFloat16, 2, RecomputePolicy::kNone, kAuto},
                        Case{2, 2, 2, DType::kFloat32, 2, RecomputePolicy::kFull, kAuto},
                        Case{2, 2, 2, DType::kBFloat16, 1, RecomputePolicy::kFull, kAuto},
                        Case{2, 2, 2, DType::kFloat32, 1, RecomputePolicy::kSelective, kAuto},
                        Case{1, 4, 4, DType::kFloat32, 2, RecomputePolicy::kNone, kAuto},
                        Case{1, 4, 2, DType::kFloat32, 1, RecomputePolicy::kSelective, kAuto}}) {
    Job job{kSmallGpt, c.nodes, c.per_node, c.hpz, c.dtype, c.accumulation, c.recompute};
    job.model.vocab_pieces = c.pieces;
    SCOPED_TRACE(std::to_string(c.nodes) + " x " + std::to_string(c.per_node) + ", hpz " +
                 std::to_string(c.hpz) + ", " + dtype_name(c.dtype) + ", accumulation " +
                 std::to_string(c.accumulation) + ", recompute " +
                 std::to_string(static_cast<int>(c.recompute)) + ", pieces " +
                 std::to_string(c.pieces));
    expect_measured_equals_planned(job);
  }
}

}  // namespace
}  // namespace zest
