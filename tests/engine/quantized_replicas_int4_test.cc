// qgZ's mean across hybrid sharding's replicas at 4 bits (QuantizedReplicaMean with bits 4,
// engine/quantized_replicas.h) on the local backend against a float64 reference: on 2 x 2, 3 x 2,
// 2 x 3 and 4 x 1 every replica ends with the same shard to the bit, each element within the
// bound its two int4 steps add up to (an odd block, so blocks share bytes); both exchanges across
// nodes move exactly the int4 packed slices, a little more than half of int8's; a NaN in one
// replica still reaches every replica's mean.
#include "engine/quantized_replicas.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/quantize.h"
#include "runtime/link_model.h"
#include "tests/engine/quantized_test_support.h"

namespace zest {
namespace {

constexpr int kBits = 4;
constexpr double kLevels = 7.0;
constexpr std::size_t kBlock = 63;

// Rank r's shard: normal, with a spread that differs per block so the scales differ.
std::vector<float> values_of(int rank, std::size_t count) {
  return quantized_support::block_values(400 + rank, count, kBlock, 5);
}

class QuantizedInt4ReplicaMeanOn : public ::testing::TestWithParam<std::tuple<int, int>> {};

// The bound is quantized_support::replica_mean_bound at 7 levels (max|x| / 7 a scale).
TEST_P(QuantizedInt4ReplicaMeanOn, EveryReplicaGetsTheSameMeanWithinTheBoundOfItsTwoInt4Steps) {
  const auto [nodes, per_node] = GetParam();
  const int n = nodes * per_node;
  const int replicas = nodes;
  constexpr std::size_t kCount = 1001;  // not a multiple of the replicas nor of the block
  const quantized_support::ReplicaMeanRun run =
      quantized_support::run_replica_mean({nodes, per_node, kCount, kBlock, kBits, values_of});
  const std::size_t slice = (kCount + replicas - 1) / replicas;
  double worst = 0.0;  // the largest error as a share of its bound: the bound is not loose
  for (int r = 0; r < n; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const int shard = r % per_node;
    // Bit-identical across the replica group: their optimizer states must not drift.
    EXPECT_EQ(run.results[r], run.results[shard]);
    std::vector<std::vector<double>> x;
    for (int p = 0; p < replicas; ++p) {
      const std::vector<float> v = values_of(p * per_node + shard, kCount);
      x.emplace_back(v.begin(), v.end());
    }
    for (int owner = 0; owner < replicas; ++owner) {
      const quantized_support::MeanBound mean =
          quantized_support::replica_mean_bound(x, owner, slice, kCount, kBlock, kLevels);
      const std::size_t first = static_cast<std::size_t>(owner) * slice;
      for (std::size_t i = 0; i < mean.exact.size(); ++i) {
        const double error = std::fabs(run.results[r][first + i] - mean.exact[i]);
        ASSERT_LE(error, mean.bound[i]) << "slice " << owner << " element " << i;
        worst = std::max(worst, error / mean.bound[i]);
      }
    }
    // Bytes: each call sends R-1 packed slices and all-gathers R over a ring whose every edge
    // crosses nodes: slices each way, all across, none inside.
    const double packed = static_cast<double>(quantized_bytes(slice, kBlock, kBits));
    const int send = static_cast<int>(WireKind::kSend);
    const int gather = static_cast<int>(WireKind::kAllGather);
    EXPECT_DOUBLE_EQ(run.wire[r].inter_node[send], 2.0 * (replicas - 1) * packed);
    EXPECT_DOUBLE_EQ(run.wire[r].inter_node[gather], 2.0 * (replicas - 1) * packed);
    EXPECT_DOUBLE_EQ(run.wire[r].intra_total(), 0.0);
  }
  EXPECT_GT(worst, 0.2) << "int4 errors should reach a fair share of their bound";
}

INSTANTIATE_TEST_SUITE_P(NodesByRanks, QuantizedInt4ReplicaMeanOn,
                         ::testing::Values(std::make_tuple(2, 2), std::make_tuple(3, 2),
                                           std::make_tuple(2, 3), std::make_tuple(4, 1)),
                         quantized_support::nodes_by_ranks_name);

// The same mean at 8 and 4 bits on 2 x 2: int4 sends a little more than half of int8's bytes
// across nodes (the same scales, half the values), in the all-to-all and in the all-gather.
TEST(QuantizedInt4ReplicaMean, SendsAboutHalfOfInt8sBytesAcrossNodes) {
  std::vector<double> sent(2), gathered(2);
  for (int bits : {8, 4}) {
    const WireBytes wire =
        quantized_support::run_replica_mean({2, 2, 1024, 256, bits, values_of}).wire[0];
    sent[bits == 8 ? 0 : 1] = wire.inter_node[static_cast<int>(WireKind::kSend)];
    gathered[bits == 8 ? 0 : 1] = wire.inter_node[static_cast<int>(WireKind::kAllGather)];
    EXPECT_DOUBLE_EQ(wire.intra_total(), 0.0) << bits;
  }
  // A slice of 512 values, twice: int8 512 + 2 scales of 4 bytes, int4 256 + 8.
  EXPECT_DOUBLE_EQ(sent[0], 2 * 520.0);
  EXPECT_DOUBLE_EQ(sent[1], 2 * 264.0);
  EXPECT_DOUBLE_EQ(gathered[0], 2 * 520.0);
  EXPECT_DOUBLE_EQ(gathered[1], 2 * 264.0);
}

// A NaN in one replica's shard reaches every replica's mean of that block, and only that block,
// the exchanges being int4's.
TEST(QuantizedInt4ReplicaMean, ANanInOneReplicaReachesEveryReplicasMean) {
  constexpr std::size_t kCount = 256;  // slices of 128: blocks [0, 63), [63, 126), [126, 128)
  const auto values = [](int rank, std::size_t count) {
    std::vector<float> input = values_of(rank, count);
    if (rank == 3) input[200] = std::nanf("");  // shard 1, slice 1 (owned by replica 1)
    return input;
  };
  const quantized_support::ReplicaMeanRun run =
      quantized_support::run_replica_mean({2, 2, kCount, kBlock, kBits, values});
  // Element 200 is 72 into slice 1: its block [128 + 63, 128 + 126) is NaN throughout.
  for (int r : {1, 3}) {
    for (std::size_t i = 0; i < kCount; ++i) {
      if (i >= 191 && i < 254) {
        ASSERT_TRUE(std::isnan(run.results[r][i])) << r << " " << i;
      } else {
        ASSERT_TRUE(std::isfinite(run.results[r][i])) << r << " " << i;
      }
    }
  }
  for (int r : {0, 2}) {
    for (float v : run.results[r]) ASSERT_TRUE(std::isfinite(v)) << r;
  }
  const double packed = static_cast<double>(quantized_bytes(128, kBlock, kBits));
  ASSERT_EQ(packed, 64.0 + 3 * 4);
  for (int r = 0; r < 4; ++r) {
    EXPECT_DOUBLE_EQ(run.wire[r].inter_node[static_cast<int>(WireKind::kSend)], 2.0 * packed);
  }
}

}  // namespace
}  // namespace zest
