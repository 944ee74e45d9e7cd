// The planner with qgZ (zero_optimization.zero_quantized_gradients) at 8 and 4 bits: its four
// buffers in `buckets` (quantized_reduction_bytes: two runs of every rank's packed slice, two fp32
// shards), and the allocator against the plan, every category to the byte, for a small GPT at
// stages 1-3 on 2 nodes x 2 ranks and 1 x 4: fp32 and bf16, with accumulation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/quantized_collectives.h"
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

const GptConfig kSmallGpt{2, 2, 16, 512, 8, kAutoVocabPieces};

struct Job {
  int stage = 3;
  int bits = 4;
  int nodes = 2;
  int per_node = 2;
  DType dtype = DType::kFloat32;
  int accumulation = 1;
  std::int64_t sequences = 2;

  int world() const { return nodes * per_node; }
  EngineOptions options() const {
    EngineOptions options = testing::engine_options(stage, dtype, accumulation);
    options.quantized_gradients = true;
    options.quantized_gradient_bits = bits;
    return options;
  }
  std::string name() const {
    return "stage " + std::to_string(stage) + ", int" + std::to_string(bits) + ", " +
           std::to_string(nodes) + " x " + std::to_string(per_node) + ", " + dtype_name(dtype) +
           ", accumulation " + std::to_string(accumulation);
  }
};

PeakPlanInput input_of(const Job& job) {
  return testing::gpt_plan_input(kSmallGpt, job.sequences, job.options(), job.world());
}

std::vector<MemoryUsage> train(const Job& job) {
  return testing::gpt_usage_after_two_steps(kSmallGpt, job.sequences, job.options(),
                                            testing::nodes_world(job.nodes, job.per_node),
                                            /*seed=*/5);
}

// Every category's peak on every rank equals the plan. With frees held until a wait proves them
// (WorldOptions::hold_frees) the allocator frees in the plan's order; the largest peaks of up to
// twelve runs are still taken, as in tests/planner/vocab_pieces_support.h.
void expect_measured_equals_planned(const Job& job) {
  SCOPED_TRACE(job.name());
  const PeakPrediction planned = predict_peak(input_of(job));
  testing::expect_largest_peaks_equal_plan(planned, [&] { return train(job); });
}

// The largest unit's shard over `world` ranks, as the engine sizes qgZ's buffers.
std::size_t largest_shard(const PeakPlanInput& input, int world) {
  std::size_t largest = 0;
  for (const UnitShapes& unit : input.model.units) {
    largest = std::max(largest, ShardLayout::build(unit.name, unit.params, world,
                                                   input.model.alignment)
                                    .shard_length());
  }
  return largest;
}

std::size_t total(const std::vector<std::size_t>& bytes) {
  std::size_t sum = 0;
  for (std::size_t b : bytes) sum += b;
  return sum;
}

// At 4 bits the two packed runs take half the values' bytes (the same scales): the plan's buckets
// fall by exactly that, at every stage, and nothing else moves.
TEST(QuantizedGradientsPlan, FourBitsPlanTheSmallerPackedBuffersAndNothingElse) {
  for (int stage : {1, 2, 3}) {
    Job int8{stage, 8};
    Job int4{stage, 4};
    const PeakPlanInput input = input_of(int4);
    const std::size_t shard = largest_shard(input, 4);
    ASSERT_GT(shard, 500u);
    const std::size_t eight = total(quantized_reduction_bytes(shard, 4, 256, 8));
    const std::size_t four = total(quantized_reduction_bytes(shard, 4, 256, 4));
    EXPECT_EQ(eight - four, 2 * 4 * (quantized_scales_offset(shard, 8) -
                                     quantized_scales_offset(shard, 4)));
    const PeakPrediction with_eight = predict_peak(input_of(int8));
    const PeakPrediction with_four = predict_peak(input);
    SCOPED_TRACE("stage " + std::to_string(stage));
    EXPECT_EQ(with_eight.of(Category::kBuckets) - with_four.of(Category::kBuckets), eight - four);
    for (Category category : all_categories()) {
      if (category == Category::kBuckets) continue;
      EXPECT_EQ(with_eight.of(category), with_four.of(category)) << category_name(category);
    }
    EXPECT_EQ(with_eight.device_total - with_four.device_total, eight - four);
  }
}

TEST(QuantizedGradientsPlan, Int4EveryCategoryEqualsTheMeasuredPeakToTheByte) {
  expect_measured_equals_planned(Job{3, 4});
  expect_measured_equals_planned(Job{2, 4, 2, 2, DType::kBFloat16});
  expect_measured_equals_planned(Job{1, 4, 1, 4, DType::kFloat32, 2});
  expect_measured_equals_planned(Job{3, 4, 2, 2, DType::kBFloat16, 2});
}

TEST(QuantizedGradientsPlan, Int8EveryCategoryEqualsTheMeasuredPeakToTheByte) {
  expect_measured_equals_planned(Job{3, 8});
  expect_measured_equals_planned(Job{2, 8, 2, 2, DType::kBFloat16});
}

}  // namespace
}  // namespace zest
