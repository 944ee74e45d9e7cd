// qgZ's mean across hybrid sharding's replicas (engine/quantized_replicas.h) on the local backend
// against a float64 reference: on 2 x 2, 3 x 2, 2 x 3 and 4 x 1 (shard groups of a node, one
// replica per node) every replica ends with the same shard to the bit, each element within the
// bound its two quantization steps add up to; a shard shorter than the replica count and a NaN
// are served; the bytes across nodes are the packed slices' (an all-to-all and an all-gather).
#include "engine/quantized_replicas.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <tuple>
#include <vector>

#include "kernels/quantize.h"
#include "runtime/link_model.h"
#include "tests/engine/quantized_test_support.h"

namespace zest {
namespace {

constexpr std::size_t kBlock = 64;

// Rank r's shard: normal, with a spread that differs per block so the scales differ.
std::vector<float> values_of(int rank, std::size_t count) {
  return quantized_support::block_values(300 + rank, count, kBlock, 7);
}

using Outcome = quantized_support::ReplicaMeanRun;

// Every rank's shard through two calls of the mean over its replica group at 8 bits, the shard
// groups being the nodes.
Outcome run_mean(int nodes, int per_node, std::size_t count,
                 const std::function<void(int, std::vector<float>&)>& adjust = {}) {
  return quantized_support::run_replica_mean(
      {nodes, per_node, count, kBlock, 8, [&](int rank, std::size_t length) {
         std::vector<float> input = values_of(rank, length);
         if (adjust) adjust(rank, input);
         return input;
       }});
}

class QuantizedReplicaMeanOn : public ::testing::TestWithParam<std::tuple<int, int>> {};

// The bound of each element of slice j (owned by replica j): every other replica's values crossed
// as int8, half a scale of their block each; the sum over R replicas is divided by R, then
// quantized once more, half a scale of the mean's block (whose max grows by at most the errors
// already in it). Plus fp32 rounding of the sum: 1e-6 of the sum of |x|, over R.
TEST_P(QuantizedReplicaMeanOn, EveryReplicaGetsTheSameMeanWithinTheBoundOfItsTwoSteps) {
  const auto [nodes, per_node] = GetParam();
  const int n = nodes * per_node;
  const int replicas = nodes;
  constexpr std::size_t kCount = 1001;  // not a multiple of the replicas nor of the block
  const Outcome outcome = run_mean(nodes, per_node, kCount);
  const std::size_t slice = (kCount + replicas - 1) / replicas;
  for (int r = 0; r < n; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const int shard = r % per_node;
    // Bit-identical across the replica group: their optimizer states must not drift.
    EXPECT_EQ(outcome.results[r], outcome.results[shard]);
    std::vector<std::vector<double>> x;
    for (int p = 0; p < replicas; ++p) {
      const std::vector<float> v = values_of(p * per_node + shard, kCount);
      x.emplace_back(v.begin(), v.end());
    }
    for (int owner = 0; owner < replicas; ++owner) {
      const std::size_t first = static_cast<std::size_t>(owner) * slice;
      const std::size_t length = std::min(slice, kCount - first);
      std::vector<double> exact(length, 0.0), carried(length, 0.0), magnitude(length, 0.0);
      for (int p = 0; p < replicas; ++p) {
        for (std::size_t begin = 0; begin < length; begin += kBlock) {
          const std::size_t end = std::min(length, begin + kBlock);
          double largest = 0.0;
          for (std::size_t i = begin; i < end; ++i) {
            largest = std::max(largest, std::fabs(x[p][first + i]));
          }
          for (std::size_t i = begin; i < end; ++i) {
            exact[i] += x[p][first + i] / replicas;
            magnitude[i] += std::fabs(x[p][first + i]) / replicas;
            if (p != owner) carried[i] += largest / 127.0 * (0.5 + 1e-5) / replicas;
          }
        }
      }
      for (std::size_t begin = 0; begin < length; begin += kBlock) {
        const std::size_t end = std::min(length, begin + kBlock);
        double largest = 0.0;
        for (std::size_t i = begin; i < end; ++i) {
          largest = std::max(largest, std::fabs(exact[i]) + carried[i] + 1e-6 * magnitude[i]);
        }
        for (std::size_t i = begin; i < end; ++i) {
          const double allowed = carried[i] + 1e-6 * magnitude[i] + largest / 127.0 * (0.5 + 1e-5);
          ASSERT_LE(std::fabs(outcome.results[r][first + i] - exact[i]), allowed)
              << "slice " << owner << " element " << i;
        }
      }
    }
    // Bytes: each call sends R-1 packed slices and all-gathers R packed slices over a ring whose
    // every edge crosses nodes (one replica per node): slices sent, all across.
    const double packed = static_cast<double>(quantized_bytes(slice, kBlock));
    const int send = static_cast<int>(WireKind::kSend);
    const int gather = static_cast<int>(WireKind::kAllGather);
    EXPECT_DOUBLE_EQ(outcome.wire[r].inter_node[send], 2.0 * (replicas - 1) * packed);
    EXPECT_DOUBLE_EQ(outcome.wire[r].inter_node[gather], 2.0 * (replicas - 1) * packed);
    EXPECT_DOUBLE_EQ(outcome.wire[r].intra_total(), 0.0);
  }
}

INSTANTIATE_TEST_SUITE_P(NodesByRanks, QuantizedReplicaMeanOn,
                         ::testing::Values(std::make_tuple(2, 2), std::make_tuple(3, 2),
                                           std::make_tuple(2, 3), std::make_tuple(4, 1)),
                         quantized_support::nodes_by_ranks_name);

// Three elements over four replicas: the last replica's slice is empty; every replica still
// takes part in each exchange, and the mean is within the int8 error.
TEST(QuantizedReplicaMean, AShardShorterThanTheReplicasIsServed) {
  const Outcome outcome = run_mean(4, 1, 3);
  for (int r = 1; r < 4; ++r) EXPECT_EQ(outcome.results[r], outcome.results[0]) << r;
  for (std::size_t i = 0; i < 3; ++i) {
    double exact = 0.0, largest = 0.0;
    for (int r = 0; r < 4; ++r) {
      exact += values_of(r, 3)[i] / 4.0;
      largest = std::max(largest, static_cast<double>(std::fabs(values_of(r, 3)[i])));
    }
    // One element per slice: a block of one is exact up to fp32 rounding of q·s, so 1e-5 of the
    // largest value covers both steps.
    EXPECT_NEAR(outcome.results[0][i], exact, 1e-5 * largest) << i;
  }
}

// A NaN in one replica's shard reaches every replica's mean of that block, and only that block.
TEST(QuantizedReplicaMean, ANanInOneReplicaReachesEveryReplicasMean) {
  constexpr std::size_t kCount = 256;
  const Outcome outcome = run_mean(2, 2, kCount, [](int rank, std::vector<float>& input) {
    if (rank == 3) input[200] = std::nanf("");  // shard 1, slice 1 (owned by replica 1)
  });
  for (int r : {1, 3}) {
    EXPECT_TRUE(std::isnan(outcome.results[r][200])) << r;
    for (std::size_t i = 0; i < 128; ++i) ASSERT_TRUE(std::isfinite(outcome.results[r][i])) << r;
  }
  for (int r : {0, 2}) {
    for (float v : outcome.results[r]) ASSERT_TRUE(std::isfinite(v)) << r;
  }
}

}  // namespace
}  // namespace zest
