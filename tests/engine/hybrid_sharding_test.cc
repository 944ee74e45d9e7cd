// Hybrid sharding (zero_optimization.hybrid_shard_size, engine/hybrid_shards.h): sharded within a
// node and replicated across nodes, the MLP trains to the numbers plain ZeRO reaches at every
// stage 1-3 on 2 nodes x 2 ranks, 3 x 2, 1 x 4 and 4 x 1; parameter gathers and gradient
// reduce-scatters never leave the node, only the replicas' all-reduce does; the planner's model
// state is divided by the shard group; sizes that do not divide the world are one line.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <mutex>
#include <string>
#include <tuple>

#include "engine/hybrid_shards.h"
#include "runtime/link_model.h"
#include "tests/engine/engine_test_support.h"
#include "tests/support/capture_error.h"

namespace zest {
namespace {

using testing::RunResult;
using testing::RunSpec;
using testing::run_mlp;

// As the parity suite's: 1e-6 relative, since the runs differ only in the order fp32 sums are
// taken (a shard group's mean, then the replicas' mean, against one mean over every rank),
// about 1e-7 relative per step, which 20 steps of AdamW on this problem do not amplify past
// 1e-6. The absolute floor covers values that cross zero.
constexpr double kRelative = 1e-6;
constexpr double kAbsolute = 1e-7;

void expect_close(float expected, float actual, const std::string& what) {
  EXPECT_NEAR(expected, actual, kRelative * std::abs(expected) + kAbsolute) << what;
}

void expect_same_training(const RunResult& reference, const RunResult& run) {
  ASSERT_EQ(reference.losses.size(), run.losses.size());
  for (std::size_t step = 0; step < reference.losses.size(); ++step) {
    expect_close(reference.losses[step], run.losses[step], "loss at step " + std::to_string(step));
    expect_close(reference.grad_norms[step], run.grad_norms[step],
                 "gradient norm at step " + std::to_string(step));
  }
  ASSERT_EQ(reference.params.size(), run.params.size());
  for (const auto& [name, values] : reference.params) {
    const std::vector<float>& other = run.params.at(name);
    ASSERT_EQ(values.size(), other.size()) << name;
    for (std::size_t i = 0; i < values.size(); ++i) {
      expect_close(values[i], other[i], name + "[" + std::to_string(i) + "]");
      if (::testing::Test::HasFailure()) return;  // one mismatch says enough
    }
  }
}

RunSpec spec_on_nodes(int stage, int nodes, int per_node, bool hybrid) {
  RunSpec spec;
  spec.stage = stage;
  spec.world = nodes * per_node;
  spec.configure_world = [per_node](WorldOptions& world) { world.ranks_per_node = per_node; };
  spec.configure_engine = [hybrid](EngineOptions& engine) {
    engine.hybrid_shard_size = hybrid ? kHybridShardNode : 0;
  };
  return spec;
}

class HybridSharding
    : public ::testing::TestWithParam<std::tuple<int, std::tuple<int, int>>> {};

TEST_P(HybridSharding, TrainsAsPlainZeroDoes) {
  const int stage = std::get<0>(GetParam());
  const auto [nodes, per_node] = std::get<1>(GetParam());
  const RunResult plain = run_mlp(spec_on_nodes(stage, nodes, per_node, false));
  const RunResult hybrid = run_mlp(spec_on_nodes(stage, nodes, per_node, true));
  expect_same_training(plain, hybrid);
  // Each rank's model state is its shard group's share: the same as plain ZeRO over a world
  // of one node.
  const RunResult one_node = run_mlp(spec_on_nodes(stage, 1, per_node, false));
  EXPECT_EQ(hybrid.predicted[0].total(), one_node.predicted[0].total());
  for (Category category : {Category::kParams, Category::kGrads, Category::kOptimizer}) {
    EXPECT_EQ(hybrid.usage[0].peak_of(category), one_node.usage[0].peak_of(category))
        << static_cast<int>(category);
  }
}

std::string case_name(
    const ::testing::TestParamInfo<std::tuple<int, std::tuple<int, int>>>& info) {
  const std::tuple<int, int> shape = std::get<1>(info.param);
  return "Stage" + std::to_string(std::get<0>(info.param)) + "_" +
         std::to_string(std::get<0>(shape)) + "Nodes" + std::to_string(std::get<1>(shape)) +
         "Ranks";
}

INSTANTIATE_TEST_SUITE_P(StagesAndNodes, HybridSharding,
                         ::testing::Combine(::testing::Values(1, 2, 3),
                                            ::testing::Values(std::make_tuple(2, 2),
                                                              std::make_tuple(3, 2),
                                                              std::make_tuple(1, 4),
                                                              std::make_tuple(4, 1))),
                         case_name);

// What each rank put on the wire in two steps of the MLP at stage 3 on 2 nodes x 2 ranks.
std::vector<WireBytes> wire_of_two_steps(bool hybrid) {
  WorldOptions world_options;
  world_options.ranks = 4;
  world_options.ranks_per_node = 2;
  world_options.link.modelled = false;  // bytes only
  std::mutex mutex;
  std::vector<WireBytes> bytes(4);
  World(world_options).run([&](RankContext& context) {
    Mlp model(MlpConfig{{13, 31, 17, 7}});
    EngineOptions options;
    options.stage = 3;
    options.hybrid_shard_size = hybrid ? kHybridShardNode : 0;
    Engine engine(context, options);
    OptimizerOptions optimizer;
    optimizer.type = "AdamW";
    auto trainer = engine.shard(model, make_optimizer(optimizer));
    const WireBytes before = context.wire->snapshot();
    std::vector<float> inputs;
    std::vector<std::int32_t> targets;
    for (int step = 0; step < 2; ++step) {
      testing::make_global_batch(step, 60, 13, 7, inputs, targets);
      trainer->forward_backward(testing::rank_rows(inputs, targets, 13, context.rank, 15));
      trainer->step();
    }
    context.synchronize();
    std::lock_guard lock(mutex);
    bytes[context.rank] = context.wire->snapshot() - before;
  });
  return bytes;
}

TEST(HybridShardingWire, OnlyTheReplicasAllReduceCrossesNodes) {
  constexpr int kAllGather = static_cast<int>(WireKind::kAllGather);
  constexpr int kReduceScatter = static_cast<int>(WireKind::kReduceScatter);
  constexpr int kAllReduce = static_cast<int>(WireKind::kAllReduce);
  const std::vector<WireBytes> plain = wire_of_two_steps(false);
  const std::vector<WireBytes> hybrid = wire_of_two_steps(true);
  for (int rank = 0; rank < 4; ++rank) {
    // Plain ZeRO-3's ring over 4 ranks on 2 nodes: half of every gather and reduce crosses.
    EXPECT_GT(plain[rank].inter_node[kAllGather], 0.0) << rank;
    EXPECT_EQ(plain[rank].inter_node[kAllGather], plain[rank].intra_node[kAllGather]) << rank;
    EXPECT_EQ(plain[rank].inter_node[kReduceScatter], plain[rank].intra_node[kReduceScatter]);
    // Hybrid: gathers and reduce-scatters stay in the node; the replicas' all-reduce of each
    // rank's gradient shard (half a unit's gradients, 2 ranks: 2 · 1/2 · M/2 = M/2) crosses.
    EXPECT_EQ(hybrid[rank].inter_node[kAllGather], 0.0) << rank;
    EXPECT_EQ(hybrid[rank].inter_node[kReduceScatter], 0.0) << rank;
    EXPECT_GT(hybrid[rank].inter_node[kAllReduce], plain[rank].inter_node[kAllReduce]) << rank;
    // Every rank gathers the whole model inside its node, (2-1)/2 of it, against plain ZeRO's
    // (4-1)/4 over the world (padded less: to 2 x alignment, not 4 x).
    EXPECT_LT(hybrid[rank].intra_node[kAllGather],
              plain[rank].intra_node[kAllGather] + plain[rank].inter_node[kAllGather]);
    // Across nodes: the reduce-scatter's M/2 share of 3M/4 and the gathers' share leave; the
    // all-reduce of shards adds M/2 per step. Less in all.
    EXPECT_LT(hybrid[rank].inter_total(), plain[rank].inter_total()) << rank;
  }
}

TEST(HybridShardSize, IsOffWhereNothingWouldBeShardedAndOneLineWhenUneven) {
  EXPECT_EQ(hybrid_shard_size(0, 3, 4, 2), 0);                 // not asked
  EXPECT_EQ(hybrid_shard_size(kHybridShardNode, 3, 4, 2), 2);  // a node
  EXPECT_EQ(hybrid_shard_size(2, 0, 4, 2), 0);                 // stage 0 shards nothing
  EXPECT_EQ(hybrid_shard_size(4, 3, 4, 2), 0);                 // the whole world: plain ZeRO
  EXPECT_EQ(hybrid_shard_size(1, 1, 4, 2), 1);                 // one rank: replicas sync all
  const Error error = testing::capture_error([] { hybrid_shard_size(3, 3, 4, 2); });
  EXPECT_EQ(error.kind(), ErrorKind::kConfig);
  EXPECT_EQ(std::string(error.what()),
            "zero_optimization.hybrid_shard_size: 3 does not divide the 4 data-parallel ranks; "
            "shard groups must be equal (a divisor of 4)");
}

TEST(HybridShardSize, StageZeroTrainsAsWithoutIt) {
  const RunResult plain = run_mlp(spec_on_nodes(0, 2, 2, false));
  const RunResult asked = run_mlp(spec_on_nodes(0, 2, 2, true));
  EXPECT_EQ(plain.losses, asked.losses);
}

}  // namespace
}  // namespace zest
