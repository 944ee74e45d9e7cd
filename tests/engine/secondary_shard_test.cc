// ZeRO++'s hpZ (zero_optimization.zero_hpz_partition_size, engine/secondary_shard.h): stage 3
// with a secondary shard inside each node trains to the bit as plain stage 3 on 2 nodes x 2
// ranks, 1 x 4 and 4 x 1, with accumulation, recomputation, bf16 and the optimizer offloaded; no
// gather reads a secondary shard from before a step or a load; backward's gathers put no byte
// across nodes; sizes that do not fit a node, other stages and hybrid sharding are one line naming
// the key.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <tuple>

#include "engine/secondary_shard.h"
#include "runtime/link_model.h"
#include "tests/engine/engine_test_support.h"
#include "tests/engine/second_step_wire.h"
#include "tests/support/capture_error.h"

namespace zest {
namespace {

using testing::RunResult;
using testing::RunSpec;
using testing::SecondStepWire;
using testing::run_mlp;

// Note: the secondary shards are copies of gathered bytes, so a gather from them yields the
// same parameters to the bit; every result below is compared for equality, which is tighter
// than the 1e-6 and would show any gather that read a stale shard.
void expect_identical(const RunResult& plain, const RunResult& hpz) {
  EXPECT_EQ(plain.losses, hpz.losses);
  EXPECT_EQ(plain.grad_norms, hpz.grad_norms);
  ASSERT_EQ(plain.params.size(), hpz.params.size());
  for (const auto& [name, values] : plain.params) EXPECT_EQ(values, hpz.params.at(name)) << name;
}

struct Shape {
  int nodes;
  int per_node;
  int hpz;
  int accumulation;
  RecomputePolicy recompute;
  DType dtype = DType::kFloat32;
  bool offload = false;  // offload_optimizer: the updated shards come back on the comm stream
};

RunSpec spec_for(const Shape& shape, int hpz) {
  RunSpec spec;
  spec.stage = 3;
  spec.world = shape.nodes * shape.per_node;
  spec.steps = 6;
  spec.global_batch = 48;
  spec.accumulation = shape.accumulation;
  spec.sizes = {13, 31, 17, 19, 7};
  spec.configure_world = [per_node = shape.per_node](WorldOptions& world) {
    world.ranks_per_node = per_node;
  };
  spec.compute_dtype = shape.dtype;
  spec.communication_dtype = shape.dtype;
  spec.configure_engine = [hpz, shape](EngineOptions& engine) {
    engine.hpz_group_size = hpz;
    engine.activation_checkpointing.policy = shape.recompute;
    if (shape.offload) engine.offload_optimizer.device = OffloadDevice::kCpu;
  };
  return spec;
}

class SecondaryShardParity : public ::testing::TestWithParam<Shape> {};

TEST_P(SecondaryShardParity, TrainsAsPlainStageThreeToTheBit) {
  const Shape shape = GetParam();
  const RunResult plain = run_mlp(spec_for(shape, 1));
  const RunResult hpz = run_mlp(spec_for(shape, shape.hpz));
  expect_identical(plain, hpz);
  // The secondary shard is its own category: 1/hpz of every unit, nothing else moves.
  for (int rank = 0; rank < shape.nodes * shape.per_node; ++rank) {
    EXPECT_EQ(plain.usage[rank].peak_of(Category::kSecondary), 0u);
    EXPECT_EQ(hpz.usage[rank].peak_of(Category::kParams),
              plain.usage[rank].peak_of(Category::kParams));
    if (shape.hpz > 1) {
      EXPECT_EQ(hpz.usage[rank].peak_of(Category::kSecondary) * shape.hpz,
                plain.usage[rank].peak_of(Category::kParams) * shape.nodes * shape.per_node);
    }
  }
}

std::string shape_name(const ::testing::TestParamInfo<Shape>& info) {
  const Shape& s = info.param;
  return std::to_string(s.nodes) + "Nodes" + std::to_string(s.per_node) + "Ranks_Hpz" +
         std::to_string(s.hpz) + "_Accumulation" + std::to_string(s.accumulation) +
         (s.recompute == RecomputePolicy::kFull ? "_Recompute" : "") +
         (s.dtype == DType::kBFloat16 ? "_Bf16" : "") + (s.offload ? "_Offload" : "");
}

INSTANTIATE_TEST_SUITE_P(
    NodesAccumulationRecompute, SecondaryShardParity,
    ::testing::Values(Shape{2, 2, 2, 1, RecomputePolicy::kNone},
                      Shape{2, 2, 2, 3, RecomputePolicy::kNone},
                      Shape{2, 2, 2, 2, RecomputePolicy::kFull},
                      Shape{1, 4, 4, 2, RecomputePolicy::kNone},
                      Shape{1, 4, 2, 2, RecomputePolicy::kFull},
                      Shape{4, 1, 1, 2, RecomputePolicy::kFull},
                      Shape{2, 2, 2, 2, RecomputePolicy::kNone, DType::kBFloat16},
                      Shape{2, 2, 2, 2, RecomputePolicy::kNone, DType::kFloat32, true}),
    shape_name);

// A load between steps changes the parameters outside a step: what follows must gather the
// loaded values, forward and backward. Every rank scales its shards by 1.5 after step 2 and
// state_loaded() runs; with a secondary shard kept from before the load, the backward (and the
// next micro-batches) would compute with the old parameters and the runs would part.
TEST(SecondaryShard, NoGatherReadsAShardFromBeforeALoadOrAStep) {
  auto spec = [](int hpz) {
    RunSpec run = spec_for(Shape{2, 2, hpz, 2, RecomputePolicy::kNone}, hpz);
    run.optimizer = "SGD";
    run.lr = 0.2f;  // large steps: a stale shard is far from the current one
    run.after_step = [hpz](int, int step, const StepStats&, Trainer& trainer) {
      auto& zero = dynamic_cast<ZeroTrainer&>(trainer);
      if (hpz > 1) {
        ASSERT_NE(zero.secondary_shard(), nullptr);
        EXPECT_EQ(zero.secondary_shard()->fresh_units(), 0u) << "after step " << step;
      }
      if (step != 2) return;
      for (std::size_t u = 0; u < trainer.layouts().size(); ++u) {
        for (const StateShard& shard : trainer.state_shards(u)) {
          if (shard.name != "params") continue;
          auto* values = static_cast<float*>(shard.data);
          for (std::size_t i = 0; i < shard.end - shard.begin; ++i) values[i] *= 1.5f;
        }
      }
      trainer.state_loaded();
    };
    return run;
  };
  const RunResult plain = run_mlp(spec(1));
  const RunResult hpz = run_mlp(spec(2));
  expect_identical(plain, hpz);
}

// fp16 from a loss scale of 2^24: the first steps overflow and are skipped (nothing changes, so
// the secondary shards stay fresh and the next step's gathers read them), then it trains.
TEST(SecondaryShard, SkippedStepsKeepTheShardsAndTrainAsPlainStageThree) {
  auto spec = [](int hpz) {
    RunSpec run = spec_for(Shape{2, 2, hpz, 2, RecomputePolicy::kNone}, hpz);
    run.compute_dtype = DType::kFloat16;
    run.communication_dtype = DType::kFloat16;
    run.loss_scale.enabled = true;
    run.loss_scale.initial_scale_power = 24;
    run.steps = 12;
    run.loss_scale.hysteresis = 1;
    return run;
  };
  const RunResult plain = run_mlp(spec(1));
  const RunResult hpz = run_mlp(spec(2));
  ASSERT_TRUE(hpz.stats[0].skipped);
  ASSERT_FALSE(hpz.stats.back().skipped);
  EXPECT_EQ(plain.losses, hpz.losses);
  for (const auto& [name, values] : plain.params) EXPECT_EQ(values, hpz.params.at(name)) << name;
}

// Inter-node bytes of each collective kind over the second step (rank 0's; every rank counts
// alike) of the MLP at stage 3 on 2 nodes x 2 ranks, and of one evaluate() (forward gathers only).
SecondStepWire wire_on_two_nodes(int hpz) {
  return testing::second_step_wire([hpz](EngineOptions& options) {
    options.hpz_group_size = hpz;
  });
}

TEST(SecondaryShardWire, BackwardGathersPutNoByteAcrossNodes) {
  constexpr auto kAllGather = static_cast<std::size_t>(WireKind::kAllGather);
  constexpr auto kReduceScatter = static_cast<std::size_t>(WireKind::kReduceScatter);
  const SecondStepWire plain = wire_on_two_nodes(1);
  const SecondStepWire hpz = wire_on_two_nodes(2);
  // A step's gathers across nodes are its forward's, each unit once: what a forward-only pass
  // (evaluate) gathers. Plain stage 3 crosses in backward too.
  EXPECT_GT(plain.evaluate.inter_node[kAllGather], 0.0);
  EXPECT_EQ(hpz.step.inter_node[kAllGather], plain.evaluate.inter_node[kAllGather]);
  // Plain stage 3's backward gathers again, across nodes, every unit the ring no longer holds
  // (all but the last units of forward, still in their slots).
  EXPECT_GT(plain.step.inter_node[kAllGather], 1.4 * plain.evaluate.inter_node[kAllGather]);
  // Gradients are reduced as without it; the backward's gathers moved inside the node.
  EXPECT_EQ(hpz.step.inter_node[kReduceScatter], plain.step.inter_node[kReduceScatter]);
  EXPECT_GT(hpz.step.intra_node[kAllGather], plain.step.intra_node[kAllGather]);
  EXPECT_LT(hpz.step.inter_total(), plain.step.inter_total());
}

TEST(HpzGroupSize, OffAtOneAndOneLineWhereItDoesNotFitANode) {
  EXPECT_EQ(hpz_group_size(1, 3, 4, 2), 0);
  EXPECT_EQ(hpz_group_size(1, 2, 4, 2), 0);  // off at any stage
  EXPECT_EQ(hpz_group_size(2, 3, 4, 2), 2);
  EXPECT_EQ(hpz_group_size(4, 3, 4, 4), 4);
  EXPECT_EQ(hpz_group_size(2, 3, 8, 4), 2);
  auto message = [](int asked, int stage, int world, int per_node) {
    const Error error = testing::capture_error(
        [&] { hpz_group_size(asked, stage, world, per_node); });
    EXPECT_EQ(error.kind(), ErrorKind::kConfig);
    const std::string text = error.what();
    EXPECT_EQ(text.find('\n'), std::string::npos);
    EXPECT_THAT(text, ::testing::StartsWith("zero_optimization.zero_hpz_partition_size: "));
    return text;
  };
  EXPECT_THAT(message(0, 3, 4, 2), ::testing::HasSubstr("must be 1 (off)"));
  EXPECT_THAT(message(2, 2, 4, 2), ::testing::HasSubstr("needs zero_optimization.stage 3 (got 2)"));
  EXPECT_THAT(message(4, 3, 4, 2), ::testing::HasSubstr("4 does not divide the 2 ranks of a node"));
  EXPECT_THAT(message(2, 3, 4, 1), ::testing::HasSubstr("2 does not divide the 1 ranks of a node"));
  EXPECT_THAT(message(3, 3, 4, 4), ::testing::HasSubstr("3 does not divide the 4 ranks"));
}

TEST(HpzGroupSize, RefusedWithHybridShardingAndAcrossNodesInOneLine) {
  RunSpec hybrid = spec_for(Shape{2, 2, 2, 1, RecomputePolicy::kNone}, 2);
  hybrid.configure_engine = [](EngineOptions& engine) {
    engine.hpz_group_size = 2;
    engine.hybrid_shard_size = kHybridShardNode;
  };
  const Error error = testing::capture_error([&] { run_mlp(hybrid); });
  EXPECT_EQ(error.kind(), ErrorKind::kConfig);
  EXPECT_THAT(error.what(), ::testing::HasSubstr(
                                "zero_optimization.zero_hpz_partition_size: 2 with "
                                "zero_optimization.hybrid_shard_size"));
  RunSpec four_nodes = spec_for(Shape{4, 1, 2, 1, RecomputePolicy::kNone}, 2);
  const Error across = testing::capture_error([&] { run_mlp(four_nodes); });
  EXPECT_EQ(across.kind(), ErrorKind::kConfig);
  EXPECT_THAT(across.what(), ::testing::HasSubstr("2 does not divide the 1 ranks of a node"));
}

}  // namespace
}  // namespace zest
