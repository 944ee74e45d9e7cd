// The outer loop (engine/outer_loop.h, DiLoCo): two groups of two ranks train the MLP on their
// own rows; at the meeting every rank holds the Nesterov step of the groups' mean outer gradient
// from the first parameters, computed here in float64 from two plain runs of one group each;
// between meetings the groups differ and after one they agree to the bit, at every stage and in
// bf16; an overlapped meeting lands the blocking one's values (mixing 0) or its share of them;
// quantized meetings agree within the blocks' rounding; the outer state is host memory in the
// prediction and the measurement; groups that do not divide the world are one line.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "engine/outer_loop.h"
#include "tests/engine/engine_test_support.h"
#include "tests/support/capture_error.h"

namespace zest {
namespace {

using testing::make_global_batch;
using testing::rank_rows;
using Parameters = std::map<std::string, std::vector<float>>;

constexpr int kGlobalRows = 60;  // 15 rows a rank in a world of 4
constexpr int kRankRows = 15;
const std::vector<std::int64_t> kSizes = {13, 31, 17, 7};

OptimizerOptions adamw() {
  OptimizerOptions optimizer;
  optimizer.type = "AdamW";
  optimizer.lr = 3e-3f;
  optimizer.weight_decay = 0.01f;
  return optimizer;
}

struct Trained {
  std::vector<Parameters> by_rank;  // after the last step, each world rank's full parameters
  std::vector<std::vector<Parameters>> by_step;  // [step][rank], when asked
  std::vector<MemoryUsage> host;
  std::vector<MemoryPrediction> predicted;
  std::vector<std::string> units;    // in model order
  std::size_t shard_elements = 0;    // rank 0's shards of every unit
  std::size_t largest_shard = 0;
};

// Trains `ranks` ranks for `steps` steps; world rank r reads block `first_block + r` of each
// step's global batch (so two groups of a world of 4 read what two worlds of 2 read from blocks
// 0 and 2).
Trained train(int ranks, int steps, int first_block, const EngineOptions& base,
              bool every_step = false) {
  Trained result;
  result.by_rank.resize(ranks);
  result.by_step.assign(steps, std::vector<Parameters>(ranks));
  result.host.resize(ranks);
  result.predicted.resize(ranks);
  WorldOptions world_options;
  world_options.ranks = ranks;
  world_options.timeout = std::chrono::seconds(60);
  World(world_options).run([&](RankContext& context) {
    Mlp model(MlpConfig{kSizes});
    Engine engine(context, base);
    auto trainer = engine.shard(model, make_optimizer(adamw()));
    std::vector<float> inputs;
    std::vector<std::int32_t> targets;
    auto parameters = [&] {
      Parameters values;
      for (const std::string& name : trainer->parameter_names()) {
        values[name] = trainer->full_parameter(name);
      }
      return values;
    };
    for (int step = 0; step < steps; ++step) {
      make_global_batch(step, kGlobalRows, 13, 7, inputs, targets);
      trainer->forward_backward(
          rank_rows(inputs, targets, 13, first_block + context.rank, kRankRows));
      trainer->step();
      if (every_step) result.by_step[step][context.rank] = parameters();
    }
    result.by_rank[context.rank] = parameters();
    result.host[context.rank] = context.device.host_allocator().usage();
    result.predicted[context.rank] = trainer->predicted_memory();
    if (context.rank != 0) return;
    for (const ShardLayout& layout : trainer->layouts()) {
      result.units.push_back(layout.unit_name());
      result.shard_elements += layout.shard_length();
      result.largest_shard = std::max(result.largest_shard, layout.shard_length());
    }
  });
  return result;
}

EngineOptions with_outer_loop(int stage, int inner_steps) {
  EngineOptions options;
  options.stage = stage;
  options.outer_loop.groups = 2;
  options.outer_loop.inner_steps = inner_steps;
  return options;
}

// Note: the outer step is computed in fp32 by every rank and in float64 here from the two
// groups' fp32 parameters; the difference is a few fp32 roundings of values near 1 (1e-7
// relative each), amplified by nothing. 1e-6 of the value's magnitude plus 1e-7 states that.
TEST(OuterLoop, AMeetingIsTheNesterovStepOfTheGroupsMeanOuterGradient) {
  constexpr int kInner = 3;
  for (int stage : {0, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    EngineOptions plain;
    plain.stage = stage;
    const Parameters first = train(2, 0, 0, plain).by_rank[0];
    const Parameters group0 = train(2, kInner, 0, plain).by_rank[0];
    const Parameters group1 = train(2, kInner, 2, plain).by_rank[0];
    const EngineOptions options = with_outer_loop(stage, kInner);
    const Trained met = train(4, kInner, 0, options);
    const double lr = options.outer_loop.lr;
    const double mu = options.outer_loop.momentum;
    for (const auto& [name, values] : first) {
      for (std::size_t i = 0; i < values.size(); ++i) {
        const double anchor = values[i];
        const double mean = ((anchor - group0.at(name)[i]) + (anchor - group1.at(name)[i])) / 2;
        const double expected = anchor - lr * (mean + mu * mean);  // the momentum starts at 0
        const float measured = met.by_rank[0].at(name)[i];
        ASSERT_NEAR(measured, expected, 1e-6 * std::abs(expected) + 1e-7) << name << "[" << i
                                                                          << "]";
      }
    }
    EXPECT_EQ(met.by_rank[0], met.by_rank[2]);  // the groups agree to the bit
  }
}

TEST(OuterLoop, GroupsDifferBetweenMeetingsAndAgreeAfterToTheBit) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    for (int stage = 0; stage <= 3; ++stage) {
      SCOPED_TRACE("stage " + std::to_string(stage) + ", " + dtype_name(dtype));
      EngineOptions options = with_outer_loop(stage, 2);
      options.compute_dtype = dtype;
      const Trained run = train(4, 4, 0, options, true);
      for (int step = 0; step < 4; ++step) {
        const bool met = (step + 1) % 2 == 0;
        EXPECT_EQ(run.by_step[step][0] == run.by_step[step][2], met) << "step " << step + 1;
        EXPECT_EQ(run.by_step[step][0], run.by_step[step][1]);  // one group, one model
      }
    }
  }
}

// The MLP's 3 units in 2 fragments: the first two units meet at steps 2, 6, ..., the last at 4,
// 8, ... (H = 4): after each meeting the fragment that met agrees across groups, the other not.
TEST(OuterLoop, FragmentsMeetOneAtATimeAtStaggeredSteps) {
  EngineOptions options = with_outer_loop(3, 4);
  options.outer_loop.fragments = 2;
  const Trained run = train(4, 4, 0, options, true);
  ASSERT_EQ(run.units.size(), 3u);
  auto agree = [&](int step, const std::string& unit) {
    for (const auto& [name, values] : run.by_step[step - 1][0]) {
      if (name.rfind(unit + ".", 0) != 0) continue;
      if (values != run.by_step[step - 1][2].at(name)) return false;
    }
    return true;
  };
  const std::vector<std::string>& units = run.units;
  EXPECT_FALSE(agree(1, units[0]));
  EXPECT_TRUE(agree(2, units[0]) && agree(2, units[1]));
  EXPECT_FALSE(agree(2, units[2]));
  EXPECT_FALSE(agree(3, units[0]));
  EXPECT_TRUE(agree(4, units[2]));
  EXPECT_FALSE(agree(4, units[0]) || agree(4, units[1]));
}

// Streaming DiLoCo's overlap at H = 2: the meeting sent after step 2 lands after step 3. With
// mixing 0 the fragment then holds the outer step's values alone: a blocking meeting's after
// step 2, to the bit (the same mean, momentum and anchor).
TEST(OuterLoop, WithoutMixingAnOverlappedMeetingLandsTheBlockingMeetingsValues) {
  for (int stage : {0, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const Trained blocking = train(4, 2, 0, with_outer_loop(stage, 2));
    EngineOptions options = with_outer_loop(stage, 2);
    options.outer_loop.overlap_steps = 1;
    options.outer_loop.mixing = 0.0f;
    const Trained overlapped = train(4, 3, 0, options, true);
    EXPECT_NE(overlapped.by_step[1][0], overlapped.by_step[1][2]);  // in flight: not landed
    for (int rank = 0; rank < 4; ++rank) {
      EXPECT_EQ(overlapped.by_step[2][rank], blocking.by_rank[0]) << "rank " << rank;
    }
  }
}

// With mixing 1/2 each group keeps half of what it learned while the meeting was in flight:
// after step 3 its values are half its own (as if nothing had met: the meeting only read them)
// and half the outer step's.
TEST(OuterLoop, MixingKeepsItsShareOfWhatTheFragmentLearnedWhileTheMeetingWasInFlight) {
  const Trained blocking = train(4, 2, 0, with_outer_loop(3, 2));
  const Trained apart = train(4, 3, 0, with_outer_loop(3, 100));
  EngineOptions options = with_outer_loop(3, 2);
  options.outer_loop.overlap_steps = 1;
  options.outer_loop.mixing = 0.5f;
  const Trained mixed = train(4, 3, 0, options);
  for (int rank : {0, 2}) {
    for (const auto& [name, values] : mixed.by_rank[rank]) {
      const std::vector<float>& local = apart.by_rank[rank].at(name);
      const std::vector<float>& outer = blocking.by_rank[0].at(name);
      for (std::size_t i = 0; i < values.size(); ++i) {
        const float expected = 0.5f * local[i] + 0.5f * outer[i];
        ASSERT_NEAR(values[i], expected, 1e-6f * std::abs(expected) + 1e-7f)
            << "rank " << rank << ", " << name << "[" << i << "]";
      }
    }
  }
  EXPECT_NE(mixed.by_rank[0], mixed.by_rank[2]);  // each group kept its own half
}

// Quantized meetings: the groups agree to the bit after one (every group dequantizes the same
// bytes), and the parameters are the fp32 meeting's within the blocks' rounding: each value
// crosses quantized twice (to the slice's owner, then the mean back), at most half a step of
// max|block| / 127 (int8) or / 7 (int4) each, times the outer step's lr (1 + momentum) = 1.33;
// the bound is held against the largest outer step, max |parameter - first parameter| =
// 1.33 max |mean|, with a factor of 2 to spare.
TEST(OuterLoop, QuantizedMeetingsAgreeAcrossGroupsWithinTheBlocksRounding) {
  EngineOptions plain;
  plain.stage = 3;
  const Parameters first = train(2, 0, 0, plain).by_rank[0];
  const Trained exact = train(4, 2, 0, with_outer_loop(3, 2));
  for (int bits : {8, 4}) {
    SCOPED_TRACE(std::to_string(bits) + " bits");
    EngineOptions options = with_outer_loop(3, 2);
    options.outer_loop.gradient_bits = bits;
    const Trained quantized = train(4, 2, 0, options);
    EXPECT_EQ(quantized.by_rank[0], quantized.by_rank[2]);
    double largest_step = 0.0;
    double largest_error = 0.0;
    for (const auto& [name, values] : exact.by_rank[0]) {
      for (std::size_t i = 0; i < values.size(); ++i) {
        largest_step = std::max(largest_step, std::abs(double(values[i]) - first.at(name)[i]));
        largest_error =
            std::max(largest_error, std::abs(double(values[i]) - quantized.by_rank[0].at(name)[i]));
      }
    }
    const double rounding = bits == 8 ? 1.0 / 127 : 1.0 / 7;
    EXPECT_GT(largest_error, 0.0);  // quantized, not fp32
    EXPECT_LE(largest_error, 2 * rounding * largest_step) << largest_step;
  }
}

TEST(OuterLoop, TheOuterStateIsHostMemoryInThePredictionAndTheMeasurement) {
  const Trained plain = train(4, 1, 0, [] {
    EngineOptions options;
    options.stage = 1;
    return options;
  }());
  const Trained outer = train(4, 1, 0, with_outer_loop(1, 5));
  // The anchor and the momentum of this rank's shard (its group's: 2 ranks), fp32, and one
  // shard-long buffer to meet in.
  const std::size_t outer_bytes = (2 * outer.shard_elements + outer.largest_shard) * sizeof(float);
  EXPECT_EQ(outer.predicted[0].offload, plain.predicted[0].offload + outer_bytes);
  EXPECT_EQ(outer.host[0].peak_of(Category::kOffload),
            plain.host[0].peak_of(Category::kOffload) + outer_bytes);
  // Overlapped meetings keep the mean in flight in a third shard-long copy.
  EngineOptions options = with_outer_loop(1, 5);
  options.outer_loop.overlap_steps = 2;
  const Trained overlapped = train(4, 1, 0, options);
  const std::size_t pending = overlapped.shard_elements * sizeof(float);
  EXPECT_EQ(overlapped.predicted[0].offload, outer.predicted[0].offload + pending);
  EXPECT_EQ(overlapped.host[0].peak_of(Category::kOffload),
            outer.host[0].peak_of(Category::kOffload) + pending);
}

TEST(OuterLoop, GroupsThatDoNotDivideTheWorldAreOneLine) {
  EXPECT_THROW(
      {
        try {
          outer_groups(3, 4, 4);
        } catch (const Error& error) {
          EXPECT_EQ(error.kind(), ErrorKind::kConfig);
          EXPECT_NE(std::string(error.what()).find("outer_loop.groups: 3 groups do not divide"),
                    std::string::npos);
          throw;
        }
      },
      Error);
  EXPECT_EQ(outer_groups(kOuterGroupsNode, 8, 2), 4);
  EXPECT_EQ(outer_groups(kOuterGroupsNode, 8, 8), 1);
  // 4 data-parallel ranks of one tensor index of 2, on nodes of 4 ranks: 2 of them a node.
  EXPECT_EQ(outer_groups(kOuterGroupsNode, 4, 4, 2), 2);
}

}  // namespace
}  // namespace zest
