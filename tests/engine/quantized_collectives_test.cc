// ZeRO++'s quantized collectives (engine/quantized_collectives.h) on the local backend against a
// float64 reference: qwZ's gather gives every rank the same parameters, each within half its
// block's scale of the exact shard; qgZ's reduce-scatter (hierarchical on 2 x 2, 3 x 2, 2 x 3;
// one hop on 1 x 4 and 4 x 1) is within the bound its quantization steps add up to; both count
// int8 bytes on the wire, and qgZ's cross nodes only once, as node partial sums.
#include "engine/quantized_collectives.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <random>
#include <tuple>
#include <vector>

#include "base/error.h"
#include "engine/engine.h"
#include "kernels/quantize.h"
#include "runtime/link_model.h"
#include "runtime/world.h"

namespace zest {
namespace {

constexpr std::size_t kBlock = 64;

// Rank r's values: normal, with a spread that differs per block so the scales differ.
std::vector<float> values_of(int rank, std::size_t count) {
  std::mt19937 generator(100 + rank);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(count);
  for (std::size_t i = 0; i < count; ++i) {
    values[i] = normal(generator) * static_cast<float>(1 + (i / kBlock) % 5);
  }
  return values;
}

// max|x| / 127 of x[first, first + count) cut into blocks of kBlock: the scale of each element.
std::vector<double> scales_of(const std::vector<double>& x, std::size_t first, std::size_t count) {
  std::vector<double> scales(count);
  for (std::size_t begin = 0; begin < count; begin += kBlock) {
    const std::size_t end = std::min(count, begin + kBlock);
    double largest = 0.0;
    for (std::size_t i = begin; i < end; ++i) largest = std::max(largest, std::fabs(x[first + i]));
    for (std::size_t i = begin; i < end; ++i) scales[i] = largest / 127.0;
  }
  return scales;
}

WorldOptions world_of(int nodes, int per_node) {
  WorldOptions options;
  options.ranks = nodes * per_node;
  options.ranks_per_node = per_node;
  options.link.modelled = false;
  return options;
}

TEST(QuantizedGather, EveryRankGetsTheSameParametersWithinHalfAScaleOfEachShard) {
  constexpr std::size_t kShard = 1000;  // not a multiple of the block
  constexpr int kRanks = 4;
  std::mutex mutex;
  std::vector<std::vector<float>> gathered(kRanks);
  std::vector<WireBytes> wire(kRanks);
  World(world_of(2, 2)).run([&](RankContext& context) {
    const std::vector<float> shard = values_of(context.rank, kShard);
    std::vector<float> full(kShard * kRanks, -1.0f);
    QuantizedGather gather(context.device, kShard, kRanks, kBlock);
    const WireBytes before = context.wire->snapshot();
    gather.all_gather(context.communicator, context.comm, shard.data(), full.data(), kShard,
                      DType::kFloat32);
    context.synchronize();
    std::lock_guard lock(mutex);
    gathered[context.rank] = full;
    wire[context.rank] = context.wire->snapshot() - before;
  });
  for (int rank = 1; rank < kRanks; ++rank) EXPECT_EQ(gathered[rank], gathered[0]) << rank;
  for (int owner = 0; owner < kRanks; ++owner) {
    const std::vector<float> exact = values_of(owner, kShard);
    const std::vector<double> wide(exact.begin(), exact.end());
    const std::vector<double> scale = scales_of(wide, 0, kShard);
    for (std::size_t i = 0; i < kShard; ++i) {
      const double error = std::fabs(wide[i] - gathered[0][owner * kShard + i]);
      // Half a scale, and 1e-5 of one for the fp32 products (kernels/quantize.h's test).
      ASSERT_LE(error, scale[i] * (0.5 + 1e-5)) << "rank " << owner << " element " << i;
    }
  }
  // The ring moves int8 values and the scales: (n-1)/n of n packed shards per rank, half of it
  // across the 2 nodes.
  const double packed = static_cast<double>(quantized_bytes(kShard, kBlock));
  const int kind = static_cast<int>(WireKind::kAllGather);
  for (int rank = 0; rank < kRanks; ++rank) {
    EXPECT_DOUBLE_EQ(wire[rank].intra_node[kind] + wire[rank].inter_node[kind], 3 * packed);
    EXPECT_DOUBLE_EQ(wire[rank].inter_node[kind], 1.5 * packed);
  }
}

TEST(QuantizedGather, TwoByteParametersComeBackInTheirType) {
  constexpr std::size_t kShard = 300;
  std::mutex mutex;
  std::vector<BFloat16> gathered;
  World(world_of(1, 2)).run([&](RankContext& context) {
    std::vector<BFloat16> shard;
    for (float v : values_of(context.rank, kShard)) shard.emplace_back(v);
    std::vector<BFloat16> full(2 * kShard);
    QuantizedGather gather(context.device, kShard, 2, kBlock);
    gather.all_gather(context.communicator, context.comm, shard.data(), full.data(), kShard,
                      DType::kBFloat16);
    context.synchronize();
    std::lock_guard lock(mutex);
    if (context.rank == 1) gathered = full;
  });
  for (int owner = 0; owner < 2; ++owner) {
    std::vector<double> wide;
    for (float v : values_of(owner, kShard)) wide.push_back(static_cast<float>(BFloat16(v)));
    const std::vector<double> scale = scales_of(wide, 0, kShard);
    for (std::size_t i = 0; i < kShard; ++i) {
      const double back = static_cast<float>(gathered[owner * kShard + i]);
      // Half a scale, and the bf16 rounding of the dequantized value (2^-8 relative).
      ASSERT_LE(std::fabs(wide[i] - back), scale[i] * 0.50001 + std::fabs(back) * 0x1p-8) << i;
    }
  }
}

class QuantizedReduceScatterOn : public ::testing::TestWithParam<std::tuple<int, int>> {};

// The error bound of rank r's mean, element by element, from how the sum was made: every slice
// that crossed to r inside its node carries half its block's scale; every other node's partial
// sum carries half the scale of its own blocks (whose max grows by at most the errors in it) plus
// the errors of its node's slices. Plus fp32 rounding of the sums: 1e-6 of the sum of |x|.
TEST_P(QuantizedReduceScatterOn, MeanIsWithinTheBoundOfItsQuantizationSteps) {
  const auto [nodes, per_node] = GetParam();
  const int n = nodes * per_node;
  constexpr std::size_t kShard = 700;
  std::mutex mutex;
  std::vector<std::vector<float>> results(n);
  std::vector<WireBytes> wire(n);
  std::vector<int> grouped(n);
  World(world_of(nodes, per_node)).run([&](RankContext& context) {
    const std::vector<float> full = values_of(context.rank, kShard * n);
    QuantizedReduceScatter reduce(context.device, context.communicator, context.topology, kShard,
                                  kBlock);
    std::vector<float> result(kShard);
    const WireBytes before = context.wire->snapshot();
    for (int call = 0; call < 2; ++call) {  // the second reuses the buffers
      reduce.reduce_scatter(context.comm, full.data(), DType::kFloat32, kShard, "test");
      context.device.copy(context.comm, result.data(), reduce.result(), kShard * sizeof(float));
    }
    context.synchronize();
    std::lock_guard lock(mutex);
    results[context.rank] = result;
    wire[context.rank] = context.wire->snapshot() - before;
    grouped[context.rank] = reduce.ranks_per_node();
  });
  const int g = per_node;
  const int k = nodes;
  std::vector<std::vector<double>> x(n);
  for (int r = 0; r < n; ++r) {
    const std::vector<float> v = values_of(r, kShard * n);
    x[r].assign(v.begin(), v.end());
  }
  for (int r = 0; r < n; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_EQ(grouped[r], g);
    const int a = r / g;
    const int l = r % g;
    const std::size_t first = static_cast<std::size_t>(r) * kShard;
    std::vector<double> exact(kShard, 0.0), bound(kShard, 0.0), magnitude(kShard, 0.0);
    for (int b = 0; b < k; ++b) {
      std::vector<double> partial(kShard, 0.0), carried(kShard, 0.0);
      for (int peer = 0; peer < g; ++peer) {
        const int source = b * g + peer;
        const std::vector<double> scale = scales_of(x[source], first, kShard);
        for (std::size_t i = 0; i < kShard; ++i) {
          partial[i] += x[source][first + i];
          magnitude[i] += std::fabs(x[source][first + i]);
          if (peer != l) carried[i] += scale[i] * (0.5 + 1e-5);
        }
      }
      std::vector<double> crossing(kShard, 0.0);
      if (b != a) {  // the partial was quantized again: its block max may have grown by carried
        for (std::size_t begin = 0; begin < kShard; begin += kBlock) {
          double largest = 0.0;
          for (std::size_t i = begin; i < std::min(kShard, begin + kBlock); ++i) {
            largest = std::max(largest, std::fabs(partial[i]) + carried[i]);
          }
          for (std::size_t i = begin; i < std::min(kShard, begin + kBlock); ++i) {
            crossing[i] = largest / 127.0 * (0.5 + 1e-5);
          }
        }
      }
      for (std::size_t i = 0; i < kShard; ++i) {
        exact[i] += partial[i];
        bound[i] += carried[i] + crossing[i];
      }
    }
    for (std::size_t i = 0; i < kShard; ++i) {
      const double mean = exact[i] / n;
      const double allowed = (bound[i] + 1e-6 * magnitude[i]) / n;
      ASSERT_LE(std::fabs(results[r][i] - mean), allowed) << "element " << i;
    }
    // Bytes: step 1 sends k packed slices to each of g-1 ranks of the node, step 2 one packed
    // partial to each of k-1 nodes; twice.
    const double packed = static_cast<double>(quantized_bytes(kShard, kBlock));
    const int send = static_cast<int>(WireKind::kSend);
    EXPECT_DOUBLE_EQ(wire[r].intra_node[send], 2.0 * (g - 1) * k * packed);
    EXPECT_DOUBLE_EQ(wire[r].inter_node[send], 2.0 * (k - 1) * packed);
  }
}

INSTANTIATE_TEST_SUITE_P(NodesByRanks, QuantizedReduceScatterOn,
                         ::testing::Values(std::make_tuple(1, 1), std::make_tuple(1, 4),
                                           std::make_tuple(2, 2), std::make_tuple(4, 1),
                                           std::make_tuple(3, 2), std::make_tuple(2, 3)),
                         [](const auto& info) {
                           return std::to_string(std::get<0>(info.param)) + "x" +
                                  std::to_string(std::get<1>(info.param));
                         });

TEST(QuantizedReduceScatter, ANanInOneRanksGradientReachesItsOwnersMean) {
  std::mutex mutex;
  std::vector<std::vector<float>> results(4);
  World(world_of(2, 2)).run([&](RankContext& context) {
    std::vector<float> full = values_of(context.rank, 4 * 100);
    if (context.rank == 3) full[1 * 100 + 5] = std::nanf("");  // in rank 1's slice
    QuantizedReduceScatter reduce(context.device, context.communicator, context.topology, 100,
                                  kBlock);
    reduce.reduce_scatter(context.comm, full.data(), DType::kFloat32, 100, "test");
    std::vector<float> result(100);
    context.device.copy(context.comm, result.data(), reduce.result(), sizeof(float) * 100);
    context.synchronize();
    std::lock_guard lock(mutex);
    results[context.rank] = result;
  });
  EXPECT_TRUE(std::isnan(results[1][5]));
  for (int r : {0, 2, 3}) {
    for (float v : results[r]) ASSERT_TRUE(std::isfinite(v)) << r;
  }
}

TEST(QuantizedCollectives, RefusesWhatTheyDoNotServeInOneLineNamingTheKey) {
  EngineOptions options;
  options.quantized_weights = true;
  options.stage = 2;
  try {
    check_quantized_collectives(options, false);
    FAIL() << "qwZ at stage 2 accepted";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kConfig);
    EXPECT_EQ(std::string(error.what()),
              "zero_optimization.zero_quantized_weights needs zero_optimization.stage 3 (got 2): "
              "only stage 3 gathers parameters before each use");
  }
  options = EngineOptions{};
  options.quantized_gradients = true;
  EXPECT_THROW(check_quantized_collectives(options, false), Error);  // stage 0
  options.stage = 3;
  EXPECT_NO_THROW(check_quantized_collectives(options, false));
  EXPECT_THROW(check_quantized_collectives(options, true), Error);  // hybrid
  options.quantization_block = 0;
  EXPECT_THROW(check_quantized_collectives(options, false), Error);
}

}  // namespace
}  // namespace zest
